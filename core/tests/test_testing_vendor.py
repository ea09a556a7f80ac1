"""The shared header of vendor test suites: one plugin's registrations, runs, and records."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from sglang_fl.dispatch.registry import OpRegistry
from sglang_fl.dispatch.types import BackendImplKind, OpImpl
from sglang_fl.ops import get_contract
from sglang_fl.testing.vendor import VendorSuite, fresh_env


def register(registry: OpRegistry) -> None:
    """A chip with one kernel (silu_and_mul) and one op it says it has no kernel for."""
    registry.register_many(
        [
            OpImpl(
                op_name="silu_and_mul",
                impl_id="vendor.widget",
                kind=BackendImplKind.VENDOR,
                fn=lambda obj, x: (
                    torch.nn.functional.silu(x[..., : x.shape[-1] // 2])
                    * x[..., x.shape[-1] // 2 :]
                ),
                vendor="widget",
            )
        ]
    )
    registry.declare_no_kernel("rms_norm", "widget has no norm unit")


SUITE = VendorSuite("widget", register)


def candidate(**fields: Any) -> dict[str, Any]:
    return {
        "plugin": "widget",
        "impl_id": "vendor.widget",
        "distribution": "sglang-fl-widget",
        "outcome": "rejected",
        "available": False,
        "availability_reason": "no widget visible",
        "reason": "unavailable: no widget visible",
        **fields,
    }


def decision(op: str, chosen: str, *candidates: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"op": op, "chosen": chosen, "candidates": list(candidates), "no_kernel": [], **fields}


def test_registrations_and_the_contract_grid_of_one_plugin() -> None:
    assert SUITE.ops == {"silu_and_mul"}
    assert SUITE.implementations["silu_and_mul"].impl_id == SUITE.impl_id == "vendor.widget"
    assert SUITE.distribution == "sglang-fl-widget"
    cases = SUITE.contract_cases()
    contract = get_contract("silu_and_mul")
    assert len(cases) == len(contract.cases) * len(contract.dtypes)
    assert all(str(param.id).startswith("silu_and_mul/") for param in cases)
    assert {param.values[0] for param in cases} == {"silu_and_mul"}


def test_fresh_env_drops_every_sglang_fl_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_FL_PREFER", "reference")
    env = fresh_env(Path("/a"), Path("/b"))
    assert not [k for k in env if k.startswith("SGLANG_FL_")]
    assert env["PYTHONPATH"].split(":") == ["/a", "/b"]


def test_python_runs_in_a_fresh_interpreter_with_the_doubles_first(tmp_path: Path) -> None:
    (tmp_path / "widget_double.py").write_text("NAME = 'the widget double'\n")
    suite = VendorSuite("widget", register, doubles=tmp_path)
    found = suite.python(
        """
        import json, os, widget_double
        print(json.dumps([widget_double.NAME, os.environ.get("SGLANG_FL_STRICT")]))
        """
    )
    assert found == ["the widget double", None]


def test_a_failing_or_hanging_child_fails_the_test() -> None:
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        SUITE.python("1 / 0")
    hasty = VendorSuite("widget", register, timeout=0.5)
    with pytest.raises(Exception, match="timed out"):
        hasty.run([sys.executable, "-c", "import time; time.sleep(30)"])


def test_assert_unused_accepts_the_record_of_an_unavailable_chip() -> None:
    SUITE.assert_unused(
        {
            "silu_and_mul": decision("silu_and_mul", "reference.silu_and_mul", candidate()),
            "rms_norm": decision(
                "rms_norm",
                "reference.rms_norm",
                no_kernel=[{"plugin": "widget", "reason": "widget has no norm unit"}],
            ),
        },
        {"rms_norm": "widget has no norm unit"},
        because="no widget",
    )


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        (decision("silu_and_mul", "vendor.widget", candidate()), "silu_and_mul"),
        (decision("silu_and_mul", "reference.silu_and_mul"), "0 candidates"),
        (
            decision("silu_and_mul", "reference.silu_and_mul", candidate(outcome="chosen")),
            "silu_and_mul",
        ),
        (
            decision(
                "silu_and_mul",
                "reference.silu_and_mul",
                candidate(availability_reason="probe crashed", reason="unavailable: x"),
            ),
            "probe crashed",
        ),
    ],
)
def test_assert_unused_names_what_is_wrong(record: dict[str, Any], problem: str) -> None:
    with pytest.raises(AssertionError, match=problem):
        SUITE.assert_unused({"silu_and_mul": record}, {}, because="no widget")


def test_assert_routed_needs_every_implemented_op_on_the_chip() -> None:
    routed = candidate(outcome="chosen", available=True, availability_reason="1 widget")
    SUITE.assert_routed(
        {
            "silu_and_mul": decision("silu_and_mul", "vendor.widget", routed),
            "rms_norm": decision("rms_norm", "reference.rms_norm"),
        },
        "1 widget",
    )
    with pytest.raises(AssertionError, match="silu_and_mul"):
        SUITE.assert_routed({"rms_norm": decision("rms_norm", "reference.rms_norm")}, "1 widget")
    with pytest.raises(AssertionError, match="silu_and_mul"):
        SUITE.assert_routed(
            {"silu_and_mul": decision("silu_and_mul", "reference.silu_and_mul", routed)},
            "1 widget",
        )
