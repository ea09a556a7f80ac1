"""The guarantees a second outside review broke (issue 26), piece by piece.

The attacks as installed plugin wheels are in tests/cross/test_hardening_review.py; these are
the parts: the registry lock, probe lookups, exact strings, kind ``reference``, verify's
records and JSON, settings, verify-report's input, non-regular log targets, doctor, the kit's
timeout and the locks renewed at fork. Every wait has a hard limit, so a hang fails the test.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from forking import needs_fork, run_in_child

from sglang_fl import graph, guard
from sglang_fl.cli import main
from sglang_fl.config import Settings, append_target_problem
from sglang_fl.dispatch.availability import AvailabilityCache
from sglang_fl.dispatch.binder import FallbackChain
from sglang_fl.dispatch.registry import OpRegistry
from sglang_fl.dispatch.types import Availability, BackendImplKind, OpImpl, Provenance
from sglang_fl.dispatch_report import DispatchReport, ReportEvent
from sglang_fl.errors import ConfigError, RegistrationError, Unsupported
from sglang_fl.hook_trace import trace_hook_calls
from sglang_fl.loader import new_plugin_manager
from sglang_fl.testing import checks
from sglang_fl.verify import Verifier
from sglang_fl.verify_report import VerifyLogError, read_verify_records, summarize

ACME = Provenance("acme", "sglang-fl-acme", "1.0")


def silu(obj, x):
    d = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :d]) * x[..., d:]


def impl(impl_id="vendor.acme", **overrides):
    fields = {"op_name": "silu_and_mul", "impl_id": impl_id, "kind": BackendImplKind.VENDOR,
              "fn": silu, "vendor": "acme", **overrides}  # fmt: skip
    return OpImpl(**fields)


def finishes(action, limit: float = 5.0) -> bool:
    """Whether ``action()`` returns within ``limit`` seconds (run in a daemon thread)."""
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    thread.join(limit)
    return not thread.is_alive()


# -- 1. plugin code outside the bounded worker or under a core lock -------------------------------


class BlockingSignature:
    """A lazy kernel proxy: ``inspect.signature`` reads ``__signature__``, which blocks."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def __call__(self, obj, x):
        return x

    @property
    def __signature__(self):
        self.release.wait(30)
        raise ValueError("no signature")


def test_a_blocking_registration_does_not_hold_the_registry_lock():
    registry = OpRegistry()
    key = registry.begin_loading()
    release, entered = threading.Event(), threading.Event()

    refused: list[str] = []

    def hook():
        try:
            with registry.plugin_scope(ACME, loader_key=key):
                entered.set()
                registry.register(impl(fn=BlockingSignature(release)))
        except RegistrationError as exc:  # no signature; and its scope was closed meanwhile
            refused.append(str(exc))

    worker = threading.Thread(target=hook, daemon=True)
    worker.start()
    assert entered.wait(5)
    time.sleep(0.2)  # the hook is inside register() now
    try:
        assert finishes(lambda: registry.abandon_scope(ACME, key), 3), "abandon_scope waited"
        assert finishes(lambda: registry.seal(key), 3)
    finally:
        release.set()
    worker.join(5)
    assert refused
    assert registry.implementations("silu_and_mul") == ()


class LazyProbe:
    """A seed-layout fn whose ``_is_available`` lookup runs plugin code."""

    def __init__(self, lookup) -> None:
        self.lookup = lookup

    def __call__(self, obj, x):
        return x

    def __getattr__(self, name):
        if name == "_is_available":
            return self.lookup()
        raise AttributeError(name)


def test_a_probe_lookup_that_blocks_is_bounded():
    cache = AvailabilityCache(timeout=0.5)
    started = time.monotonic()
    state = cache.check(impl(fn=LazyProbe(lambda: time.sleep(30))))
    assert time.monotonic() - started < 5
    assert not state.available
    assert "did not answer within 0.5 s" in state.reason


def test_a_probe_lookup_that_exits_is_a_reason_not_an_exit():
    state = AvailabilityCache(timeout=5).check(impl(fn=LazyProbe(lambda: sys.exit(3))))
    assert not state.available
    assert "SystemExit: 3" in state.reason


def test_probe_lookups_still_find_seed_probes():
    fn = LazyProbe(lambda: lambda: Availability(False, "no chip"))
    assert AvailabilityCache(timeout=5).check(impl(fn=fn)) == Availability(False, "no chip")


def test_a_probe_whose_hash_blocks_is_never_hashed():
    class Probe:
        def __hash__(self):
            time.sleep(30)
            return 1

        def __call__(self):
            return True

    cache = AvailabilityCache(timeout=5)
    assert finishes(lambda: cache.check(impl(available=Probe())), 3)


