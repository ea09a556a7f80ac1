"""The quantized adapters against the doubles of sgl_kernel's GEMMs and SGLang's Triton experts.

Every case and dtype of the quantized contracts runs through core's conformance check with each
adapter's ``prepare`` step (the kit prepares, then calls), on an emulated sm90 GPU; the tests
below pin the layouts the adapters prepare, the kernel calls and what they decline.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch
from sgl_kernel_quant_double import SglKernelQuantDouble
from sglang_fl_cuda import plugin
from sglang_fl_cuda.impl.moe import SGLANG_FUSED_MOE
from sglang_fl_cuda.impl.quantization import (
    ADAPTERS,
    prepare_block_fp8,
    prepare_int8,
    w8a8_int8_linear,
)

from sglang_fl import Unsupported
from sglang_fl.ops import OpCase
from sglang_fl.ops.quantization.numerics import ActQuant
from sglang_fl.testing.checks import PASSED, SKIPPED, check_case
from sglang_fl.testing.vendor import VendorSuite

SUITE = VendorSuite("cuda", plugin.sglang_fl_register_ops)
IMPLS = SUITE.implementations
CASES = [param for param in SUITE.contract_cases() if param.values[0] in ADAPTERS]
HALF = (torch.float16, torch.bfloat16)


@pytest.fixture
def gemms(
    sgl_kernel: SglKernelQuantDouble, monkeypatch: pytest.MonkeyPatch
) -> SglKernelQuantDouble:
    """The ``sgl_kernel`` double on an emulated sm90 (Hopper) GPU."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    return sgl_kernel


def declined(op: str, params: dict[str, object], dtype: torch.dtype) -> bool:
    """What the adapters hand back: float32 (the GEMMs write half precision), layers outside
    the kernels' shapes (partial 128-blocks, other block sizes; AWQ's float16, 4-bit, 16x16
    grid), and experts of the compressed-tensors rule (SGLang's Triton path has the absmax one)."""
    if dtype not in HALF:
        return True
    if op == "w8a8_block_fp8_linear":
        return params["block"] != (128, 128) or int(params["n"]) % 128 != 0
    if op == "wna16_linear":
        return dtype != torch.float16 or params["bits"] != 4
    if op.startswith("fused_moe"):
        return params["act_quant"] != ActQuant.ABSMAX
    return False


def test_every_quantized_op_is_registered_with_its_prepare_step() -> None:
    for op, kernel in ADAPTERS.items():
        assert IMPLS[op].fn is kernel.fn
        assert IMPLS[op].prepare is kernel.prepare


@pytest.mark.parametrize(("op", "case", "dtype"), CASES)
def test_contract_case(
    gemms: SglKernelQuantDouble, op: str, case: OpCase, dtype: torch.dtype
) -> None:
    outcome = check_case(IMPLS[op], case, dtype)
    expected = SKIPPED if declined(op, dict(case.params), dtype) else PASSED
    assert outcome.status == expected, outcome.message
    experts = sys.modules[SGLANG_FUSED_MOE]
    launched = gemms.calls or experts.calls  # type: ignore[attr-defined]
    assert bool(launched) is (expected == PASSED and case.params["tokens"] > 0), launched


def int8_layer(n: int = 64, k: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randint(-127, 128, (n, k), generator=generator, dtype=torch.int8)
    return weight, torch.rand(n, generator=generator) / 100


def test_int8_weights_are_prepared_column_major_without_a_copy(gemms: SglKernelQuantDouble) -> None:
    weight, scale = int8_layer()
    weight_t, scale_prepared = prepare_int8(None, weight, scale)
    assert weight_t.shape == (128, 64)
    assert weight_t.stride(0) == 1
    assert weight_t.data_ptr() == weight.data_ptr()
    x = torch.randn(3, 128).to(torch.bfloat16)
    obj = SimpleNamespace(act_quant="compressed-tensors")
    w8a8_int8_linear(obj, x, weight_t, scale_prepared)
    ((name, (mat_a, mat_b, scales_a, _scales_b, out_dtype, bias), _),) = gemms.calls
    assert name == "int8_scaled_mm"
    assert mat_b is weight_t
    assert out_dtype == torch.bfloat16
    assert mat_a.dtype == torch.int8
    assert scales_a.shape == (3,)
    assert bias is None


@pytest.mark.parametrize(("n", "k"), [(60, 128), (64, 120)])
def test_int8_shapes_the_gemm_cannot_take_are_declined_at_preparation(
    gemms: SglKernelQuantDouble, n: int, k: int
) -> None:
    weight, scale = int8_layer(n, k)
    with pytest.raises(Unsupported, match="K % 16 == 0 and N % 8 == 0"):
        prepare_int8(None, weight, scale)


@pytest.mark.parametrize("capability", [(7, 5), (10, 0)])
def test_int8_gemm_off_sm80_to_sm90_is_declined(
    gemms: SglKernelQuantDouble, monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int]
) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    with pytest.raises(Unsupported, match="sm80-sm90"):
        prepare_int8(None, *int8_layer())


def test_block_scales_are_prepared_k_major(gemms: SglKernelQuantDouble) -> None:
    weight = torch.randn(256, 384).to(torch.float8_e4m3fn)
    scale = torch.rand(2, 3)
    obj = SimpleNamespace(weight_block_size=(128, 128))
    _weight_t, scale_t = prepare_block_fp8(obj, weight, scale)
    assert scale_t.shape == (3, 2)
    assert scale_t.stride(0) == 1
    with pytest.raises(Unsupported, match="128x128 blocks"):
        prepare_block_fp8(SimpleNamespace(weight_block_size=(64, 64)), weight, scale)


def test_float32_activations_are_declined_before_any_kernel(gemms: SglKernelQuantDouble) -> None:
    weight_t, scale = prepare_int8(None, *int8_layer())
    with pytest.raises(Unsupported, match="writes float16 or bfloat16"):
        w8a8_int8_linear(SimpleNamespace(act_quant="absmax"), torch.randn(2, 128), weight_t, scale)
    assert gemms.calls == []
