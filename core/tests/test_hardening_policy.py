"""Identity, declared availability, long chains, output escaping and settings checks (issue 12).

The same guarantees over real installed wheels and fresh interpreters are in
``tests/cross/test_hardening_policy.py``; these cover the core pieces one by one.
"""

from __future__ import annotations

import json
import logging

import pytest

from sglang_fl import RegistrationError, Unsupported, cli
from sglang_fl.config import Settings, append_target_problem, unmatched_names
from sglang_fl.dispatch.availability import AvailabilityCache
from sglang_fl.dispatch.identity import identity_problem, vendor_identity
from sglang_fl.dispatch.policy import SelectionPolicy
from sglang_fl.dispatch.registry import DIRECT_PROVENANCE, OpRegistry
from sglang_fl.dispatch.resolve import resolve
from sglang_fl.dispatch.types import BackendImplKind, OpImpl, Provenance
from sglang_fl.errors import ConfigError
from sglang_fl.runtime import Runtime

CUDA = Provenance("cuda", "sglang-fl-cuda", "0.1.0")
EVIL = Provenance("evil", "sglang-fl-evil", "6.6.6")
CORE_REFERENCE = Provenance("reference", "sglang-fl", "0.1.0")
VENDOR, FLAGOS, REFERENCE = (
    BackendImplKind.VENDOR,
    BackendImplKind.DEFAULT,
    BackendImplKind.REFERENCE,
)


def silu(obj, x):
    return ("ran", x)


def impl(impl_id: str, kind: BackendImplKind = VENDOR, vendor: str | None = None, **extra):
    return OpImpl("silu_and_mul", impl_id, kind, extra.pop("fn", silu), vendor=vendor, **extra)


def settings(**env: str) -> Settings:
    return Settings.from_environment({f"SGLANG_FL_{k.upper()}": v for k, v in env.items()})


# -- the identity rule ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("candidate", "provenance"),
    [
        (impl("vendor.cuda", vendor="cuda"), CUDA),
        (impl("vendor.cuda.fast", vendor="cuda"), CUDA),
        (impl("flagos.cuda", FLAGOS), CUDA),
        (impl("flagos.cuda.triton", FLAGOS, vendor="cuda"), CUDA),
        (impl("reference.silu_and_mul", REFERENCE), CORE_REFERENCE),
        (impl("anything", vendor="whatever"), DIRECT_PROVENANCE),
    ],
)
def test_identity_accepts_own_names(candidate, provenance) -> None:
    assert identity_problem(candidate, provenance) is None


@pytest.mark.parametrize(
    ("candidate", "expected"),
    [
        (impl("vendor.evil", vendor="cuda"), "vendor='cuda'; a plugin's vendor name is its"),
        (impl("vendor.cuda", vendor="evil"), "impl_id 'vendor.cuda' (vendor); its impl_ids must"),
        (impl("flagos.cuda", FLAGOS), "must be 'flagos.evil' or start with 'flagos.evil.'"),
        (impl("vendor.evilx", vendor="evil"), "must be 'vendor.evil' or start with"),
        (impl("flagos.evil", VENDOR, vendor="evil"), "impl_id 'flagos.evil' (vendor)"),
        (impl("evil", FLAGOS), "impl_id 'evil' (flagos)"),
        (impl("reference.silu_and_mul", REFERENCE), "'reference.evil'"),
    ],
)
def test_identity_refuses_other_names(candidate, expected) -> None:
    problem = identity_problem(candidate, EVIL)
    assert problem is not None
    assert expected in problem
    assert problem.startswith("plugin 'evil' (sglang-fl-evil) registered")


def test_reference_name_from_another_distribution_is_held_to_the_rule() -> None:
    impostor = Provenance("reference", "sglang-fl-impostor", "1.0")
    assert identity_problem(impl("reference.silu_and_mul", REFERENCE), impostor) is not None