# -- 2. strings that pass isinstance(str) but lie --------------------------------------------------


class Liar(str):
    """Says it starts with anything and differs from nothing."""

    def startswith(self, *args, **kwargs):
        return True

    def __ne__(self, other):
        return False

    def __eq__(self, other):
        return True

    __hash__ = str.__hash__

    def __str__(self):
        raise RuntimeError("no text")


def test_plain_str_copies_subclasses_without_calling_them():
    text = guard.plain_str(Liar("vendor.cuda"))
    assert type(text) is str
    assert text == "vendor.cuda"
    assert guard.plain_str(3) is None
    described = guard.describe_exception(ValueError(Liar("x")))
    assert described == "ValueError: <str() of the exception raised RuntimeError>"


def scoped_register(registry: OpRegistry, provenance: Provenance, *impls: OpImpl) -> None:
    key = registry.begin_loading()
    try:
        with registry.plugin_scope(provenance, loader_key=key):
            for one in impls:
                registry.register(one)
    finally:
        registry.seal(key)


def test_a_str_subclass_cannot_take_another_plugins_namespace():
    impostor = Provenance("impostor", "sglang-fl-impostor", "1.0")
    with pytest.raises(RegistrationError, match=r"must be 'vendor\.impostor'"):
        scoped_register(OpRegistry(), impostor, impl(Liar("vendor.cuda"), vendor="impostor"))
    with pytest.raises(RegistrationError, match="vendor name is its entry-point name"):
        scoped_register(OpRegistry(), impostor, impl("vendor.impostor", vendor=Liar("cuda")))


def test_kept_registrations_hold_exact_strings():
    registry = OpRegistry()
    sub = type("Sub", (str,), {})
    registry.register(impl(sub("vendor.acme"), vendor=sub("acme")))
    (kept,) = registry.implementations("silu_and_mul")
    assert type(kept.impl_id) is str
    assert type(kept.vendor) is str


def test_a_reason_whose_str_raises_becomes_plain_text():
    class Reason(str):
        def __str__(self):
            raise RuntimeError("no text")

        def __format__(self, spec):
            raise RuntimeError("no format")

    state = AvailabilityCache(timeout=5).check(
        impl(available=lambda: Availability(True, Reason("fine")))
    )
    assert type(state.reason) is str
    assert f"{state.reason}" == "fine"


# -- 3. kind reference is core's ------------------------------------------------------------------


def test_only_core_registers_kind_reference():
    shadow = Provenance("shadow", "sglang-fl-shadow", "1.0")
    reference = impl("reference.shadow.silu_and_mul", kind=BackendImplKind.REFERENCE, vendor=None)
    with pytest.raises(RegistrationError, match=r"kind=BackendImplKind\.REFERENCE"):
        scoped_register(OpRegistry(), shadow, reference)
    core = Provenance("reference", "sglang-fl", "0.1.0")
    own = impl("reference.silu_and_mul", kind=BackendImplKind.REFERENCE, vendor=None)
    scoped_register(OpRegistry(), core, own)


# -- 4./5. verify names who produced the output; its JSON stays JSON ------------------------------


def declines(obj, x):
    raise Unsupported("not this shape")


def nan_silu(obj, x):
    return torch.full_like(silu(obj, x), math.nan)


def test_verify_records_the_implementation_that_ran():
    records = []
    decliner = impl("vendor.acme.decliner", fn=declines, provenance=ACME)
    fallback = impl("vendor.acme.fallback", provenance=ACME)
    verifier = Verifier(3, None, records.append)
    chain = FallbackChain("silu_and_mul", (decliner, fallback))
    fn = verifier.wrap(chain.fn, decliner, "Layer", chain=chain)
    for _ in range(3):
        fn(None, torch.randn(4, 8))
    assert [r["impl_id"] for r in records] == ["vendor.acme.fallback"] * 3
    assert {r["verdict"] for r in records} == {"pass"}


def strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_errors_are_portable_json(tmp_path):
    log = tmp_path / "dispatch.jsonl"
    report = DispatchReport(log)
    verifier = Verifier(2, None, lambda record: report.emit(ReportEvent.VERIFY, **record))
    fn = verifier.wrap(nan_silu, impl(fn=nan_silu, provenance=ACME), "Layer")
    fn(None, torch.randn(4, 8))
    (line,) = log.read_text().splitlines()
    record = strict_json(line)
    assert record["max_abs_error"] == "Infinity"
    assert record["verdict"] == "fail"
    (read,) = read_verify_records(log)
    assert read["max_abs_error"] == math.inf
    summary = summarize([read], str(log))
    assert summary["rows"][0]["max_abs_error"] == math.inf


