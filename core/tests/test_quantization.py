"""Quantized ops: the references' numerics, weight preparation, and the kit running it.

The references' agreement with compressed-tensors' own quantize-dequantize (the formats'
oracle) is checked where compressed-tensors is installed:
tests/sglang/test_quantization_layers.py.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from sglang_fl import Unsupported
from sglang_fl.dispatch.backends import Backend
from sglang_fl.dispatch.prepare import prepare_chain
from sglang_fl.dispatch.registry import OpRegistry
from sglang_fl.dispatch.types import BackendImplKind, OpImpl, PreparedKernel, Provenance
from sglang_fl.errors import NoImplementationError, RegistrationError, StrictModeError
from sglang_fl.ops import get_contract
from sglang_fl.ops.quantization import QUANTIZATION_OPS
from sglang_fl.ops.quantization.linear import dequantize_wna16
from sglang_fl.ops.quantization.numerics import (
    FP8_DTYPE,
    ActQuant,
    QuantType,
    dequantize_block,
    dequantize_rows,
    pack_int32,
    quantize_rows,
    unpack_int32,
)
from sglang_fl.testing.checks import FAILED, PASSED, SKIPPED, check_case

PROVENANCE = Provenance(plugin="acme", distribution="sglang-fl-acme", version="1.0")
QUANTIZED = tuple(contract.name for contract in QUANTIZATION_OPS)


def inputs(op: str, case_index: int = 0, dtype: torch.dtype = torch.float32) -> Any:
    contract = get_contract(op)
    case = contract.cases[case_index]
    generator = torch.Generator().manual_seed(zlib.crc32(case.name.encode()))
    return contract.make_inputs(case, dtype, torch.device("cpu"), generator)


def case_index(op: str, *fragments: str) -> int:
    cases = get_contract(op).cases
    return next(i for i, c in enumerate(cases) if all(f in c.name.split(",") for f in fragments))


# --- activation rules ---------------------------------------------------------------------------


def test_compressed_tensors_int8_divides_by_half_the_range_in_the_input_dtype() -> None:
    x = torch.tensor([[1.0, -2.55, 0.5], [0.0, 0.0, 0.0]], dtype=torch.bfloat16)
    q, scale = quantize_rows(x, QuantType.INT8, ActQuant.COMPRESSED_TENSORS)
    expected_scale = (torch.tensor(2.55, dtype=torch.bfloat16) / 127.5).float()
    assert scale[0, 0] == expected_scale  # amax / 127.5, rounded to bfloat16 first
    assert scale[1, 0] == torch.finfo(torch.bfloat16).eps  # a zero row: the dtype's eps
    assert q.dtype == torch.int8
    assert q[1].eq(0).all()
    # amax 127.5: scale 1, and -127.5 (the most negative) rounds half to even to -128
    q, scale = quantize_rows(torch.tensor([[-127.5, 126.5, 0.5]]), QuantType.INT8,
                             ActQuant.COMPRESSED_TENSORS)  # fmt: skip
    assert scale.item() == 1.0
    assert q.tolist() == [[-128, 126, 0]]


def test_absmax_rule_divides_by_qmax_in_float32() -> None:
    x = torch.tensor([[1.0, -2.54, 0.5]])
    q, scale = quantize_rows(x, QuantType.INT8, ActQuant.ABSMAX)
    assert torch.allclose(scale, torch.tensor([[2.54 / 127]]))
    assert q.tolist() == [[50, -127, 25]]
    zeros_q, zeros_scale = quantize_rows(torch.zeros(1, 4), QuantType.INT8, ActQuant.ABSMAX)
    assert zeros_q.eq(0).all()
    assert zeros_scale.item() == pytest.approx(1e-10 / 127)


@pytest.mark.parametrize("rule", list(ActQuant))
def test_fp8_groups_each_get_their_own_scale(rule: ActQuant) -> None:
    x = torch.cat([torch.full((2, 4), 1.0), torch.full((2, 4), 100.0)], dim=1)
    q, scale = quantize_rows(x, QuantType.FP8, rule, group_size=4)
    assert q.dtype == FP8_DTYPE
    assert scale.shape == (2, 2)
    assert torch.allclose(scale[:, 1] / scale[:, 0], torch.tensor(100.0))
    assert torch.allclose(dequantize_rows(q, scale, 4), x)


def test_a_row_whose_width_is_not_a_multiple_of_the_group_is_refused() -> None:
    with pytest.raises(ValueError, match="not a multiple of group 4"):
        quantize_rows(torch.ones(1, 6), QuantType.FP8, ActQuant.ABSMAX, group_size=4)


def test_unknown_rule_names_the_op_and_the_allowed() -> None:
    x = inputs("w8a8_int8_linear")
    x.obj.act_quant = "per-tensor"
    with pytest.raises(ValueError, match=r"w8a8_int8_linear: act_quant 'per-tensor' is not one"):
        get_contract("w8a8_int8_linear").reference(x.obj, *x.args)


# --- weights ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [4, 8])
def test_pack_and_unpack_are_inverse(bits: int) -> None:
    half = 1 << (bits - 1)
    values = torch.randint(-half, half, (5, 40), dtype=torch.int8)
    packed = pack_int32(values, bits)
    assert packed.dtype == torch.int32
    assert packed.shape == (5, 40 * bits // 32)
    assert torch.equal(unpack_int32(packed, bits, 40), values)


def test_pack_layout_is_lowest_bits_first_with_the_offset() -> None:
    values = torch.tensor([[-8, -7, 0, 7, 1, 2, 3, 4]], dtype=torch.int8)
    nibbles = [v + 8 for v in values[0].tolist()]
    word = sum(n << (4 * i) for i, n in enumerate(nibbles))
    assert pack_int32(values, 4).item() == word - (1 << 32 if word >= 1 << 31 else 0)


def test_block_dequantization_covers_partial_edge_blocks() -> None:
    weight = torch.ones(5, 4).to(FP8_DTYPE)
    scale = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    dense = dequantize_block(weight, scale, (2, 2))
    assert dense[:, 0].tolist() == [1, 1, 3, 3, 5]
    assert dense[:, 3].tolist() == [2, 2, 4, 4, 6]


def test_wna16_dequantizes_in_the_scale_dtype_with_zero_points() -> None:
    q = torch.tensor([[-8, 7, 1, 2]], dtype=torch.int8)
    scale = torch.tensor([[0.5, 2.0]], dtype=torch.bfloat16)
    zero = torch.tensor([[1, -1]], dtype=torch.int8)
    dense = dequantize_wna16(pack_int32(q, 4), scale, zero, 4, 2)
    assert dense.dtype == torch.bfloat16
    assert dense.tolist() == [[-4.5, 3.0, 4.0, 6.0]]


# --- the references against the plain float computation they quantize ---------------------------


def test_int8_linear_is_the_dequantized_product() -> None:
    case = inputs("w8a8_int8_linear", case_index("w8a8_int8_linear", "tokens=33", "bias"))
    x, weight, scale, bias = case.args
    got = get_contract("w8a8_int8_linear").reference(case.obj, *case.args)
    q, row_scale = quantize_rows(x, QuantType.INT8, ActQuant(case.obj.act_quant))
    want = F.linear(dequantize_rows(q, row_scale), weight.float() * scale[:, None], bias)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_block_fp8_linear_uses_the_activation_groups_of_the_block_width() -> None:
    op = "w8a8_block_fp8_linear"
    case = inputs(op, case_index(op, "tokens=7", "block=32x64"))
    x, weight, scale, bias = case.args
    got = get_contract(op).reference(case.obj, *case.args)
    q, row_scale = quantize_rows(x, QuantType.FP8, ActQuant(case.obj.act_quant), 64)
    want = F.linear(dequantize_rows(q, row_scale, 64), dequantize_block(weight, scale, (32, 64)))
    torch.testing.assert_close(got, want if bias is None else want + bias)


def test_quantized_moe_matches_per_expert_linears() -> None:
    op = "fused_moe_w8a8_int8"
    case = inputs(op, case_index(op, "tokens=17", "experts=8", "silu", "act_quant=absmax"))
    x, w13, w2, s13, s2, weights, ids, _activation = case.args
    linear = get_contract("w8a8_int8_linear").reference
    obj = type("Obj", (), {"act_quant": case.obj.act_quant})()
    want = torch.zeros_like(x)
    for token in range(x.shape[0]):
        for slot in range(ids.shape[1]):
            e = int(ids[token, slot])
            gate_up = linear(obj, x[token : token + 1], w13[e], s13[e])
            hidden = F.silu(gate_up[:, :128]) * gate_up[:, 128:]
            want[token] += weights[token, slot] * linear(obj, hidden, w2[e], s2[e])[0]
    got = get_contract(op).reference(case.obj, *case.args)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# --- weight preparation: registration, the kit, the layer chain ---------------------------------


def transposing_int8_linear(obj: Any, x: torch.Tensor, weight_t: torch.Tensor, scale_col: Any,
                            bias: Any = None) -> torch.Tensor:  # fmt: skip
    """A kernel wanting the weight as ``[K, N]`` and the scale as ``[N, 1]`` (sgl_kernel's)."""
    assert weight_t.shape[0] == x.shape[1], "got the checkpoint layout, not the prepared one"
    reference = get_contract("w8a8_int8_linear").reference
    return reference(obj, x, weight_t.t(), scale_col.reshape(-1), bias)


def prepare_transposed(obj: Any, weight: torch.Tensor, scale: torch.Tensor) -> tuple[Any, ...]:
    return weight.t(), scale.reshape(-1, 1)


def acme(op: str, fn: Any, prepare: Any = None) -> OpImpl:
    impl = OpImpl(op, "vendor.acme", BackendImplKind.VENDOR, fn, "acme", prepare=prepare)
    return impl.with_provenance(PROVENANCE)


def reference_impl(op: str) -> OpImpl:
    return OpImpl(op, f"reference.{op}", BackendImplKind.REFERENCE, get_contract(op).reference)


def test_the_kit_hands_an_implementation_what_it_prepared() -> None:
    impl = acme("w8a8_int8_linear", transposing_int8_linear, prepare_transposed)
    contract = get_contract("w8a8_int8_linear")
    outcomes = [check_case(impl, case, torch.float32) for case in contract.cases[:6]]
    assert {o.status for o in outcomes} == {PASSED}, outcomes
    unprepared = acme("w8a8_int8_linear", transposing_int8_linear)
    failed = check_case(unprepared, contract.cases[2], torch.float32)
    assert failed.status == FAILED
    assert "got the checkpoint layout" in failed.message


def test_a_prepare_step_that_writes_the_weights_fails_the_kit() -> None:
    def prepare_in_place(obj: Any, weight: torch.Tensor, scale: torch.Tensor) -> tuple[Any, ...]:
        scale.mul_(1.0001)  # a fallback would read the changed scales
        return weight.t(), scale.reshape(-1, 1)

    impl = acme("w8a8_int8_linear", transposing_int8_linear, prepare_in_place)
    outcome = check_case(impl, get_contract("w8a8_int8_linear").cases[2], torch.float32)
    assert outcome.status == FAILED
    assert "input 'weight_scale' (48 of 48 elements) was modified" in outcome.message


def test_a_layer_declined_by_prepare_is_a_skip() -> None:
    def decline(obj: Any, weight: torch.Tensor, scale: torch.Tensor) -> tuple[Any, ...]:
        raise Unsupported("N must be a multiple of 128")

    impl = acme("w8a8_int8_linear", transposing_int8_linear, decline)
    outcome = check_case(impl, get_contract("w8a8_int8_linear").cases[2], torch.float32)
    assert outcome.status == SKIPPED
    assert "N must be a multiple of 128" in outcome.message


def test_registration_refuses_a_prepare_step_for_an_op_without_weights() -> None:
    registry = OpRegistry()
    reference = get_contract("rms_norm").reference
    impl = OpImpl("rms_norm", "vendor.acme", BackendImplKind.VENDOR,
                  reference, "acme", prepare=prepare_transposed)  # fmt: skip
    with pytest.raises(RegistrationError, match="op 'rms_norm' has no weights to prepare"):
        registry.register(impl)
    bad = OpImpl("wna16_linear", "vendor.acme", BackendImplKind.VENDOR,
                 get_contract("wna16_linear").reference, "acme", prepare="transpose")  # fmt: skip
    with pytest.raises(RegistrationError, match="prepare='transpose'; expected None or prepare"):
        registry.register(bad)


def test_backend_implementations_carry_a_prepared_kernel() -> None:
    class Acme(Backend):
        name = "acme"

        def is_available(self) -> bool:
            return True

    impls = Acme().implementations(
        {
            "w8a8_int8_linear": PreparedKernel(transposing_int8_linear, prepare_transposed),
            "rms_norm": get_contract("rms_norm").reference,
        }
    )
    assert impls[0].prepare is prepare_transposed
    assert impls[0].fn is transposing_int8_linear
    assert impls[1].prepare is None
    registry = OpRegistry()
    registry.register_many(impls)
    assert registry.implementations("w8a8_int8_linear")[0].prepare is prepare_transposed


def layer_case() -> tuple[Any, tuple[Any, ...], torch.Tensor]:
    case = inputs("w8a8_int8_linear", case_index("w8a8_int8_linear", "tokens=7", "bias"))
    x, weight, scale, _bias = case.args
    return case.obj, (weight, scale), x


def test_a_declined_call_reaches_the_fallback_with_the_checkpoint_layout() -> None:
    calls: list[str] = []

    def picky(obj: Any, x: torch.Tensor, weight_t: Any, scale_col: Any, bias: Any = None) -> Any:
        calls.append("acme")
        if x.shape[0] > 4:
            raise Unsupported("more than 4 tokens")
        return transposing_int8_linear(obj, x, weight_t, scale_col, bias)

    op = "w8a8_int8_linear"
    obj, weights, x = layer_case()
    chain = prepare_chain(
        op, [acme(op, picky, prepare_transposed), reference_impl(op)], obj, weights
    )
    assert [impl.impl_id for impl in chain.chain] == ["vendor.acme", f"reference.{op}"]
    want = get_contract(op).reference(obj, x, *weights)
    for impl in chain.chain:  # each walks with its own layout, given the checkpoint's
        if impl.impl_id == "vendor.acme":
            with pytest.raises(Unsupported):
                impl.fn(obj, x, *weights)
            torch.testing.assert_close(impl.fn(obj, x[:3], *weights), want[:3])
        else:
            torch.testing.assert_close(impl.fn(obj, x, *weights), want)
    assert calls == ["acme", "acme"]


def test_a_candidate_declining_the_layer_is_left_out_with_its_reason() -> None:
    def decline(obj: Any, weight: Any, scale: Any) -> tuple[Any, ...]:
        raise Unsupported("int8 GEMM needs N % 16 == 0")

    op = "w8a8_int8_linear"
    obj, weights, _ = layer_case()
    vendor = acme(op, transposing_int8_linear, decline)
    chain = prepare_chain(op, [vendor, reference_impl(op)], obj, weights)
    assert [impl.impl_id for impl in chain.chain] == [f"reference.{op}"]
    assert chain.declined == ((vendor, "int8 GEMM needs N % 16 == 0"),)
    with pytest.raises(
        StrictModeError, match=re.escape("vendor.acme declined to prepare the weights")
    ):
        prepare_chain(op, [vendor, reference_impl(op)], obj, weights, strict=True)
    with pytest.raises(
        NoImplementationError, match=re.escape("vendor.acme: int8 GEMM needs N % 16 == 0")
    ):
        prepare_chain(op, [vendor], obj, weights)


def test_a_prepare_step_returning_the_wrong_arity_is_named() -> None:
    op = "w8a8_int8_linear"
    obj, weights, _ = layer_case()
    vendor = acme(op, transposing_int8_linear, lambda obj, w, s: w.t())
    with pytest.raises(
        TypeError, match=re.escape("vendor.acme: prepare for op 'w8a8_int8_linear' returned")
    ):
        prepare_chain(op, [vendor], obj, weights)


@pytest.mark.parametrize("op", QUANTIZED)
def test_each_quantized_op_lists_its_weights_and_has_empty_batches(op: str) -> None:
    contract = get_contract(op)
    assert contract.weights
    assert contract.weights[0] in ("weight", "w13")
    assert any("tokens=0" in case.name for case in contract.cases)
    assert any("strided" in case.name for case in contract.cases)
    empty = inputs(op, case_index(op, "tokens=0"))
    out = contract.reference(empty.obj, *empty.args)
    assert out.shape[0] == 0
    assert out.dtype == torch.float32
