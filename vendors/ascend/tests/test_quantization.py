"""The quantized adapters against the ``torch_npu`` quantization double (no NPU, no SDK).

Every case and dtype of the quantized contracts the Ascend wheel serves runs through core's
conformance check with each adapter's ``prepare`` step; the tests below pin the operator calls,
the prepared layouts and what is declined.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang_fl_ascend import plugin
from sglang_fl_ascend.impl.quantization import (
    ADAPTERS,
    NO_KERNEL,
    prepare_int8,
    prepare_wna16,
    w8a8_int8_linear,
)
from torch_npu_quant_double import TorchNpuQuantDouble

from sglang_fl import Unsupported
from sglang_fl.ops import OpCase
from sglang_fl.ops.quantization.numerics import pack_int32
from sglang_fl.testing.checks import PASSED, SKIPPED, check_case
from sglang_fl.testing.vendor import VendorSuite

SUITE = VendorSuite("ascend", plugin.sglang_fl_register_ops)
IMPLS = SUITE.implementations
CASES = [param for param in SUITE.contract_cases() if param.values[0] in ADAPTERS]
HALF = (torch.float16, torch.bfloat16)


def declined(op: str, params: dict[str, object], dtype: torch.dtype) -> bool:
    """float32 (the operators output float16/bfloat16 and take scales in x's dtype), and W4A16
    groups the weight-quant matmul does not take (multiples of 32 in [32, K - 1])."""
    if dtype not in HALF:
        return True
    if op == "wna16_linear":
        group, k = int(params["group"]), int(params["k"])
        return group != k and not (group % 32 == 0 and 32 <= group < k)
    return False


def test_registers_the_integer_kernels_and_says_why_not_the_others() -> None:
    for op, kernel in ADAPTERS.items():
        assert (IMPLS[op].fn, IMPLS[op].prepare) == (kernel.fn, kernel.prepare)
    for op, reason in NO_KERNEL.items():
        assert op not in IMPLS
        assert [gap.reason for gap in SUITE.registry.no_kernel(op)] == [reason]


@pytest.mark.parametrize(("op", "case", "dtype"), CASES)
def test_contract_case(
    torch_npu: TorchNpuQuantDouble, op: str, case: OpCase, dtype: torch.dtype
) -> None:
    outcome = check_case(IMPLS[op], case, dtype)
    expected = SKIPPED if declined(op, dict(case.params), dtype) else PASSED
    assert outcome.status == expected, outcome.message
    matmuls = [c for c in torch_npu.calls if c.name != "npu_convert_weight_to_int4pack"]
    assert bool(matmuls) is (expected == PASSED and case.params["tokens"] > 0), torch_npu.calls


def int8_layer() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randint(-127, 128, (48, 64), generator=generator, dtype=torch.int8)
    return weight, torch.rand(48, generator=generator) / 100


@pytest.mark.parametrize(
    ("rule", "quantizer"), [("absmax", ["npu_dynamic_quant"]), ("compressed-tensors", [])]
)
def test_absmax_layers_quantize_on_the_npu_operator(
    torch_npu: TorchNpuQuantDouble, rule: str, quantizer: list[str]
) -> None:
    """npu_dynamic_quant computes rowMax(|x|) / 127: the absmax rule; compressed-tensors'
    layers (127.5, a scale in x's dtype) are quantized by the rule itself."""
    weight_t, scale = prepare_int8(None, *int8_layer())
    assert weight_t.shape == (64, 48)
    assert weight_t.stride(0) == 1
    x = torch.randn(5, 64).to(torch.bfloat16)
    w8a8_int8_linear(SimpleNamespace(act_quant=rule), x, weight_t, scale, torch.ones(48))
    assert [c.name for c in torch_npu.calls] == [*quantizer, "npu_quant_matmul"]
    matmul = torch_npu.calls[-1]
    assert matmul.args[1] is weight_t
    assert matmul.kwargs["output_dtype"] == torch.bfloat16
    assert matmul.kwargs["bias"].dtype == torch.float32  # the dtype table's bias for every output


def test_four_bit_weights_are_packed_once_at_preparation(torch_npu: TorchNpuQuantDouble) -> None:
    q = torch.randint(-8, 8, (64, 128), dtype=torch.int8)
    scale = torch.rand(64, 2).to(torch.float16)
    obj = SimpleNamespace(num_bits=4, group_size=64)
    packed, antiquant_scale, offset = prepare_wna16(obj, pack_int32(q, 4), scale, None)
    assert [c.name for c in torch_npu.calls] == ["npu_convert_weight_to_int4pack"]
    assert packed.dtype == torch.int32
    assert packed.shape == (128, 8)
    assert antiquant_scale.shape == (2, 64)
    assert offset is None


def test_groups_the_operator_does_not_take_are_declined_at_preparation(
    torch_npu: TorchNpuQuantDouble,
) -> None:
    q = torch.randint(-8, 8, (64, 128), dtype=torch.int8)
    obj = SimpleNamespace(num_bits=4, group_size=16)
    with pytest.raises(Unsupported, match="groups of 32-multiples"):
        prepare_wna16(obj, pack_int32(q, 4), torch.rand(64, 8).half(), None)
    assert torch_npu.calls == []