def test_verify_report_json_is_portable(tmp_path, capsys):
    log = tmp_path / "dispatch.jsonl"
    report = DispatchReport(log)
    verifier = Verifier(1, None, lambda record: report.emit(ReportEvent.VERIFY, **record))
    verifier.wrap(nan_silu, impl(fn=nan_silu, provenance=ACME), "Layer")(None, torch.randn(2, 4))
    assert main(["verify-report", str(log), "--json"]) == 1
    payload = strict_json(capsys.readouterr().out)
    assert payload["rows"][0]["max_abs_error"] == "Infinity"


# -- 6. settings: one rule per setting, ASCII digits, no tracebacks -------------------------------


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SGLANG_FL_VERIFY", "²"),
        ("SGLANG_FL_VERIFY", "9" * 5000),
        ("SGLANG_FL_VERIFY", "٣"),
        ("SGLANG_FL_PLUGIN_TIMEOUT", "٣"),
        ("SGLANG_FL_PLUGIN_TIMEOUT", "9" * 5000),
        ("SGLANG_FL_CONFIG", "~nosuchuser_sglang_fl/x.toml"),
        ("SGLANG_FL_DISPATCH_LOG", "~nosuchuser_sglang_fl/log.jsonl"),
        ("SGLANG_FL_TRACE", "~nosuchuser_sglang_fl/trace.log"),
    ],
    ids=lambda v: v[:20],
)
def test_bad_settings_are_config_errors(variable, value):
    with pytest.raises(ConfigError, match=variable):
        Settings.from_environment({variable: value})


def toml_settings(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "sglang-fl.toml"
    path.write_text(text)
    return Settings.from_environment({"SGLANG_FL_CONFIG": str(path)})


def test_a_deeply_nested_config_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="nested too deeply"):
        toml_settings(tmp_path, "x = " + "[" * 3000 + "]" * 3000 + "\n")


@pytest.mark.parametrize(("toml", "env"), [("1", "1"), ("0", "0"), ("true", "true")])
def test_booleans_read_the_same_from_a_file_and_a_variable(tmp_path, toml, env):
    from_file = toml_settings(tmp_path, f"strict = {toml}\n").strict
    assert from_file == Settings.from_environment({"SGLANG_FL_STRICT": env}).strict


def test_toml_name_lists_hold_strings_only(tmp_path):
    with pytest.raises(ConfigError, match="is not a string"):
        toml_settings(tmp_path, "plugins = [1, 2]\n")
    with pytest.raises(ConfigError, match="is not a string"):
        toml_settings(tmp_path, "verify_ops = [1]\n")
    assert toml_settings(tmp_path, 'plugins = ["a", "b"]\n').plugins == ("a", "b")


def test_ascii_numbers_still_parse():
    settings = Settings.from_environment(
        {"SGLANG_FL_VERIFY": "12", "SGLANG_FL_PLUGIN_TIMEOUT": "2.5"}
    )
    assert (settings.verify, settings.plugin_timeout) == (12, 2.5)


# -- 7. verify-report trusts nothing it reads -----------------------------------------------------

