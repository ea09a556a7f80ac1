"""The hardware conformance script's logic, run on the CPU against the sgl_kernel double."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from sgl_kernel_double import SglKernelDouble

from sglang_fl.ops import STANDARD_OPS

SCRIPT = Path(__file__).parents[1] / "scripts" / "conformance.py"


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The script, imported from its file (it is not part of the installed package)."""
    spec = importlib.util.spec_from_file_location("sglang_fl_cuda_conformance", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def run_on_cpu(script: ModuleType) -> list[object]:
    return script.run(
        list(STANDARD_OPS),
        [torch.float16, torch.float32],
        device="cpu",
        repeat=1,
        synchronize=lambda: None,
        baseline=False,
    )


def test_every_case_is_checked_and_measured(
    script: ModuleType, sgl_kernel: SglKernelDouble
) -> None:
    rows = run_on_cpu(script)
    expected = sum(len(c.cases) for c in STANDARD_OPS.values()) * 2
    assert len(rows) == expected
    declined = [r for r in rows if r.status == "skipped"]
    assert {(r.op, r.dtype) for r in declined} == {("rms_norm", "float32")}
    passed = [r for r in rows if r.status == "passed"]
    assert len(passed) == expected - len(declined)
    for row in passed:
        tolerance = STANDARD_OPS[row.op].tolerance(getattr(torch, row.dtype))
        assert row.max_abs <= tolerance.atol + tolerance.rtol * 10, row
        assert row.time_ratio is None  # no SGLang baseline asked for
    report = script.render(rows)
    assert "silu_and_mul      float16   passed" in report
    assert script.summary(rows).startswith(
        f"{len(passed)} passed, 0 failed, {len(declined)} skipped"
    )


def test_a_wrong_kernel_fails_with_the_case_named(
    script: ModuleType, sgl_kernel: SglKernelDouble, monkeypatch: pytest.MonkeyPatch
) -> None:
    def zeros(input: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out.zero_()

    monkeypatch.setattr(sgl_kernel, "silu_and_mul", zeros)
    rows = script.run(
        ["silu_and_mul"], [torch.bfloat16], device="cpu", repeat=1, synchronize=lambda: None
    )
    assert {r.status for r in rows} == {"failed"}
    assert "max abs error" in script.render(rows)


def test_max_errors_over_all_outputs(script: ModuleType) -> None:
    want = (torch.tensor([1.0, -2.0]), torch.tensor([0.0, 4.0]))
    got = (torch.tensor([1.5, -2.0]), torch.tensor([0.1, 3.0]))
    assert script.max_errors(got, want) == pytest.approx((1.0, 0.5))


def test_unavailable_backend_exits_2_with_the_reason(
    script: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    assert script.main(["--op", "silu_and_mul"]) == 2
    assert "sglang-fl-cuda is unavailable here: no CUDA device visible" in capsys.readouterr().err
