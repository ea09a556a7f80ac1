"""The hardware conformance script's wiring, run on the CPU against the sgl_kernel double.

The runner itself (report, timing, exit codes) is core's ``sglang_fl.testing.hardware``, tested
in core; here: the script hands it the CUDA adapters as the plugin registers them, its probe,
its device, synchronize and SGLang method.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest
import torch
from causal_conv_double import SglKernelMambaDouble
from flash_attn_double import FlashAttnDouble
from sgl_kernel_double import SglangTritonMoeDouble, SglKernelDouble
from sglang_fl_cuda.backend import FLASH_ATTN, SGL_KERNEL, SGL_KERNEL_MAMBA, SGLANG_TRITON
from sglang_fl_cuda.impl.collectives import SERVED
from sglang_fl_cuda.plugin import NO_KERNEL
from sglang_triton_double import SglangTritonGdnDouble

from sglang_fl.dispatch.types import Availability
from sglang_fl.ops import STANDARD_OPS
from sglang_fl.testing.hardware import load_script, render, run_cases, summary

SCRIPT = Path(__file__).parents[1] / "scripts" / "conformance.py"


@pytest.fixture
def script() -> ModuleType:
    """The script, imported from its file (it is not part of the installed package)."""
    return load_script(SCRIPT)


def test_the_target_is_cuda(script: ModuleType) -> None:
    target = script.TARGET
    assert (target.title, target.device, target.sglang_forward) == (
        "sglang-fl-cuda",
        "cuda",
        "forward_cuda",
    )
    assert target.synchronize is torch.cuda.synchronize
    assert target.device_name is torch.cuda.get_device_name
    assert target.probe == script.probe


def test_the_heading_gives_every_probe(
    script: ModuleType,
    sgl_kernel: SglKernelDouble,
    flash_attn: FlashAttnDouble,
    sgl_kernel_mamba: SglKernelMambaDouble,
    triton_gdn: SglangTritonGdnDouble,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On an emulated B200: sgl_kernel serves, FlashAttention-3 does not, and the heading says
    why the attention rows are declined."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for sdk in (SGL_KERNEL, FLASH_ATTN, SGL_KERNEL_MAMBA, SGLANG_TRITON):
        monkeypatch.setattr(sdk, "count_devices", torch.cuda.device_count)
        monkeypatch.setattr(sdk, "_probed", None)
    flash_attn.capability = (10, 0)
    found = script.probe()
    assert found.available
    assert found.reason.startswith("sgl_kernel 0.0.0+double imported; 1 CUDA device; ")
    assert (
        "FlashAttention-3 (decode/extend_attention): unavailable: sgl_kernel's FlashAttention-3 "
        "runs on sm80/86/89/90 with CUDA >= 12.3 (sgl_kernel/flash_attn.py is_fa3_supported), "
        "not on cuda:0 (sm100)"
    ) in found.reason
    assert "causal convs: sgl_kernel.mamba 0.0.0+double imported; 1 CUDA device" in found.reason
    assert "GDN: sglang_fl_cuda.sglang_triton 0.0.0+double imported" in found.reason
    assert "collectives: " in found.reason


def test_unavailable_sgl_kernel_decides(script: ModuleType) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    assert script.probe() == SGL_KERNEL.probe()


def narrow_gates(op: str, dtypes: tuple[torch.dtype, ...]) -> int:
    """Cases of ``op`` whose half row is not whole 16-byte vectors: declined by the adapter."""
    cases = STANDARD_OPS[op].cases
    return sum(1 for c in cases for d in dtypes if c.params["d"] * d.itemsize % 16)


def test_every_case_is_checked_and_measured(
    script: ModuleType,
    sgl_kernel: SglKernelDouble,
    sglang_triton_moe: SglangTritonMoeDouble,
    flash_attn: FlashAttnDouble,
    triton_gdn: SglangTritonGdnDouble,
    sgl_kernel_mamba: SglKernelMambaDouble,
) -> None:
    # As on a real GPU under this script: no SGLang worker, so no SGLang runtime context.
    sglang_triton_moe.published = False
    rows = run_cases(script.TARGET, dtypes=[torch.float16, torch.float32], device="cpu", repeat=0)
    # The NCCL collectives: one row each, skipped (they run on several ranks at once).
    collective = [r for r in rows if STANDARD_OPS[r.op].collective is not None]
    assert sorted(r.op for r in collective) == sorted(SERVED)
    assert all(r.status == "skipped" and "run_collective_checks" in r.message for r in collective)
    rows = [r for r in rows if r not in collective]
    registered = [
        c for op, c in STANDARD_OPS.items() if op not in NO_KERNEL and c.collective is None
    ]
    expected = sum(len(c.cases) for c in registered) * 2
    assert len(rows) == expected  # every registered op, every case run
    declined = [r for r in rows if r.status == "skipped"]
    # FlashInfer's norms have no float32 kernel (the fused plain-residual one does); no grouped
    # or biased routing in sgl_kernel 0.4.x; SGLang's Triton fused MoE multiplies float32 in TF32
    # and runs only inside an SGLang worker; act-and-mul half rows must be whole 16-byte vectors;
    # FlashAttention-3 has no float32 kernel and no 96/64 key/value head sizes; SGLang's chunked
    # GDN kernel asserts its inputs are not float32; its gated norm has no groups and normalises
    # before the gate.
    assert {(r.op, r.dtype) for r in declined} == {
        ("decode_attention", "float16"),
        ("decode_attention", "float32"),
        ("extend_attention", "float16"),
        ("extend_attention", "float32"),
        ("chunk_gated_delta_rule", "float32"),
        ("rms_norm_gated", "float16"),
        ("rms_norm_gated", "float32"),
        ("rms_norm", "float32"),
        ("gemma_rms_norm", "float32"),
        ("topk", "float16"),
        ("topk", "float32"),
        ("fused_moe", "float16"),
        ("fused_moe", "float32"),
        ("silu_and_mul", "float16"),
        ("silu_and_mul", "float32"),
        ("gelu_and_mul", "float16"),
        ("gelu_and_mul", "float32"),
    }
    outside = [r for r in declined if r.op == "fused_moe" and r.dtype == "float16"]
    assert all("only inside an SGLang worker" in r.message for r in outside)
    passed = [r for r in rows if r.status == "passed"]
    assert len(passed) == expected - len(declined)
    for row in passed:
        tolerance = STANDARD_OPS[row.op].tolerance(getattr(torch, row.dtype))
        assert row.max_abs <= tolerance.atol + tolerance.rtol * 10, row
        assert row.time_ratio is None  # no timing asked for
    assert "silu_and_mul      float16   passed" in render(rows)
    assert summary(rows, "forward_cuda").startswith(
        f"{len(passed)} passed, 0 failed, {len(declined)} skipped"
    )


def test_the_command_line_runs_the_cuda_adapters(
    script: ModuleType,
    sgl_kernel: SglKernelDouble,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    available = replace(
        script.TARGET, probe=lambda: Availability(True, "sgl_kernel double"), device_name=None
    )
    monkeypatch.setattr(script, "TARGET", available)
    assert script.main(["--device", "cpu", "--op", "silu_and_mul", "--no-baseline"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("sglang-fl-cuda: sgl_kernel double\n")
    cases = len(STANDARD_OPS["silu_and_mul"].cases)
    narrow = narrow_gates("silu_and_mul", (torch.float32, torch.float16, torch.bfloat16))
    assert narrow == 12  # d = 2, 6 in float32; d = 2, 4, 6, 12, 20 in float16 and bfloat16
    assert out.splitlines()[-1] == f"{cases * 3 - narrow} passed, 0 failed, {narrow} skipped"


def test_a_wrong_kernel_fails_with_the_case_named(
    script: ModuleType,
    sgl_kernel: SglKernelDouble,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def zeros(input: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out.zero_()

    monkeypatch.setattr(sgl_kernel, "silu_and_mul", zeros)
    rows = run_cases(script.TARGET, ["silu_and_mul"], [torch.bfloat16], device="cpu", repeat=1)
    # Every case fails but the empty batch, which launches nothing and has nothing to get wrong,
    # and the narrow gates the adapter declines before any launch.
    assert {(r.status, r.case.startswith("tokens=0,")) for r in rows} == {
        ("failed", False),
        ("passed", True),
        ("skipped", False),
    }
    first = STANDARD_OPS["silu_and_mul"].cases[0].name
    assert f"impl 'vendor.cuda', case '{first}', dtype bfloat16" in rows[0].message
    assert "max abs error" in render(rows)


def test_unavailable_backend_exits_2_with_the_reason(
    script: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    assert script.main(["--op", "silu_and_mul"]) == 2
    assert "sglang-fl-cuda is unavailable here: no CUDA device visible" in capsys.readouterr().err