def test_registry_refuses_a_squatter_and_keeps_nothing_of_it() -> None:
    registry = OpRegistry()

    def squatter() -> None:
        with registry.plugin_scope(EVIL):
            registry.register(impl("vendor.evil", vendor="evil"))
            registry.register(impl("vendor.cuda", vendor="evil"))

    with pytest.raises(RegistrationError, match=r"its impl_ids must be 'vendor\.evil'"):
        squatter()
    assert registry.implementations("silu_and_mul") == ()
    with registry.plugin_scope(CUDA):
        registry.register(impl("vendor.cuda", vendor="cuda"))
    assert registry.owner("vendor.cuda") == CUDA


def registered(*pairs: tuple[OpImpl, Provenance]) -> OpRegistry:
    registry = OpRegistry()
    for candidate, provenance in pairs:
        with registry.plugin_scope(provenance):
            registry.register(candidate)
    return registry


def test_vendor_identity_is_the_plugin_for_every_kind() -> None:
    registry = registered(
        (impl("flagos.evil", FLAGOS), EVIL),
        (impl("vendor.cuda", vendor="cuda"), CUDA),
        (impl("reference.silu_and_mul", REFERENCE), CORE_REFERENCE),
    )
    names = {i.impl_id: vendor_identity(i) for i in registry.implementations("silu_and_mul")}
    assert names == {"flagos.evil": "evil", "vendor.cuda": "cuda", "reference.silu_and_mul": None}
    assert vendor_identity(impl("x", vendor="acme")) == "acme"  # not registered: as declared


@pytest.mark.parametrize(
    ("env", "chosen", "refusal"),
    [
        ({"deny_vendors": "evil"}, "vendor.cuda", "plugin 'evil' is denied (environment"),
        ({"allow_vendors": "cuda"}, "vendor.cuda", "plugin 'evil' is not in the allow list"),
        ({"allow_vendors": "cuda", "deny_vendors": "cuda"}, "reference.silu_and_mul", None),
    ],
)
def test_vendor_lists_reach_vendorless_implementations(env, chosen, refusal) -> None:
    registry = registered(
        (impl("flagos.evil", FLAGOS), EVIL),
        (impl("vendor.cuda", vendor="cuda"), CUDA),
        (impl("reference.silu_and_mul", REFERENCE), CORE_REFERENCE),
    )
    resolution = resolve(
        "silu_and_mul", registry, SelectionPolicy(settings(**env)), AvailabilityCache()
    )
    assert resolution.decision.chosen.impl_id == chosen
    reasons = {c.impl.impl_id: c.reason for c in resolution.decision.candidates}
    if refusal is not None:
        assert reasons["flagos.evil"].startswith(refusal)


# -- declared availability ------------------------------------------------------------------------


def test_available_false_is_unavailable_and_true_is_available() -> None:
    cache = AvailabilityCache()
    off = cache.check(impl("vendor.x", vendor="x", available=False))
    assert (off.available, off.reason) == (False, "declared available=False when registered")
    assert cache.check(impl("vendor.x", vendor="x", available=True)).available is True

    def seed_fn(obj, x):
        return x

    seed_fn._is_available = False  # type: ignore[attr-defined]
    assert cache.check(impl("vendor.x", vendor="x", fn=seed_fn)).available is False


@pytest.mark.parametrize("declared", ["no", 0, 1, object()])
def test_available_of_another_type_is_refused(declared) -> None:
    with pytest.raises(RegistrationError, match="expected None, True, False or a no-argument"):
        OpRegistry().register(impl("vendor.x", vendor="x", available=declared))


# -- long fallback chains -------------------------------------------------------------------------


def test_fallback_chain_is_iterative(caplog) -> None:
    def declines(obj, x):
        raise Unsupported("not this one")

    registry = OpRegistry()
    length = 5000  # five times the default recursion limit
    registry.register_many(
        impl(f"flagos.chain.{n:05d}", FLAGOS, fn=declines) for n in range(length)
    )
    registry.register(impl("reference.silu_and_mul", REFERENCE))
    resolution = resolve("silu_and_mul", registry, SelectionPolicy(settings()), AvailabilityCache())
    assert len(resolution.decision.fallbacks) == length
    with caplog.at_level(logging.WARNING, logger="sglang_fl.dispatch.binder"):
        assert resolution.fn(None, 7) == ("ran", 7)
        assert resolution.fn(None, 8) == ("ran", 8)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == length  # once per declining candidate, not once per call
    assert (
        "flagos.chain.00000 declined a call (not this one); handing it to flagos.chain.00001"
        in (warnings[0])
    )


