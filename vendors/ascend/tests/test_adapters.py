"""The torch_npu adapters against the ``torch_npu`` test double (no NPU, no CANN, no torch-npu).

Every case and dtype of each op contract (empty batches and strided inputs included) goes
through core's conformance check (values vs the reference, untouched inputs, in-place outputs)
against a double that rejects what the real operators reject; the tests below pin the operator
calls as SGLang's ``forward_npu`` makes them: argument order, returned tuples, what is written
where, and what is declined or never called.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from sglang_fl_ascend import backend, plugin
from sglang_fl_ascend.backend import TORCH_NPU
from sglang_fl_ascend.impl.activation import gelu_and_mul, gelu_new, gelu_quick, silu_and_mul
from sglang_fl_ascend.impl.attention import decode_attention, extend_attention, store_kv_cache
from sglang_fl_ascend.impl.collectives import COLLECTIVES
from sglang_fl_ascend.impl.collectives import LEFT_TO_SGLANG as COLLECTIVES_LEFT_TO_SGLANG
from sglang_fl_ascend.impl.linear_attention import ADAPTERS as LINEAR_ATTENTION
from sglang_fl_ascend.impl.linear_attention import NO_KERNEL as LINEAR_ATTENTION_NO_KERNEL
from sglang_fl_ascend.impl.moe import fused_moe, topk
from sglang_fl_ascend.impl.normalization import gemma_rms_norm, layer_norm, rms_norm
from sglang_fl_ascend.impl.quantization import ADAPTERS as QUANTIZATION
from sglang_fl_ascend.impl.quantization import NO_KERNEL as QUANTIZATION_NO_KERNEL
from sglang_fl_ascend.impl.rotary import mrotary_embedding, rotary_embedding
from torch_npu_double import TorchNpuDouble

from sglang_fl import Unsupported
from sglang_fl.dispatch.types import BackendImplKind
from sglang_fl.ops import STANDARD_OPS, OpCase
from sglang_fl.testing.checks import PASSED, SKIPPED, check_case
from sglang_fl.testing.doubles import install_double
from sglang_fl.testing.vendor import VendorSuite, topk_config

SUITE = VendorSuite("ascend", plugin.sglang_fl_register_ops)
REGISTRY, IMPLS = SUITE.registry, SUITE.implementations
# The attention ops' cases run in test_attention.py (their declines follow the operators'
# block-size and option rules, pinned there); the GDN adapters call sgl_kernel_npu, not
# torch_npu: test_linear_attention.py.
ATTENTION = {"store_kv_cache", "decode_attention", "extend_attention"}
# The quantized adapters run against the quantization double: test_quantization.py.
CASES = [
    param
    for param in SUITE.contract_cases()
    if param.values[0] not in ATTENTION
    and param.values[0] not in LINEAR_ATTENTION
    and param.values[0] not in QUANTIZATION
]
# torch_npu has no operator of its own for these: SGLang's forward_npu has no NPU path
# (ClampPositionOp, Qwen2-MoE's gate function); the reference runs on torch_npu's aten ops.
WITHOUT_OPERATOR = {"clamp_position", "fused_gate_sigmoid_mul"}
# The GDN family: no torch_npu operator (sgl_kernel_npu serves fused_gdn_gating only).
WITHOUT_OPERATOR |= set(LINEAR_ATTENTION_NO_KERNEL)
# SGLang's quantised all-reduce is a torch_npu kernel plus HCCL: its own path stays.
WITHOUT_OPERATOR |= set(COLLECTIVES_LEFT_TO_SGLANG)
# No float8 operator on Atlas A2/A3; the quantized experts are not wired yet.
WITHOUT_OPERATOR |= set(QUANTIZATION_NO_KERNEL)

# Operator calls per case: one; fused_moe chains five (routing, gate/up matmul, swiglu, down
# matmul, finalize).
CALLS = {"fused_moe": 5}


def test_ops_without_an_operator_are_declared_with_a_reason() -> None:
    declared = {op for op in STANDARD_OPS if REGISTRY.no_kernel(op)}
    assert declared == WITHOUT_OPERATOR
    assert all(REGISTRY.no_kernel(op)[0].reason for op in declared)


def declined(op: str, params: Mapping[str, Any], dtype: torch.dtype) -> bool:
    """The calls the adapters hand back with Unsupported: npu_mrope takes head sizes and
    rotary dims in multiples of 32 in half precision (16 in float32), documented layouts only
    (no interleaved mrope sections) and a cache in the query dtype; npu_moe_gating_top_k always
    renormalises; the torch_npu MoE path fuses silu only."""
    if op == "topk":
        plain = not params["grouped"] and not params["bias"] and params["scoring_func"] == "softmax"
        # npu_moe_gating_top_k needs more than 2 experts per group (8 experts in 4 groups: 2).
        narrow_groups = bool(params["grouped"]) and params["experts"] // params.get("groups", 4) < 3
        return not plain and (not params["renormalize"] or narrow_groups)
    if op == "fused_moe":
        return bool(params["activation"] != "silu")
    if op not in ("rotary_embedding", "mrotary_embedding"):
        return False
    sizes = (params["rotary_dim"], params.get("head_size", params["rotary_dim"]))
    misaligned = dtype != torch.float32 and any(size % 32 for size in sizes)
    if op == "rotary_embedding":
        return misaligned
    interleaved_3d = bool(params["three_d"] and params["interleaved_sections"])
    # The qkv-slice cases carry a float32 cos_sin_cache (SGLang's CUDA layout).
    cache_mismatch = bool(params["qkv_slices"]) and dtype != torch.float32
    return misaligned or interleaved_3d or cache_mismatch


def test_registers_every_standard_op_as_the_adapter_itself() -> None:
    assert {op: impl.fn for op, impl in IMPLS.items()} == {
        "silu_and_mul": silu_and_mul,
        "rms_norm": rms_norm,
        "rotary_embedding": rotary_embedding,
        "gelu_and_mul": gelu_and_mul,
        "gelu_new": gelu_new,
        "gelu_quick": gelu_quick,
        "gemma_rms_norm": gemma_rms_norm,
        "layer_norm": layer_norm,
        "mrotary_embedding": mrotary_embedding,
        "topk": topk,
        "fused_moe": fused_moe,
        "store_kv_cache": store_kv_cache,
        "decode_attention": decode_attention,
        "extend_attention": extend_attention,
        **COLLECTIVES,  # HCCL through torch_npu's process group (test_collectives.py)
        **LINEAR_ATTENTION,
        **{op: kernel.fn for op, kernel in QUANTIZATION.items()},
    }
    assert set(STANDARD_OPS) - set(IMPLS) == WITHOUT_OPERATOR
    for impl in IMPLS.values():
        assert impl.kind is BackendImplKind.VENDOR
        assert (impl.vendor, impl.impl_id, impl.priority) == ("ascend", "vendor.ascend", 100)
        assert impl.availability_probe is not None


@pytest.mark.parametrize(("op", "case", "dtype"), CASES)
def test_contract_case(
    torch_npu: TorchNpuDouble, op: str, case: OpCase, dtype: torch.dtype
) -> None:
    outcome = check_case(IMPLS[op], case, dtype)
    expected = SKIPPED if declined(op, case.params, dtype) else PASSED
    assert outcome.status == expected, outcome.message
    # No operator call for a declined call or an empty batch (torch_npu refuses it); one per
    # case otherwise, or the chain CALLS counts.
    calls = CALLS.get(op, 1) if expected == PASSED and case.params["tokens"] > 0 else 0
    assert len(torch_npu.calls) == calls, torch_npu.called


def test_silu_and_mul_is_npu_swiglu_over_the_last_dim(torch_npu: TorchNpuDouble) -> None:
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    out = silu_and_mul(None, x)
    ((name, args, kwargs),) = torch_npu.calls
    assert name == "npu_swiglu"
    assert args[0] is x
    assert kwargs == {"dim": -1}
    assert out.shape == (3, 4)


def norm_layer(hidden: int, dtype: torch.dtype = torch.float16) -> torch.nn.Module:
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.rand(hidden).to(dtype))
    layer.variance_epsilon = 1e-5
    return layer


def test_rms_norm_returns_y_of_npu_rms_norm(torch_npu: TorchNpuDouble) -> None:
    layer, x = norm_layer(16), torch.randn(4, 16, dtype=torch.float16)
    out = rms_norm(layer, x)
    ((name, (kernel_x, gamma, epsilon), _),) = torch_npu.calls
    assert name == "npu_rms_norm"
    assert kernel_x is x
    assert not isinstance(gamma, torch.nn.Parameter)
    assert torch.equal(gamma, layer.weight)
    assert epsilon == 1e-5
    assert isinstance(out, torch.Tensor)
    assert out.shape == x.shape


def test_rms_norm_with_residual_passes_residual_first(torch_npu: TorchNpuDouble) -> None:
    layer = norm_layer(16)
    x, residual = torch.randn(4, 16, dtype=torch.float16), torch.randn(4, 16, dtype=torch.float16)
    before = (x.clone(), residual.clone())
    out, new_residual = rms_norm(layer, x, residual)
    ((name, (x1, x2, _, epsilon), _),) = torch_npu.calls
    assert name == "npu_add_rms_norm"
    assert x1 is residual  # forward_npu: npu_add_rms_norm(residual, x, weight, eps)
    assert x2 is x
    assert epsilon == 1e-5
    torch.testing.assert_close(new_residual, (before[0].float() + before[1].float()).half())
    assert torch.equal(x, before[0])  # new tensors: the inputs are left as they were
    assert torch.equal(residual, before[1])
    assert out.data_ptr() != x.data_ptr()


def test_rms_norm_declines_a_foreign_weight_dtype(torch_npu: TorchNpuDouble) -> None:
    with pytest.raises(Unsupported, match="gamma dtype"):
        rms_norm(norm_layer(16, torch.float32), torch.randn(2, 16, dtype=torch.float16))
    assert torch_npu.calls == []


def rope_inputs(
    dtype: torch.dtype = torch.bfloat16, interleaved: bool = False
) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    contract = STANDARD_OPS["rotary_embedding"]
    case = next(
        c
        for c in contract.cases
        if c.params["head_size"] == 64
        and c.params["q_heads"] == 4
        and c.params["interleaved"] is interleaved
    )
    generator = torch.Generator().manual_seed(3)
    inputs = contract.make_inputs(case, dtype, torch.device("cpu"), generator)
    return (inputs.obj, *inputs.args)  # type: ignore[return-value]


@pytest.mark.parametrize(("interleaved", "mode"), [(False, "half"), (True, "interleave")])
def test_rotary_is_npu_mrope_on_flattened_rotary_parts(
    torch_npu: TorchNpuDouble, interleaved: bool, mode: str
) -> None:
    obj, query, key, cos, sin, positions = rope_inputs(interleaved=interleaved)
    q_out, k_out = rotary_embedding(obj, query, key, cos, sin, positions, interleaved, True)
    ((name, (kernel_positions, q2d, k2d, cache, head_size), kwargs),) = torch_npu.calls
    assert name == "npu_mrope"
    assert kernel_positions is positions
    assert q2d.shape == (query.shape[0], 4 * 32)
    assert k2d.shape == (key.shape[0], 2 * 32)
    torch.testing.assert_close(cache, torch.cat((cos, sin), dim=-1), rtol=0, atol=0)
    assert head_size == 32  # the rotary part of each 64-wide head
    assert kwargs == {"mrope_section": [0, 0, 0], "rotary_mode": mode}
    assert q_out is query  # written back into the caller's views
    assert k_out is key


def test_rotary_honours_its_cos_and_sin_not_the_layer_cache(torch_npu: TorchNpuDouble) -> None:
    obj, query, key, cos, sin, positions = rope_inputs()
    expected = STANDARD_OPS["rotary_embedding"].reference(
        obj, query.clone(), key.clone(), cos, sin, positions, False, False
    )
    obj.cos_sin_cache = torch.zeros_like(obj.cos_sin_cache).float()  # never read
    q_out, k_out = rotary_embedding(obj, query, key, cos, sin, positions, False, False)
    torch.testing.assert_close(q_out, expected[0])
    torch.testing.assert_close(k_out, expected[1])
    rotary_embedding(obj, query, key, cos, sin, positions, False, False)
    first, second = (call.args[3] for call in torch_npu.calls)
    assert first is second  # joined once per cos/sin pair


@pytest.mark.parametrize(("dtype", "rotary_dim"), [(torch.float16, 16), (torch.bfloat16, 48)])
def test_rotary_declines_unaligned_head_sizes_before_writing(
    torch_npu: TorchNpuDouble, dtype: torch.dtype, rotary_dim: int
) -> None:
    query, key = torch.randn(3, 4, rotary_dim).to(dtype), torch.randn(3, 2, rotary_dim).to(dtype)
    cos = sin = torch.ones(8, rotary_dim // 2).to(dtype)
    before = query.clone()
    message = f"multiples of .*; got head_size {rotary_dim}, rotary_dim {rotary_dim} in {dtype}"
    with pytest.raises(Unsupported, match=message):
        rotary_embedding(None, query, key, cos, sin, torch.tensor([0, 1, 2]))
    assert torch_npu.calls == []
    assert torch.equal(query, before)


def test_silu_and_mul_packs_a_strided_input(torch_npu: TorchNpuDouble) -> None:
    x = torch.randn(3, 16, dtype=torch.bfloat16)[:, ::2]
    silu_and_mul(None, x)
    ((_, (kernel_in,), _),) = torch_npu.calls
    assert kernel_in.is_contiguous()
    assert torch.equal(kernel_in, x)


# --- the second set of ops -------------------------------------------------------------------


@pytest.mark.parametrize(("approximate", "flag"), [("none", 0), ("tanh", 1)])
def test_gelu_and_mul_is_npu_geglu_gating_the_left_half(
    torch_npu: TorchNpuDouble, approximate: str, flag: int
) -> None:
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    out = gelu_and_mul(SimpleNamespace(approximate=approximate), x)
    ((name, args, kwargs),) = torch_npu.calls
    assert name == "npu_geglu"
    assert args[0] is x
    assert kwargs == {"dim": -1, "approximate": flag, "activate_left": True}
    assert out.shape == (3, 4)


def test_gelu_new_is_the_tanh_npu_gelu(torch_npu: TorchNpuDouble) -> None:
    x = torch.randn(2, 8)
    gelu_new(None, x)
    assert torch_npu.calls == [("npu_gelu", (x,), {"approximate": "tanh"})]


def test_gelu_quick_is_npu_fast_gelu(torch_npu: TorchNpuDouble) -> None:
    x = torch.randn(2, 8)
    gelu_quick(None, x)
    assert torch_npu.calls == [("npu_fast_gelu", (x,), {})]


def gemma_layer(hidden: int, dtype: torch.dtype = torch.bfloat16) -> SimpleNamespace:
    weight = (0.1 * torch.randn(hidden, generator=torch.Generator().manual_seed(3))).to(dtype)
    return SimpleNamespace(weight=weight, variance_epsilon=1e-6)


def test_gemma_rms_norm_passes_one_plus_weight_as_gamma(torch_npu: TorchNpuDouble) -> None:
    layer, x = gemma_layer(16), torch.randn(3, 16, dtype=torch.bfloat16)
    gemma_rms_norm(layer, x)
    ((name, (kernel_x, gamma, eps), _),) = torch_npu.calls
    assert name == "npu_rms_norm"
    assert kernel_x is x
    assert gamma.dtype == torch.bfloat16
    assert torch.equal(gamma, (1.0 + layer.weight.float()).to(torch.bfloat16))
    assert eps == 1e-6


def test_gemma_rms_norm_with_residual_is_npu_add_rms_norm(torch_npu: TorchNpuDouble) -> None:
    layer = gemma_layer(16)
    x, residual = torch.randn(3, 16).bfloat16(), torch.randn(3, 16).bfloat16()
    before = (x.clone(), residual.clone())
    _, new_residual = gemma_rms_norm(layer, x, residual)
    ((name, (x1, x2, gamma, _), _),) = torch_npu.calls
    assert name == "npu_add_rms_norm"
    assert x1 is residual
    assert x2 is x
    assert torch.equal(gamma, (1.0 + layer.weight.float()).to(torch.bfloat16))
    torch.testing.assert_close(new_residual, (before[0].float() + before[1].float()).bfloat16())
    assert torch.equal(x, before[0])
    assert torch.equal(residual, before[1])


def mrope_inputs(three_d: bool, interleaved: bool = False) -> tuple[object, ...]:
    contract = STANDARD_OPS["mrotary_embedding"]
    case = next(
        c
        for c in contract.cases
        if c.params["tokens"] == 17
        and c.params["three_d"] == three_d
        and c.params["interleaved_sections"] == interleaved
        and c.params["rotary_dim"] == 32
        and c.params["neox"]
        and not c.params["qkv_slices"]
    )
    inputs = contract.make_inputs(
        case, torch.bfloat16, torch.device("cpu"), torch.Generator().manual_seed(1)
    )
    return (inputs.obj, *inputs.args)


def test_mrope_with_3d_positions_passes_the_layer_sections(torch_npu: TorchNpuDouble) -> None:
    obj, positions, query, key = mrope_inputs(three_d=True)
    mrotary_embedding(obj, positions, query, key)
    ((name, args, kwargs),) = torch_npu.calls
    assert name == "npu_mrope"
    assert args[0] is positions
    assert args[1] is query
    assert args[3] is obj.cos_sin_cache  # type: ignore[attr-defined]
    assert args[4] == 64  # head_size: the rest of each head passes through
    assert kwargs == {"mrope_section": [4, 6, 6], "rotary_mode": "half"}


def test_mrope_with_1d_positions_is_plain_rope(torch_npu: TorchNpuDouble) -> None:
    obj, positions, query, key = mrope_inputs(three_d=False)
    mrotary_embedding(obj, positions, query, key)
    assert torch_npu.calls[0][2]["mrope_section"] == [0, 0, 0]


def test_mrope_declines_interleaved_sections_before_calling(torch_npu: TorchNpuDouble) -> None:
    obj, positions, query, key = mrope_inputs(three_d=True, interleaved=True)
    with pytest.raises(Unsupported, match="interleaved mrope sections"):
        mrotary_embedding(obj, positions, query, key)
    assert torch_npu.calls == []


def test_mrope_declines_rows_wider_than_sglang_sends(torch_npu: TorchNpuDouble) -> None:
    obj, positions, _, key = mrope_inputs(three_d=False)
    query = torch.zeros(17, 4160, dtype=torch.bfloat16)
    with pytest.raises(Unsupported, match="exceed the 4096"):
        mrotary_embedding(obj, positions, query, key)
    assert torch_npu.calls == []


def test_mrope_declines_sizes_npu_mrope_does_not_align(torch_npu: TorchNpuDouble) -> None:
    obj, positions, query, key = mrope_inputs(three_d=True)
    obj.head_size = obj.rotary_dim = 16  # type: ignore[attr-defined]  # bf16 needs 32
    obj.cos_sin_cache = obj.cos_sin_cache[:, :16]  # type: ignore[attr-defined]
    with pytest.raises(Unsupported, match=r"got head_size 16, rotary_dim 16 in torch\.bfloat16"):
        mrotary_embedding(obj, positions, query, key)
    assert torch_npu.calls == []


# --- MoE -------------------------------------------------------------------------------------


def router(**options: object) -> SimpleNamespace:
    return topk_config(**{"top_k": 4, **options})


def test_topk_plain_softmax_is_the_gating_softmax_operator(torch_npu: TorchNpuDouble) -> None:
    logits = torch.randn(3, 16, dtype=torch.bfloat16)
    weights, ids = topk(router(), logits)
    ((name, args, kwargs),) = torch_npu.calls
    assert name == "npu_moe_gating_top_k_softmax"
    assert args[0] is logits
    assert kwargs == {"finished": None, "k": 4}
    assert (weights.dtype, ids.dtype) == (torch.float32, torch.int32)
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(3))


def test_topk_grouped_with_bias_is_deepseek_style_gating(torch_npu: TorchNpuDouble) -> None:
    bias = torch.randn(16)
    config = router(
        scoring_func="sigmoid",
        use_grouped_topk=True,
        num_expert_group=4,
        topk_group=2,
        correction_bias=bias,
        routed_scaling_factor=2.5,
        apply_routed_scaling_factor_on_output=True,
    )
    topk(config, torch.randn(3, 16, dtype=torch.bfloat16))
    ((name, (x, k), kwargs),) = torch_npu.calls
    assert name == "npu_moe_gating_top_k"
    assert (x.dtype, k) == (torch.float32, 4)
    assert torch.equal(kwargs.pop("bias"), bias)
    assert kwargs == {
        "k_group": 2,
        "group_count": 4,
        "group_select_mode": 1,  # groups ranked by their best two biased scores
        "renorm": 0,
        "norm_type": 1,
        "out_flag": False,
        "routed_scaling_factor": 1.0,  # the adapter divides and scales the weights itself
        "eps": 1e-20,
    }


def test_topk_declines_sigmoid_without_renormalize_before_calling(
    torch_npu: TorchNpuDouble,
) -> None:
    with pytest.raises(Unsupported, match="renormalize=False"):
        topk(router(scoring_func="sigmoid", renormalize=False), torch.randn(2, 8))
    assert torch_npu.calls == []


def test_fused_moe_routes_with_quant_mode_given_explicitly(torch_npu: TorchNpuDouble) -> None:
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    w13 = torch.randn(4, 8, 16, dtype=torch.bfloat16)
    w2 = torch.randn(4, 16, 4, dtype=torch.bfloat16)
    ids = torch.tensor([[0, 1], [2, 3], [1, 2]], dtype=torch.int32)
    out = fused_moe(None, x, w13, w2, torch.full((3, 2), 0.5), ids)
    names = [call[0] for call in torch_npu.calls]
    assert names == [
        "npu_moe_init_routing_v2",
        "npu_grouped_matmul",
        "npu_swiglu",
        "npu_grouped_matmul",
        "npu_moe_finalize_routing",
    ]
    routing = torch_npu.calls[0][2]
    assert routing["quant_mode"] == -1
    assert routing["expert_num"] == 4
    assert routing["active_num"] == 6
    assert torch_npu.calls[1][1][1][0].shape == (4, 16, 8), "weights passed as [experts, in, out]"
    assert (out.shape, out.dtype) == ((3, 16), torch.bfloat16)


def test_fused_moe_declines_gelu_before_calling(torch_npu: TorchNpuDouble) -> None:
    x = torch.randn(2, 16)
    with pytest.raises(Unsupported, match="silu only"):
        fused_moe(
            None,
            x,
            torch.randn(2, 8, 16),
            torch.randn(2, 16, 4),
            torch.ones(2, 1),
            torch.zeros(2, 1, dtype=torch.int32),
            "gelu",
        )
    assert torch_npu.calls == []


def test_topk_and_fused_moe_pack_strided_inputs(torch_npu: TorchNpuDouble) -> None:
    logits = torch.randn(3, 32, dtype=torch.bfloat16)[:, ::2]
    topk(router(), logits)
    x = torch.randn(3, 32, dtype=torch.bfloat16)[:, ::2]
    ids = torch.tensor([[0, 1], [2, 3], [1, 2]], dtype=torch.int32)
    w13 = torch.randn(4, 8, 16, dtype=torch.bfloat16)
    fused_moe(None, x, w13, torch.randn(4, 16, 4, dtype=torch.bfloat16), torch.ones(3, 2), ids)
    gating_call, routing_call = torch_npu.calls[0], torch_npu.calls[1]
    assert (gating_call.name, routing_call.name) == (
        "npu_moe_gating_top_k_softmax",
        "npu_moe_init_routing_v2",
    )
    for call, given in ((gating_call, logits), (routing_call, x)):
        assert call.args[0].is_contiguous()
        assert torch.equal(call.args[0], given)


# --- what the operators of a release or SoC take ------------------------------------------


def grouped_router(experts_per_group: int, groups: int, **options: object) -> SimpleNamespace:
    return router(
        scoring_func="sigmoid",
        use_grouped_topk=True,
        num_expert_group=groups,
        topk_group=2,
        correction_bias=torch.randn(experts_per_group * groups),
        **options,
    )


def test_topk_declines_groups_of_two_experts_before_calling(torch_npu: TorchNpuDouble) -> None:
    """npu_moe_gating_top_k needs more than 2 experts per group: 8 in 4 groups is declined."""
    with pytest.raises(Unsupported, match="groups of more than 2; got 8 experts in 4 groups"):
        topk(grouped_router(2, 4, top_k=2), torch.randn(3, 8))
    assert torch_npu.calls == []


def test_topk_declines_groups_that_pad_past_2048_experts(torch_npu: TorchNpuDouble) -> None:
    """62 groups of 33 experts pad to 62 * 64 = 3968 > 2048 (the operator aligns each to 32)."""
    with pytest.raises(Unsupported, match=r"align32\(experts / groups\) \* groups <= 2048"):
        topk(grouped_router(33, 62, top_k=2), torch.randn(3, 33 * 62))
    assert torch_npu.calls == []


def test_topk_renormalises_softmax_gating_itself(torch_npu: TorchNpuDouble) -> None:
    """The double divides sigmoid weights only (the page's equivalent code): softmax weights
    come back undivided, and the adapter divides (and scales) them itself."""
    config = router(
        use_grouped_topk=True,
        num_expert_group=4,
        topk_group=2,
        routed_scaling_factor=2.0,
        apply_routed_scaling_factor_on_output=True,
    )
    weights, _ = topk(config, torch.randn(3, 16))
    torch.testing.assert_close(weights.sum(dim=-1), torch.full((3,), 2.0))


def test_topk_declines_k_over_1024_for_the_gating_softmax(torch_npu: TorchNpuDouble) -> None:
    with pytest.raises(Unsupported, match="k <= 1024"):
        topk(router(top_k=1025), torch.randn(2, 2048))
    assert torch_npu.calls == []


@pytest.fixture
def older_torch_npu(monkeypatch: pytest.MonkeyPatch) -> TorchNpuDouble:
    """torch_npu 2.6.0 (an Ascend Extension for PyTorch 7.1.0 build)."""
    return install_double(monkeypatch, TorchNpuDouble(version="2.6.0"), TORCH_NPU)


def test_older_torch_npu_gating_serves_deepseek_routing_only(
    older_torch_npu: TorchNpuDouble,
) -> None:
    with pytest.raises(Unsupported, match=r"torch_npu 2\.6\.0 .*takes only 256 experts"):
        topk(grouped_router(4, 4, top_k=4), torch.randn(3, 16))
    with pytest.raises(Unsupported, match="takes only 256 experts"):
        topk(router(scoring_func="sigmoid"), torch.randn(3, 16))  # ungrouped: 1 group
    assert older_torch_npu.calls == []
    deepseek = router(
        top_k=8,
        scoring_func="sigmoid",
        use_grouped_topk=True,
        num_expert_group=8,
        topk_group=4,
        correction_bias=torch.randn(256),
    )
    weights, ids = topk(deepseek, torch.randn(3, 256))
    assert older_torch_npu.called == ["npu_moe_gating_top_k"]
    assert (weights.shape, ids.shape) == ((3, 8), (3, 8))


def test_the_platform_is_read_from_torch_npu(torch_npu: TorchNpuDouble) -> None:
    found = backend.platform()
    assert (found.torch_npu_version, found.soc_version, found.soc) == (
        torch_npu.__version__,
        220,
        backend.AscendSoc.A2,
    )
    assert found.general_gating
    assert found.bf16_gelu
    assert found.store_differing_head_dims  # 2.7.1: a CANN 8.0.RC3+ pairing
    assert not found.fia_decode  # ASCEND_USE_FIA unset: PagedAttention first, as SGLang


@pytest.mark.parametrize(("value", "first"), [("1", True), ("True", True), ("0", False)])
def test_ascend_use_fia_is_read_as_sglang_reads_it(
    monkeypatch: pytest.MonkeyPatch, value: str, first: bool
) -> None:
    monkeypatch.setenv("ASCEND_USE_FIA", value)
    install_double(monkeypatch, TorchNpuDouble(), TORCH_NPU)
    assert backend.platform().fia_decode is first


@pytest.fixture
def inference_soc(monkeypatch: pytest.MonkeyPatch) -> TorchNpuDouble:
    """An Atlas 300I (310P, SoC 200): no bfloat16 GELUs."""
    return install_double(monkeypatch, TorchNpuDouble(soc_version=200), TORCH_NPU)


def test_bf16_gelus_are_declined_off_a2_and_a3(inference_soc: TorchNpuDouble) -> None:
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    for call, operator in (
        (lambda: gelu_and_mul(SimpleNamespace(approximate="tanh"), x), "npu_geglu"),
        (lambda: gelu_new(None, x), "npu_gelu"),
        (lambda: gelu_quick(None, x), "npu_fast_gelu"),
    ):
        with pytest.raises(Unsupported, match=f"{operator} takes bfloat16 on Atlas A2/A3 only"):
            call()
    assert inference_soc.calls == []
    gelu_new(None, x.half())  # float16 is served on every SoC
    assert inference_soc.called == ["npu_gelu"]


def test_fused_moe_with_one_expert_uses_the_cumulative_group_list(
    torch_npu: TorchNpuDouble,
) -> None:
    """A count-form group list of length 1 is refused by npu_grouped_matmul: cumsum is not."""
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    w13 = torch.randn(1, 8, 16, dtype=torch.bfloat16)
    w2 = torch.randn(1, 16, 4, dtype=torch.bfloat16)
    out = fused_moe(None, x, w13, w2, torch.ones(3, 1), torch.zeros(3, 1, dtype=torch.int32))
    assert out.shape == (3, 16)
    routing, gate_up = torch_npu.calls[0], torch_npu.calls[1]
    assert routing.kwargs["expert_tokens_num_type"] == 0
    assert gate_up.kwargs["group_list_type"] == 0
    assert gate_up.kwargs["group_list"].tolist() == [3]


def test_layer_norm_is_npu_layer_norm_eval_in_the_compute_dtype(torch_npu: TorchNpuDouble) -> None:
    weight, bias = torch.rand(16), torch.rand(16)
    obj = SimpleNamespace(
        hidden_size=16,
        variance_epsilon=1e-6,
        elementwise_affine=True,
        use_bias=False,
        dtype=torch.float32,
        weight=weight,
        bias=bias,
    )
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    out = layer_norm(obj, x)
    ((name, (kernel_x, shape), kwargs),) = torch_npu.calls
    assert name == "npu_layer_norm_eval"
    assert (kernel_x.dtype, shape) == (torch.float32, [16])
    assert kwargs["weight"] is weight
    assert kwargs["bias"] is None  # use_bias=False
    assert kwargs["eps"] == 1e-6
    assert (out.shape, out.dtype) == ((3, 16), torch.bfloat16)
