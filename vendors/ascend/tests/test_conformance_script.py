"""The hardware conformance script's wiring, on the CPU against the torch_npu double.

The runner itself (report, timing, exit codes) is core's ``sglang_fl.testing.hardware``, tested
in core; here: the script hands it the Ascend adapters as the plugin registers them,
its probe, its device, synchronize and SGLang method.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch
from sgl_kernel_npu_double import SglKernelNpuDouble
from sglang_fl_ascend import plugin
from sglang_fl_ascend.backend import SGL_KERNEL_NPU, TORCH_NPU
from sglang_fl_ascend.impl.collectives import COLLECTIVES
from sglang_fl_ascend.impl.linear_attention import ADAPTERS as GDN
from torch_npu_double import TorchNpuDouble

from sglang_fl.dispatch.types import Availability
from sglang_fl.ops import STANDARD_OPS, OpCase, OpContract
from sglang_fl.testing import checks, hardware
from sglang_fl.testing.hardware import load_script, run_cases

SCRIPT = Path(__file__).parents[1] / "scripts" / "conformance.py"


@pytest.fixture
def script() -> ModuleType:
    """The script, imported from its file (it is not part of the installed package)."""
    return load_script(SCRIPT)


def test_the_target_is_ascend(script: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    target = script.TARGET
    assert (target.title, target.device, target.sglang_forward) == (
        "sglang-fl-ascend",
        "npu",
        "forward_npu",
    )
    assert target.register is plugin.sglang_fl_register_ops
    assert target.probe is script.probe
    synchronized: list[str] = []
    npu = SimpleNamespace(synchronize=lambda: synchronized.append("npu"))
    monkeypatch.setattr(torch, "npu", npu, raising=False)  # torch.npu, as torch_npu adds it
    target.synchronize()
    assert synchronized == ["npu"]


def test_every_case_passes_or_is_declined(
    script: ModuleType, torch_npu: TorchNpuDouble, sgl_kernel_npu: SglKernelNpuDouble
) -> None:
    found = run_cases(script.TARGET, dtypes=[torch.bfloat16], device="cpu", repeat=0)
    # The HCCL collectives: one row each, skipped (they run on several ranks at once).
    collective = [r for r in found if STANDARD_OPS[r.op].collective is not None]
    assert sorted(r.op for r in collective) == sorted(COLLECTIVES)
    assert all(r.status == "skipped" and "run_collective_checks" in r.message for r in collective)
    found = [r for r in found if r not in collective]
    registered = [
        c for op, c in STANDARD_OPS.items() if op not in plugin.NO_KERNEL and c.collective is None
    ]
    assert len(found) == sum(len(c.cases) for c in registered)
    declined = [r for r in found if r.status == "skipped"]
    # npu_mrope takes bf16 head sizes in multiples of 32 only (rotary_dim 16 is handed on), no
    # interleaved mrope sections and no float32 cache with bf16 queries; the MoE adapters
    # decline what test_adapters.declined lists; the attention adapters what
    # test_attention.declined lists (extend: BSND needs pages in multiples of 128); the GDN
    # adapters what test_linear_attention.declined lists.
    assert {r.op for r in declined} <= {
        "rotary_embedding",
        "mrotary_embedding",
        "topk",
        "fused_moe",
        "decode_attention",
        "extend_attention",
        "fused_qkvzba_split_reshape_cat",
        "fused_qkvzba_split_reshape_cat_contiguous",
        "rms_norm_gated",
        "causal_conv1d_update",
        "fused_sigmoid_gating_delta_rule_update",
        "chunk_gated_delta_rule",
    }
    assert "extend_attention" in {r.op for r in declined}
    assert {"rotary_embedding", "mrotary_embedding"} <= {r.op for r in declined}
    plain = [r for r in declined if r.op == "rotary_embedding"]
    assert all("rotary_dim=16," in r.case for r in plain)
    assert "npu_mrope needs head_size and rotary_dim in multiples of 32" in plain[0].message
    tolerance = STANDARD_OPS["rms_norm"].tolerance(torch.bfloat16)
    for result in found:
        if result.status == "skipped":
            continue
        assert result.status == "passed", result.message
        assert result.max_abs is not None
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
    calling = [r for r in found if "rotary_dim=32/64" in r.case and "tokens=0," not in r.case]
    assert calling
    assert {r.status for r in calling} == {"failed"}
    assert "EZ9999: head_size 16 is not supported" in calling[0].message
    assert "impl 'vendor.ascend', case 'tokens=1," in calling[0].message

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


def test_the_reference_is_computed_on_the_host(
    script: ModuleType, torch_npu: TorchNpuDouble, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The NPU's own aten ops may not compute the reference's math (torch_npu documents F.gelu
    ignoring ``approximate``): the script draws the reference's inputs for the host and
    computes it there, the adapter's on the device (here "cpu:0", a device the host is not)."""
    contract = STANDARD_OPS["gelu_new"]
    made_for: list[str] = []
    original = checks._make_inputs

    def make_inputs(contract: OpContract, case: OpCase, dtype: torch.dtype, device: str) -> Any:
        made_for.append(device)
        return original(contract, case, dtype, device)

    monkeypatch.setattr(checks, "_make_inputs", make_inputs)
    monkeypatch.setattr(hardware, "_make_inputs", make_inputs)
    found = run_cases(script.TARGET, ["gelu_new"], [torch.float16], device="cpu:0", repeat=0)
    assert {r.status for r in found} == {"passed"}
    # Per case: the adapter's inputs and the reference's, for the check and for the error figures.
    assert sorted(set(made_for)) == ["cpu", "cpu:0"]
    assert made_for.count("cpu") == made_for.count("cpu:0") == 2 * len(contract.cases)


@pytest.fixture
def no_sgl_kernel_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    """sgl_kernel_npu not importable, and neither probe's verdict cached, for one test."""
    monkeypatch.setitem(sys.modules, SGL_KERNEL_NPU.name, None)  # import raises ImportError
    for sdk in (TORCH_NPU, SGL_KERNEL_NPU):
        monkeypatch.setattr(sdk, "_probed", None)
    monkeypatch.setattr(SGL_KERNEL_NPU, "module", None)
    monkeypatch.setattr(SGL_KERNEL_NPU, "_error", None)


def test_the_heading_gives_sgl_kernel_npu_s_verdict(
    script: ModuleType, torch_npu: TorchNpuDouble, no_sgl_kernel_npu: None
) -> None:
    """torch_npu decides whether the script runs; the heading says why the GDN rows are
    declined on an NPU without sgl_kernel_npu."""
    found = script.probe()
    assert found
    assert found.reason.startswith("torch_npu ")
    assert "; GDN ops (sgl_kernel_npu): unavailable: sgl_kernel_npu import failed" in found.reason


def test_without_sgl_kernel_npu_the_gdn_rows_are_declined(
    script: ModuleType, torch_npu: TorchNpuDouble, no_sgl_kernel_npu: None
) -> None:
    """The script calls every adapter, past the backend's probe: without the package each GDN
    call is declined with the reason (``skipped``), none fails on the import."""
    found = run_cases(script.TARGET, sorted(GDN), [torch.bfloat16], device="cpu", repeat=0)
    assert {r.op for r in found} == set(GDN)
    assert "failed" not in {r.status for r in found}, [r.message for r in found]
    declined = [r for r in found if r.status == "skipped"]
    assert {r.op for r in declined} == set(GDN)  # every op reaches the package on some case
    unusable = [r for r in declined if "sgl_kernel_npu, not usable here" in r.message]
    assert {r.op for r in unusable} == set(GDN)
