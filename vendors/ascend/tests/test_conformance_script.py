"""The hardware conformance script's wiring, on the CPU against the torch_npu double.

The runner itself (report, timing, exit codes) is core's ``sglang_fl.testing.hardware``, tested
in core; here: the script hands it the Ascend adapters as ``register_builtins`` registers them,
its probe, its device, synchronize and SGLang method.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch
from sglang_fl_ascend.ascend import TORCH_NPU
from sglang_fl_ascend.register_ops import register_builtins
from torch_npu_double import TorchNpuDouble

from sglang_fl.dispatch.types import Availability
from sglang_fl.ops import STANDARD_OPS
from sglang_fl.testing.checks import registered_by
from sglang_fl.testing.hardware import run_cases

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


def test_the_target_is_ascend(script: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    target = script.TARGET
    assert (target.title, target.device, target.sglang_forward) == (
        "sglang-fl-ascend",
        "npu",
        "forward_npu",
    )
    assert target.register is register_builtins
    assert target.probe == TORCH_NPU.probe
    synchronized: list[str] = []
    npu = SimpleNamespace(synchronize=lambda: synchronized.append("npu"))
    monkeypatch.setattr(torch, "npu", npu, raising=False)  # torch.npu, as torch_npu adds it
    target.synchronize()
    assert synchronized == ["npu"]


def test_every_case_passes_with_its_errors(script: ModuleType, torch_npu: TorchNpuDouble) -> None:
    found = run_cases(script.TARGET, dtypes=[torch.bfloat16], device="cpu", repeat=0)
    registered = registered_by(register_builtins)
    ops = [op for op in STANDARD_OPS if registered.implementations(op)]
    assert {"silu_and_mul", "rms_norm", "rotary_embedding", "topk", "fused_moe"} <= set(ops)
    assert len(found) == sum(len(STANDARD_OPS[op].cases) for op in ops)
    for result in found:
        if result.status == "skipped":  # see test_adapters.declined
            assert result.op in ("topk", "fused_moe"), result
            continue
        assert result.status == "passed", result.message
        tolerance = STANDARD_OPS[result.op].tolerance(torch.bfloat16)
        assert result.max_abs <= tolerance.atol * 4, result
        assert result.time_ratio is None  # timing skipped (repeat=0)


def test_the_command_line_runs_the_ascend_adapters(
    script: ModuleType,
    torch_npu: TorchNpuDouble,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    available = replace(script.TARGET, probe=lambda: Availability(True, "torch_npu double"))
    monkeypatch.setattr(script, "TARGET", available)
    assert script.main(["--device", "cpu", "--op", "rms_norm", "--dtype", "float16"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("sglang-fl-ascend: torch_npu double\n")
    cases = len(STANDARD_OPS["rms_norm"].cases)
    assert out.splitlines()[-1] == f"{cases} passed, 0 failed, 0 skipped"


def test_an_operator_the_hardware_rejects_is_a_named_failure(
    script: ModuleType,
    torch_npu: TorchNpuDouble,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def rejects(*args: object, **kwargs: object) -> None:
        raise RuntimeError("EZ9999: head_size 16 is not supported")

    monkeypatch.setattr(torch_npu, "npu_mrope", rejects)
    found = run_cases(script.TARGET, ["rotary_embedding"], [torch.float16], device="cpu", repeat=0)
    assert {r.status for r in found} == {"failed"}
    assert "EZ9999: head_size 16 is not supported" in found[0].message
    assert "impl 'vendor.ascend', case 'tokens=1," in found[0].message

    monkeypatch.setattr(script, "TARGET", replace(script.TARGET, probe=lambda: Availability(True)))
    argv = ["--device", "cpu", "--op", "rotary_embedding", "--dtype", "float16", "--repeat", "0"]
    assert script.main(argv) == 1
    assert "    vendor " in capsys.readouterr().out  # the operator's message, under its row


def test_unavailable_backend_exits_2_with_the_reason(
    script: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert script.main(["--op", "rms_norm"]) == 2
    assert (
        "sglang-fl-ascend is unavailable here: torch_npu import failed" in capsys.readouterr().err
    )
