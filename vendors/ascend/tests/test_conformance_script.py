"""The hardware conformance script's logic, on the CPU against the torch_npu double."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch_npu_double import TorchNpuDouble

from sglang_fl.ops import STANDARD_OPS

SCRIPT = Path(__file__).parents[1] / "scripts" / "conformance.py"


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The script, imported from its file (it is not part of the installed package)."""
    spec = importlib.util.spec_from_file_location("sglang_fl_ascend_conformance", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_every_case_passes_with_its_errors(script: ModuleType, torch_npu: TorchNpuDouble) -> None:
    found = list(script.results(list(STANDARD_OPS), [torch.bfloat16], "cpu", repeat=0))
    assert len(found) == sum(len(c.cases) for c in STANDARD_OPS.values())
    tolerance = STANDARD_OPS["rms_norm"].tolerance(torch.bfloat16)
    for result in found:
        assert result.verdict == "passed", result.detail
        assert result.errors[0] <= tolerance.atol * 4, result
        assert result.speed is None  # timing skipped (repeat=0)


def test_an_operator_the_hardware_rejects_is_a_named_failure(
    script: ModuleType, torch_npu: TorchNpuDouble, monkeypatch: pytest.MonkeyPatch
) -> None:
    def rejects(*args: object, **kwargs: object) -> None:
        raise RuntimeError("EZ9999: head_size 16 is not supported")

    monkeypatch.setattr(torch_npu, "npu_mrope", rejects)
    found = list(script.results(["rotary_embedding"], [torch.float16], "cpu", repeat=0))
    assert {r.verdict for r in found} == {"failed"}
    assert "EZ9999: head_size 16 is not supported" in found[0].detail


def test_worst_errors(script: ModuleType) -> None:
    ours = [torch.tensor([1.0, 2.5]), torch.tensor([[0.25, -3.0]])]
    reference = [torch.tensor([1.0, 2.0]), torch.tensor([[0.5, -4.0]])]
    assert script.worst_errors(ours, reference) == pytest.approx((1.0, 0.5))


def test_unavailable_backend_exits_2_with_the_reason(
    script: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert script.main(["--op", "rms_norm"]) == 2
    assert (
        "sglang-fl-ascend is unavailable here: torch_npu import failed" in capsys.readouterr().err
    )