def test_an_error_after_declines_is_not_chained_to_them() -> None:
    def declines(obj, x):
        raise Unsupported("no")

    def fails(obj, x):
        raise RuntimeError("kernel crashed")

    registry = OpRegistry()
    registry.register(impl("flagos.a", FLAGOS, fn=declines, priority=300))
    registry.register(impl("flagos.b", FLAGOS, fn=fails, priority=200))
    registry.register(impl("reference.silu_and_mul", REFERENCE))
    fn = resolve("silu_and_mul", registry, SelectionPolicy(settings()), AvailabilityCache()).fn
    with pytest.raises(RuntimeError, match="kernel crashed") as info:
        fn(None, 1)
    assert info.value.__context__ is None


# -- text output ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("plain text", "plain text"),
        ("a\nb", "a\\nb"),
        ("a\r\nb\tc", "a\\r\\nb\\tc"),
        ("bad \udcff", "bad \\udcff"),
        ("sep\u2028x", "sep\\u2028x"),
        ("\x1b[31mred", "\\x1b[31mred"),
        (None, ""),
        (3, "3"),
    ],
)
def test_printable_keeps_a_value_on_one_line(value, shown) -> None:
    assert cli.printable(value) == shown


def test_table_rows_cannot_be_forged() -> None:
    table = cli.format_table([("x", "boom\nforged  row"), ("y", None)], ("name", "error"))
    assert table.splitlines()[2:] == ["x     boom\\nforged  row", "y"]


FORGING_PLUGIN = """
from sglang_fl import hookimpl
from sglang_fl.dispatch.types import Availability, BackendImplKind, OpImpl

print("forger: imported")

def silu(obj, x):
    return x

@hookimpl
def sglang_fl_register_ops(registry):
    print("forger: registering")
    registry.register(OpImpl(op_name="silu_and_mul", impl_id="vendor.forger",
                             kind=BackendImplKind.VENDOR, fn=silu, vendor="forger",
                             available=lambda: Availability(False, "gone\\nforged row \\udcff")))
"""


@pytest.mark.parametrize("argv", [("explain", "silu_and_mul"), ("ops",), ("doctor",)])
def test_text_commands_escape_plugin_text(plugin_site, capsys, argv) -> None:
    plugin_site.plugin("forger", FORGING_PLUGIN)
    cli.main([*argv])
    out, err = capsys.readouterr()
    assert "forger: imported" in err
    assert "forger: imported" not in out
    assert "forged row" not in "\n".join(line[:12] for line in out.splitlines())
    if argv[0] != "doctor":
        assert "gone\\nforged row \\udcff" in out


def test_json_commands_keep_plugin_prints_out(plugin_site, capsys) -> None:
    plugin_site.plugin("forger", FORGING_PLUGIN)
    cli.main(["ops", "--json"])
    out, err = capsys.readouterr()
    assert json.loads(out)["schema_version"] == 1
    assert "forger: registering" in err


def test_new_vendor_output_is_not_redirected(tmp_path, capsys) -> None:
    assert cli.main(["new-vendor", "my_chip", "--dir", str(tmp_path / "p")]) == 0
    out, _ = capsys.readouterr()
    assert "created sglang-fl-my-chip" in out


# -- settings -------------------------------------------------------------------------------------


def test_unmatched_names_suggest_the_close_match() -> None:
    config = settings(plugins="cdua,ascend", deny_vendors="nvidia", allow_vendors="cuda")
    warnings = unmatched_names(config, {"cuda", "ascend"})
    assert warnings == [
        "SGLANG_FL_PLUGINS (environment SGLANG_FL_PLUGINS) names 'cdua', which matches no "
        "installed plugin (did you mean 'cuda'?); installed: ascend, cuda",
        "SGLANG_FL_DENY_VENDORS (environment SGLANG_FL_DENY_VENDORS) names 'nvidia', which "
        "matches no installed plugin; installed: ascend, cuda",
    ]


