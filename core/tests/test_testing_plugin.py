"""The conformance kit as pytest sees it: planning, the plugin's options, and real test runs.

Vendors are real distributions written by the ``plugin_site`` fixture; the pytest runs are
subprocesses (``pytester``) that discover them through ``PYTHONPATH`` like installed wheels.
"""

from __future__ import annotations

import pytest

from sglang_fl.ops import STANDARD_OPS
from sglang_fl.testing.checks import FAILED, PASSED, SKIPPED, plan

pytest_plugins = ["pytester"]

SILU_CASES = STANDARD_OPS["silu_and_mul"].cases
RMS_NORM_CASES = STANDARD_OPS["rms_norm"].cases
DTYPES = 3

# A vendor with two pure-PyTorch kernels; rms_norm declines everything but float32.
ACME = """
import torch
import torch.nn.functional as F

from sglang_fl import Unsupported, hookimpl
from sglang_fl.dispatch.types import BackendImplKind, OpImpl
from sglang_fl.ops import get_contract

SCALE = 1.0


def silu_and_mul(obj, x):
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:] * SCALE


def rms_norm(obj, x, residual=None):
    if x.dtype != torch.float32:
        raise Unsupported(f"acme: no {x.dtype} kernel")
    return get_contract("rms_norm").reference(obj, x, residual)


@hookimpl
def sglang_fl_register_ops(registry):
    for name, fn in (("silu_and_mul", silu_and_mul), ("rms_norm", rms_norm)):
        registry.register(OpImpl(name, "vendor.acme", BackendImplKind.VENDOR, fn=fn,
                                 vendor="acme", available=lambda: True))
"""

GHOST = """
from sglang_fl import Unsupported, hookimpl
from sglang_fl.dispatch.backends import Backend
from sglang_fl.dispatch.types import Availability


class GhostBackend(Backend):
    name = "ghost"

    def is_available(self):
        return Availability(False, "no ghost device visible")


def silu_and_mul(obj, x):
    raise Unsupported("ghost: not implemented")


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register_many(GhostBackend().implementations({"silu_and_mul": silu_and_mul}))
"""

BROKEN = """
from sglang_fl import hookimpl


@hookimpl
def sglang_fl_register_ops(registry):
    raise RuntimeError("cannot open device table")
"""


@pytest.fixture
def vendors(plugin_site, monkeypatch: pytest.MonkeyPatch):
    """acme (available), ghost (unavailable) and broken (fails to load), importable by children."""
    plugin_site.plugin("acme", ACME)
    plugin_site.plugin("ghost", GHOST)
    plugin_site.plugin("broken", BROKEN)
    monkeypatch.setenv("PYTHONPATH", str(plugin_site.root))
    return plugin_site


def outcomes(checks) -> dict[str, str]:
    return {check.id: check.run().status for check in checks}


# -- planning (in process) ----------------------------------------------------------------------


def test_plan_available_vendor_checks_every_case_and_dtype(vendors) -> None:
    from sglang_fl.ops import get_contract

    checks = plan(vendor="acme", op="silu_and_mul")
    contract = get_contract("silu_and_mul")
    assert len(checks) == 2 + len(contract.cases) * len(contract.dtypes)
    assert [c.id for c in checks[:3]] == [
        "acme/plugin",
        "acme/silu_and_mul/signature",
        f"acme/silu_and_mul/float32/{contract.cases[0].name}",
    ]
    assert set(outcomes(checks).values()) == {PASSED}


def test_plan_unavailable_vendor_is_one_skip_per_op_with_the_reason(vendors) -> None:
    checks = plan(vendor="ghost")
    assert [c.id for c in checks] == [
        "ghost/plugin",
        "ghost/silu_and_mul/signature",
        "ghost/silu_and_mul/unavailable",
    ]
    skipped = checks[2].run()
    assert skipped.status == SKIPPED
    assert "op 'silu_and_mul'" in skipped.message
    assert "unavailable here: no ghost device visible" in skipped.message


def test_plan_failed_plugin_fails_with_its_error(vendors) -> None:
    (check,) = plan(vendor="broken")
    assert check.id == "broken/plugin"
    outcome = check.run()
    assert outcome.status == FAILED
    assert "failed to load" in outcome.message
    assert "cannot open device table" in outcome.message