GOOD = {"event": "verify", "op": "silu_and_mul", "impl_id": "vendor.acme", "layer": "L",
        "instance": 0, "call": 1, "verdict": "pass", "max_abs_error": 0.0,
        "max_rel_error": 0.0, "atol": 1e-5, "rtol": 1e-5, "pid": 1}  # fmt: skip


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[" * 100_000, "nested too deeply"),
        (json.dumps({**GOOD, "verdict": "FAIL"}), "'verdict'"),
        (json.dumps({**GOOD, "verdict": None}), "'verdict'"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "op"}), "'op'"),
        (json.dumps({**GOOD, "instance": "zero"}), "'instance'"),
        (json.dumps({**GOOD, "max_abs_error": "big"}), "'max_abs_error'"),
        ("[1, 2]", "not a record"),
    ],
    ids=["deep", "FAIL", "null", "missing", "type", "number", "list"],
)
def test_verify_report_refuses_malformed_logs_naming_the_line(tmp_path, capsys, line, message):
    log = tmp_path / "dispatch.jsonl"
    log.write_text(json.dumps(GOOD) + "\n" + line + "\n")
    with pytest.raises(VerifyLogError, match=message) as caught:
        read_verify_records(log)
    assert f"{log}:2" in str(caught.value)
    assert main(["verify-report", str(log)]) == 2


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
def test_verify_report_refuses_fifos_and_devices(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        outcome: list[BaseException] = []

        def read(path=path, outcome=outcome):
            try:
                read_verify_records(path)
            except BaseException as exc:
                outcome.append(exc)

        assert finishes(read, 5), f"reading {path} blocked"
        assert isinstance(outcome[0], VerifyLogError)
        assert "not a regular file" in str(outcome[0])


# -- 8. log and trace targets are regular files ---------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
def test_fifo_targets_are_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    problems: list[object] = []
    assert finishes(lambda: problems.append(append_target_problem(fifo)), 5)
    assert "not a regular file (a FIFO)" in str(problems[0])

    def report():
        with pytest.raises(ConfigError, match="not a regular file"):
            DispatchReport(fifo)

    assert finishes(report, 5)

    def trace():
        with pytest.raises(ConfigError, match="not a regular file"):
            trace_hook_calls(new_plugin_manager(Settings()), fifo)

    assert finishes(trace, 5)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
def test_a_fifo_with_a_reader_is_refused_too(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(ConfigError, match="not a regular file"):
            DispatchReport(fifo)
    finally:
        os.close(reader)


# -- 9. doctor lists what the settings warn about -------------------------------------------------


def test_doctor_lists_unknown_variables(monkeypatch, capsys):
    monkeypatch.setenv("SGLANG_FL_PREFR", "vendor")
    monkeypatch.setenv("SGLANG_FL_PLUGINS", "")
    assert main(["doctor", "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert any("SGLANG_FL_PREFR" in p and "SGLANG_FL_PREFER" in p for p in problems)


def test_doctor_lists_an_empty_allow_list(monkeypatch, capsys):
    monkeypatch.setenv("SGLANG_FL_ALLOW_VENDORS", "")
    monkeypatch.setenv("SGLANG_FL_PLUGINS", "")
    assert main(["doctor", "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert any("SGLANG_FL_ALLOW_VENDORS is empty" in p for p in problems)


# -- 10. the kit waits for a probe as long as the runtime does ------------------------------------


def test_the_kit_honours_the_plugin_timeout(monkeypatch):
    monkeypatch.setenv("SGLANG_FL_PLUGIN_TIMEOUT", "0.5")
    monkeypatch.setattr(checks, "_AVAILABILITY", None)
    started = time.monotonic()
    state = checks.probe(impl(available=lambda: time.sleep(30)))
    assert time.monotonic() - started < 5
    assert "did not answer within 0.5 s" in state.reason


# -- 11. fork: the verifier's and the custom-op module's locks are renewed ------------------------


def held_at_fork(lock_of) -> int:
    """Fork while another thread holds ``lock_of()``; the child must take it at once."""
    taken, release = threading.Event(), threading.Event()

    def holder():
        with lock_of():
            taken.set()
            release.wait(30)

    thread = threading.Thread(target=holder, daemon=True)
    thread.start()
    assert taken.wait(5)
    try:
        return run_in_child(lambda: 0 if lock_of().acquire(timeout=5) else 1)
    finally:
        release.set()
        thread.join(5)


@needs_fork
def test_the_verifiers_lock_is_renewed_in_a_child():
    verifier = Verifier(1, None, lambda record: None)
    assert held_at_fork(lambda: verifier._lock) == 0


@needs_fork
def test_the_custom_op_modules_lock_is_renewed_in_a_child():
    assert held_at_fork(lambda: graph._lock) == 0


# -- 2. (platform answers) a class path is an exact str -------------------------------------------


def test_platform_answers_are_exact_strings(monkeypatch):
    from sglang_fl.runtime import Runtime

    class Path(str):
        def strip(self, *args):
            raise RuntimeError("strip is plugin code")

    class Namespace:  # hashable, as pluggy needs its plugins to be
        def __init__(self, **hooks):
            self.__dict__.update(hooks)

    from sglang_fl.hookspecs import hookimpl

    @hookimpl
    def sglang_fl_platform():
        return Path("my.platform.Class")

    plugin = Namespace(sglang_fl_platform=sglang_fl_platform)
    monkeypatch.setenv("SGLANG_FL_PLUGINS", "")
    runtime = Runtime(Settings.from_environment())
    runtime.plugin_manager.register(plugin, name="odd")
    (answer,) = [a for a in runtime.platform_answers() if a.plugin == "odd"]
    assert answer.problem is None
    assert type(answer.path) is str
    assert answer.path == "my.platform.Class"