def test_runtime_warns_about_unmatched_names(plugin_site, caplog) -> None:
    plugin_site.plugin("acme", FORGING_PLUGIN.replace("forger", "acme"))
    with caplog.at_level(logging.WARNING, logger="sglang_fl.runtime"):
        runtime = Runtime(settings(disable_plugins="acmee"))
    (warning,) = runtime.setting_warnings
    assert "names 'acmee', which matches no installed plugin (did you mean 'acme'?)" in warning
    assert warning in caplog.text


def test_odd_entry_point_name_is_refused_before_import(plugin_site, tmp_path) -> None:
    marker = tmp_path / "imported"
    module = plugin_site.module_name("odd")
    source = f"open({str(marker)!r}, 'w').close()\ndef register_builtins(registry):\n    pass\n"
    plugin_site.add("sglang-fl-odd", {"odd name!": module}, {module: source})
    record = Runtime(settings()).plugin("odd name!")
    assert record.status == "failed"
    assert record.error is not None
    assert "is not a valid plugin name" in record.error
    assert not marker.exists()
    assert Runtime(settings(plugins="")).plugin("odd name!").status == "disabled"


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda tmp: tmp, "is a directory"),
        (lambda tmp: tmp / "file" / "log.jsonl", "is not a directory"),
        (lambda tmp: tmp / "new" / "dirs" / "log.jsonl", None),
        (lambda tmp: tmp / "existing.jsonl", None),
    ],
)
def test_append_target_problem(tmp_path, make, expected) -> None:
    (tmp_path / "file").write_text("")
    (tmp_path / "existing.jsonl").write_text("{}\n")
    problem = append_target_problem(make(tmp_path))
    assert problem == expected if expected is None else expected in (problem or "")
    assert not (tmp_path / "new").exists()  # checking creates nothing
    assert (tmp_path / "existing.jsonl").read_text() == "{}\n"


def test_dispatch_log_problem_names_the_variable(tmp_path) -> None:
    problem = settings(dispatch_log=str(tmp_path)).dispatch_log_problem()
    assert problem is not None
    assert problem.startswith(
        f"SGLANG_FL_DISPATCH_LOG={str(tmp_path)!r} (environment SGLANG_FL_DISPATCH_LOG): "
        "is a directory"
    )
    assert settings().dispatch_log_problem() is None


def test_dispatch_report_refuses_an_unusable_log_at_start(tmp_path) -> None:
    from sglang_fl.dispatch_report import DispatchReport, ReportEvent, read_log

    with pytest.raises(ConfigError, match=r"^SGLANG_FL_DISPATCH_LOG=.*Is a directory"):
        DispatchReport(tmp_path)
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="SGLANG_FL_DISPATCH_LOG="):
        DispatchReport(blocker / "log.jsonl")
    path = tmp_path / "sub" / "log.jsonl"
    report = DispatchReport(path)
    report.emit(ReportEvent.PLUGIN, plugins=[])
    assert [r["event"] for r in read_log(path)] == ["plugin"]


def test_dispatch_report_that_breaks_later_is_logged_once_and_off(tmp_path, caplog) -> None:
    from sglang_fl.dispatch_report import DispatchReport, ReportEvent

    path = tmp_path / "log.jsonl"
    report = DispatchReport(path)
    path.unlink()
    path.mkdir()  # the file became a directory after start-up
    with caplog.at_level(logging.ERROR, logger="sglang_fl.integrations.sglang"):
        report.emit(ReportEvent.PLUGIN, plugins=[])
        report.emit(ReportEvent.PLUGIN, plugins=[])
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert errors[0].startswith(f"SGLANG_FL_DISPATCH_LOG={str(path)!r}")


def test_doctor_reports_the_dispatch_log(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SGLANG_FL_DISPATCH_LOG", str(tmp_path))
    assert cli.main(["doctor", "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert any(p.startswith("SGLANG_FL_DISPATCH_LOG=") and "is a directory" in p for p in problems)