def test_plan_disabled_plugin_is_skipped(vendors, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_FL_DISABLE_PLUGINS", "acme")
    (check,) = plan(vendor="acme")
    outcome = check.run()
    assert outcome.status == SKIPPED
    assert "disabled" in outcome.message


def test_plan_unknown_vendor_fails_naming_the_installed_ones(vendors) -> None:
    (check,) = plan(vendor="acmee")
    outcome = check.run()
    assert outcome.status == FAILED
    assert "no sglang_fl.backends plugin named 'acmee' is installed" in outcome.message
    assert "acme" in outcome.message.split("installed:")[1]


def test_plan_vendor_without_the_op_fails(vendors) -> None:
    checks = plan(vendor="acme", op="rotary_embedding")
    assert [c.id for c in checks] == ["acme/plugin", "acme/rotary_embedding"]
    outcome = checks[1].run()
    assert outcome.status == FAILED
    assert "registers no implementation of op 'rotary_embedding'" in outcome.message


def test_plan_all_vendors_never_checks_the_reference(vendors) -> None:
    ids = [c.id for c in plan(op="silu_and_mul")]
    assert {"acme/plugin", "ghost/plugin", "broken/plugin"} <= set(ids)
    assert not any(i.startswith("reference/") for i in ids)


def test_plan_without_vendors_is_a_skip() -> None:
    from types import SimpleNamespace

    from sglang_fl.dispatch.registry import OpRegistry
    from sglang_fl.loader import PluginRecord, PluginStatus

    reference_only = SimpleNamespace(
        plugins=(
            PluginRecord("reference", "m", "sglang-fl", "0.1.0", PluginStatus.LOADED, builtin=True),
        ),
        registry=OpRegistry(),
    )
    (check,) = plan(runtime=reference_only)
    assert check.id == "no-vendor"
    outcome = check.run()
    assert outcome.status == SKIPPED
    assert "no vendor plugin is installed" in outcome.message


def test_plan_with_every_plugin_disabled_is_all_skips(
    vendors, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SGLANG_FL_PLUGINS", "")  # load no entry point at all
    checks = plan()
    assert "acme/plugin" in [c.id for c in checks]
    assert {c.run().status for c in checks} == {SKIPPED}


# -- the pytest plugin (subprocess runs) -----------------------------------------------------


def test_plugin_is_inert_in_unrelated_suites(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import sys

        def test_unrelated():
            assert "torch" not in sys.modules
            assert "sglang_fl.runtime" not in sys.modules
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    help_text = pytester.runpytest_subprocess("--help").stdout.str()
    assert "--sglang-fl-conformance=VENDOR[:OP]" in help_text


def test_conformance_tests_in_a_vendor_suite(vendors, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_acme="""
        from sglang_fl.testing import conformance_tests

        test_conformance = conformance_tests(vendor="acme")
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    # plugin + 2 signatures + every silu case x 3 dtypes + every rms_norm float32 case;
    # rms_norm declines its half-precision cases.
    result.assert_outcomes(
        passed=1 + 2 + len(SILU_CASES) * DTYPES + len(RMS_NORM_CASES),
        skipped=len(RMS_NORM_CASES) * 2,
    )
    result.stdout.fnmatch_lines(["*declined with Unsupported: acme: no torch.float16 kernel*"])


def test_selector_option_narrows_to_one_op(vendors, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_acme="""
        from sglang_fl.testing import conformance_tests

        test_conformance = conformance_tests(vendor="acme")
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--sglang-fl-conformance=acme:silu_and_mul", "-v"
    )
    result.assert_outcomes(passed=1 + 1 + len(SILU_CASES) * DTYPES)
    result.stdout.fnmatch_lines(["*test_conformance?acme/silu_and_mul/bfloat16/tokens=33*PASSED*"])


def test_selector_for_another_vendor_deselects(vendors, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_acme="""
        from sglang_fl.testing import conformance_tests

        test_conformance = conformance_tests(vendor="acme")
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--sglang-fl-conformance=ghost", "-rs"
    )
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*deselected by --sglang-fl-conformance=ghost*"])


def test_selector_without_conformance_tests_says_what_would_run_them(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile("def test_unrelated():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-fl-conformance=acme")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "--sglang-fl-conformance=acme: no sglang-fl conformance test was collected; run "
            "`pytest --pyargs sglang_fl.testing.suite --sglang-fl-conformance=acme`*"
        ]
    )


def test_unknown_op_in_selector_is_a_usage_error(vendors, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_acme="""
        from sglang_fl.testing import conformance_tests

        test_conformance = conformance_tests(vendor="acme")
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--sglang-fl-conformance=acme:silu"
    )
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--sglang-fl-conformance=acme:silu: unknown op 'silu'*"])


def test_failure_report_names_vendor_op_case_dtype_and_error(
    vendors, pytester: pytest.Pytester
) -> None:
    module = vendors.module_name("acme")
    pytester.makepyfile(
        test_acme=f"""
        import {module}
        from sglang_fl.testing import conformance_tests

        {module}.SCALE = 1.5  # break the kernel on purpose
        test_conformance = conformance_tests(vendor="acme", op="silu_and_mul")
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    # Every case fails but the empty batch, which has no value to get wrong.
    empty = sum(case.params["tokens"] == 0 for case in SILU_CASES)
    result.assert_outcomes(passed=2 + empty * DTYPES, failed=(len(SILU_CASES) - empty) * DTYPES)
    result.stdout.fnmatch_lines(
        [
            "*vendor 'acme' (sglang-fl-acme 1.0), op 'silu_and_mul', impl 'vendor.acme', "
            "case 'tokens=1,d=16', dtype float32, device cpu:",
            "*output: max abs error *, max rel error 0.5 (atol=1e-05, rtol=1e-05)*",
        ]
    )
    assert "Traceback" not in result.stdout.str()  # a clean message, not the kit's internals


def test_ready_made_suite_checks_installed_vendors(vendors, pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--pyargs",
        "sglang_fl.testing.suite",
        "--sglang-fl-conformance=ghost",
        "-rs",
    )
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["*unavailable here: no ghost device visible*"])
