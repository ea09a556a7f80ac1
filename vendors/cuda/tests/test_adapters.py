"""The sgl_kernel adapters against the ``sgl_kernel`` test double (no GPU, no real SDK).

Each adapter runs every case and dtype of its op contract (empty batches and strided inputs
included) through core's conformance check (values vs the reference, untouched inputs,
in-place outputs) against a double that rejects what the real kernels reject; then the tests
below pin the kernel calls themselves: argument order, dtypes, which tensors are written in
place, and what is declined or never launched.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from types import SimpleNamespace

import pytest
import torch
from sgl_kernel_double import SglangTritonMoeDouble, SglKernelDouble
from sglang_fl_cuda import plugin
from sglang_fl_cuda.impl.activation import gelu_and_mul, silu_and_mul
from sglang_fl_cuda.impl.attention import NO_KERNEL as ATTENTION_NO_KERNEL
from sglang_fl_cuda.impl.attention import decode_attention, extend_attention
from sglang_fl_cuda.impl.causal_conv import ADAPTERS as CAUSAL_CONV
from sglang_fl_cuda.impl.collectives import COLLECTIVES, LEFT_TO_SGLANG
from sglang_fl_cuda.impl.linear_attention import ADAPTERS as LINEAR_ATTENTION
from sglang_fl_cuda.impl.linear_attention import NO_KERNEL as LINEAR_ATTENTION_NO_KERNEL
from sglang_fl_cuda.impl.moe import fused_moe, topk
from sglang_fl_cuda.impl.normalization import gemma_rms_norm, rms_norm
from sglang_fl_cuda.impl.rotary import rotary_embedding

from sglang_fl import Unsupported
from sglang_fl.dispatch.types import BackendImplKind
from sglang_fl.ops import STANDARD_OPS, OpCase
from sglang_fl.testing.checks import PASSED, SKIPPED, check_case
from sglang_fl.testing.vendor import VendorSuite, topk_config

SUITE = VendorSuite("cuda", plugin.sglang_fl_register_ops)
REGISTRY, IMPLS = SUITE.registry, SUITE.implementations
# The attention adapters call FlashAttention-3, not sgl_kernel's top-level kernels: their cases
# run in test_attention.py against that double; the GDN adapters call SGLang's Triton kernels:
# test_linear_attention.py; the causal convs sgl_kernel.mamba: test_causal_conv.py.
ATTENTION = {"decode_attention", "extend_attention"}
ELSEWHERE = {*ATTENTION, *LINEAR_ATTENTION, *CAUSAL_CONV}
CASES = [param for param in SUITE.contract_cases() if param.values[0] not in ELSEWHERE]


# The ops sgl_kernel has no kernel for (SGLang's own CUDA paths for them are forward_native,
# Triton, JIT or FlashInfer kernels, or a ROCm-only sgl_kernel build): nothing is registered.
WITHOUT_KERNEL = {
    "gelu_new",
    "gelu_quick",
    "layer_norm",
    "mrotary_embedding",
    "clamp_position",
    "fused_gate_sigmoid_mul",
    *ATTENTION_NO_KERNEL,  # sgl_kernel has no KV store kernel (SGLang's JIT one stays)
    *LINEAR_ATTENTION_NO_KERNEL,  # no adapter yet: SGLang's own Triton GDN kernels stay
    *LEFT_TO_SGLANG,  # SGLang's own CUDA communicators stay (test_collectives.py)
}


def test_ops_without_a_kernel_are_declared_with_a_reason() -> None:
    declared = {op: REGISTRY.no_kernel(op) for op in STANDARD_OPS if REGISTRY.no_kernel(op)}
    assert set(declared) == WITHOUT_KERNEL
    assert all(len(gaps) == 1 and gaps[0].reason for gaps in declared.values())
    assert "ROCm" in REGISTRY.no_kernel("gelu_quick")[0].reason


def declined(op: str, case_params: Mapping[str, object], dtype: torch.dtype) -> bool:
    """The calls the adapters hand back with Unsupported: sgl_kernel.rmsnorm and the FlashInfer
    Gemma norms have no fp32 path (an empty batch needs no kernel, so it is served); sgl_kernel
    0.4.x has no grouped top-k, and its router kernels are not used with a bias; SGLang's Triton
    fused MoE would multiply float32 in TF32."""
    if op == "fused_moe":
        return dtype == torch.float32
    if op in ("silu_and_mul", "gelu_and_mul"):
        # each half row must be whole 16-byte vectors (FlashInfer's act_and_mul_kernel)
        return int(case_params["d"]) * dtype.itemsize % 16 != 0
    if op == "topk":
        return bool(case_params["grouped"] or case_params["bias"])
    if dtype != torch.float32 or case_params["tokens"] == 0:
        return False
    return op == "gemma_rms_norm" or (op == "rms_norm" and not case_params["residual"])


def test_registers_every_op_sgl_kernel_has_as_the_adapter_itself() -> None:
    assert {op: impl.fn for op, impl in IMPLS.items()} == {
        "silu_and_mul": silu_and_mul,
        "rms_norm": rms_norm,
        "rotary_embedding": rotary_embedding,
        "gelu_and_mul": gelu_and_mul,
        "gemma_rms_norm": gemma_rms_norm,
        "topk": topk,
        "fused_moe": fused_moe,
        "decode_attention": decode_attention,
        "extend_attention": extend_attention,
        **COLLECTIVES,
        **LINEAR_ATTENTION,
        **CAUSAL_CONV,
    }
    assert set(STANDARD_OPS) - set(IMPLS) == WITHOUT_KERNEL
    for impl in IMPLS.values():
        assert impl.kind is BackendImplKind.VENDOR
        assert (impl.vendor, impl.impl_id) == ("cuda", "vendor.cuda")


@pytest.mark.parametrize(("op", "case", "dtype"), CASES)
def test_contract_case(
    sgl_kernel: SglKernelDouble,
    sglang_triton_moe: SglangTritonMoeDouble,
    op: str,
    case: OpCase,
    dtype: torch.dtype,
) -> None:
    outcome = check_case(IMPLS[op], case, dtype)
    expected = SKIPPED if declined(op, case.params, dtype) else PASSED
    assert outcome.status == expected, outcome.message
    # No kernel launch for a declined call, nor for an empty batch (it would fail).
    kernel_calls = sgl_kernel.calls or sglang_triton_moe.calls
    assert bool(kernel_calls) is (expected == PASSED and case.params["tokens"] > 0), kernel_calls


def rows(tokens: int, width: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(tokens, width, generator=torch.Generator().manual_seed(0)).to(dtype)


def test_silu_and_mul_passes_input_then_output(sgl_kernel: SglKernelDouble) -> None:
    x = rows(3, 64)
    out = silu_and_mul(None, x)
    ((name, (kernel_in, kernel_out), _),) = sgl_kernel.calls
    assert name == "silu_and_mul"
    assert kernel_in is x
    assert kernel_out is out
    assert out.shape == (3, 32)
    assert out.dtype == torch.bfloat16


def test_silu_and_mul_packs_a_strided_input(sgl_kernel: SglKernelDouble) -> None:
    x = rows(3, 128)[:, ::2]
    silu_and_mul(None, x)
    ((_, (kernel_in, _), _),) = sgl_kernel.calls
    assert kernel_in.is_contiguous()
    assert torch.equal(kernel_in, x)


def test_silu_and_mul_declines_unaligned_rows_before_calling(sgl_kernel: SglKernelDouble) -> None:
    with pytest.raises(Unsupported, match="multiple of 16 bytes"):
        silu_and_mul(None, rows(2, 6, torch.float16))  # 12 bytes per row
    assert sgl_kernel.calls == []


@pytest.mark.parametrize(
    ("d", "dtype"),
    [(4, torch.float16), (12, torch.bfloat16), (20, torch.float16), (2, torch.float32)],
)
def test_act_and_mul_declines_half_rows_the_kernel_cannot_vector_load(
    sgl_kernel: SglKernelDouble, d: int, dtype: torch.dtype
) -> None:
    """The whole row (2d) passes the wrapper's 16-byte check, the half row d does not."""
    assert 2 * d * dtype.itemsize % 16 == 0
    with pytest.raises(Unsupported, match=f"half row .*d={d}"):
        silu_and_mul(None, rows(3, 2 * d, dtype))
    with pytest.raises(Unsupported, match=f"half row .*d={d}"):
        gelu_and_mul(SimpleNamespace(approximate="none"), rows(3, 2 * d, dtype))
    assert sgl_kernel.calls == []


def norm_layer(hidden: int, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.rand(hidden).to(dtype))
    layer.variance_epsilon = 1e-5
    return layer


def test_rms_norm_calls_rmsnorm_with_weight_data_and_epsilon(sgl_kernel: SglKernelDouble) -> None:
    layer, x = norm_layer(16), rows(4, 16)
    out = rms_norm(layer, x)
    ((name, (kernel_x, weight, eps, kernel_out), _),) = sgl_kernel.calls
    assert name == "rmsnorm"
    assert kernel_x is x
    assert kernel_out is None  # the kernel allocates the output
    assert not isinstance(weight, torch.nn.Parameter)
    assert torch.equal(weight, layer.weight)
    assert eps == 1e-5
    assert isinstance(out, torch.Tensor)
    assert out is not x


def test_rms_norm_with_residual_is_fused_in_place(sgl_kernel: SglKernelDouble) -> None:
    layer, x, residual = norm_layer(16), rows(4, 16), rows(4, 16) * 2
    total = x.float() + residual.float()
    out, new_residual = rms_norm(layer, x, residual)
    ((name, (kernel_x, kernel_residual, _, eps), _),) = sgl_kernel.calls
    assert name == "fused_add_rmsnorm"
    assert kernel_x is x
    assert kernel_residual is residual
    assert eps == 1e-5
    assert out is x
    assert new_residual is residual
    torch.testing.assert_close(new_residual, total.to(torch.bfloat16))


@pytest.mark.parametrize(
    ("weight_dtype", "shape", "message"),
    [
        (torch.float32, (4, 16), "weight dtype"),
        (torch.bfloat16, (2, 2, 16), r"\[num_tokens, hidden\]"),
    ],
)
def test_rms_norm_declines_before_writing(
    sgl_kernel: SglKernelDouble, weight_dtype: torch.dtype, shape: tuple[int, ...], message: str
) -> None:
    x = torch.randn(shape).to(torch.bfloat16)
    residual = torch.randn(shape).to(torch.bfloat16)
    before = (x.clone(), residual.clone())
    with pytest.raises(Unsupported, match=message):
        rms_norm(norm_layer(16, weight_dtype), x, residual)
    assert sgl_kernel.calls == []
    assert torch.equal(x, before[0])
    assert torch.equal(residual, before[1])


def rope_inputs(
    dtype: torch.dtype = torch.float16, head_size: int = 64, rotary_dim: int = 32
) -> tuple[object, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    contract = STANDARD_OPS["rotary_embedding"]
    case = next(
        c
        for c in contract.cases
        if c.params["head_size"] == head_size
        and c.params["rotary_dim"] == rotary_dim
        and c.params["q_heads"] == 4
        and c.params["inplace"]
    )
    inputs = contract.make_inputs(
        case, dtype, torch.device("cpu"), torch.Generator().manual_seed(1)
    )
    return (inputs.obj, *inputs.args)  # type: ignore[return-value]


def test_rotary_rotates_partial_views_where_they_lie(sgl_kernel: SglKernelDouble) -> None:
    obj, query, key, cos, sin, positions = rope_inputs()
    assert not query.is_contiguous()  # [tokens, heads, 32] view of [tokens, heads, 64]
    q_out, k_out = rotary_embedding(obj, query, key, cos, sin, positions, False, True)
    ((name, args, _),) = sgl_kernel.calls
    kernel_positions, kernel_q, kernel_k, head_size, cache, is_neox = args
    assert name == "rotary_embedding"
    assert kernel_q is query
    assert kernel_k is key
    assert q_out is query
    assert k_out is key
    assert kernel_positions is positions
    assert head_size == 32
    assert is_neox is True
    assert cache.shape == (cos.shape[0], 32)
    assert cache.dtype == torch.float16
    torch.testing.assert_close(cache, torch.cat((cos, sin), dim=-1), rtol=0, atol=0)


def test_rotary_joins_cos_and_sin_once_per_pair(sgl_kernel: SglKernelDouble) -> None:
    obj, query, key, cos, sin, positions = rope_inputs()
    rotary_embedding(obj, query, key, cos, sin, positions, True, True)
    rotary_embedding(obj, query, key, cos, sin, positions, True, True)
    first, second = (call[1][4] for call in sgl_kernel.calls)
    assert first is second
    assert sgl_kernel.calls[0][1][5] is False  # interleaved = GPT-J style = not neox
    rotary_embedding(obj, query, key, cos.clone(), sin, positions, True, True)
    assert sgl_kernel.calls[2][1][4] is not first


def test_rotary_out_of_place_leaves_inputs_untouched(sgl_kernel: SglKernelDouble) -> None:
    obj, query, key, cos, sin, positions = rope_inputs()
    before = (query.clone(), key.clone())
    q_out, k_out = rotary_embedding(obj, query, key, cos, sin, positions, False, False)
    assert torch.equal(query, before[0])
    assert torch.equal(key, before[1])
    assert q_out.data_ptr() != query.data_ptr()
    assert k_out.data_ptr() != key.data_ptr()
    assert not torch.equal(q_out, before[0])


def test_rotary_int32_positions_become_int64(sgl_kernel: SglKernelDouble) -> None:
    obj, query, key, cos, sin, positions = rope_inputs()
    rotary_embedding(obj, query, key, cos, sin, positions.int(), False, True)
    kernel_positions = sgl_kernel.calls[0][1][0]
    assert kernel_positions.dtype == torch.int64
    assert torch.equal(kernel_positions, positions)


def test_rotary_with_different_head_strides_goes_through_copies(
    sgl_kernel: SglKernelDouble,
) -> None:
    obj, query, key, cos, sin, positions = rope_inputs()
    key = key.contiguous()  # head stride 32, query's is 64: the kernel would misaddress key
    expected = STANDARD_OPS["rotary_embedding"].reference(
        obj, query.clone(), key.clone(), cos, sin, positions, False, False
    )
    q_out, k_out = rotary_embedding(obj, query, key, cos, sin, positions, False, True)
    assert q_out is query
    assert k_out is key
    kernel_q = sgl_kernel.calls[0][1][1]
    assert kernel_q is not query
    assert kernel_q.is_contiguous()
    torch.testing.assert_close(q_out, expected[0])
    torch.testing.assert_close(k_out, expected[1])


def test_rotary_declines_heads_the_kernel_cannot_group(sgl_kernel: SglKernelDouble) -> None:
    obj, query, key, cos, sin, positions = rope_inputs()
    three_kv_heads = torch.zeros(key.shape[0], 3, key.shape[-1], dtype=key.dtype)
    before = query.clone()
    with pytest.raises(Unsupported, match="num_heads divisible by num_kv_heads; got 4 and 3"):
        rotary_embedding(obj, query, three_kv_heads, cos, sin, positions, False, True)
    assert sgl_kernel.calls == []
    assert torch.equal(query, before)


def test_rms_norm_packs_a_strided_weight(sgl_kernel: SglKernelDouble) -> None:
    layer = norm_layer(16)
    layer.weight = torch.nn.Parameter(torch.rand(32).to(torch.bfloat16)[::2])
    rms_norm(layer, rows(4, 16), rows(4, 16))
    ((_, (_, _, weight, _), _),) = sgl_kernel.calls
    assert weight.is_contiguous()
    assert torch.equal(weight, layer.weight)


# --- gelu_and_mul ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("approximate", "kernel"), [("none", "gelu_and_mul"), ("tanh", "gelu_tanh_and_mul")]
)
def test_gelu_and_mul_picks_the_kernel_of_the_layer_approximation(
    sgl_kernel: SglKernelDouble, approximate: str, kernel: str
) -> None:
    x = rows(3, 64)
    out = gelu_and_mul(SimpleNamespace(approximate=approximate), x)
    ((name, (kernel_in, kernel_out), _),) = sgl_kernel.calls
    assert name == kernel
    assert kernel_in is x
    assert kernel_out is out
    assert out.shape == (3, 32)


def test_gelu_and_mul_rejects_an_unknown_approximation(sgl_kernel: SglKernelDouble) -> None:
    with pytest.raises(ValueError, match="'sigmoid'; allowed: 'none', 'tanh'"):
        gelu_and_mul(SimpleNamespace(approximate="sigmoid"), rows(3, 64))
    assert sgl_kernel.calls == []


def test_gelu_and_mul_declines_unaligned_rows_before_calling(sgl_kernel: SglKernelDouble) -> None:
    with pytest.raises(Unsupported, match=r"sgl_kernel\.gelu_tanh_and_mul needs each half row"):
        gelu_and_mul(SimpleNamespace(approximate="tanh"), rows(2, 6, torch.float16))
    assert sgl_kernel.calls == []


def test_empty_batches_launch_no_kernel(sgl_kernel: SglKernelDouble) -> None:
    out = gelu_and_mul(SimpleNamespace(approximate="tanh"), rows(0, 64))
    assert out.shape == (0, 32)
    norm_out = gemma_rms_norm(norm_layer(16), rows(0, 16))
    assert norm_out.shape == (0, 16)
    assert sgl_kernel.calls == []


# --- gemma_rms_norm --------------------------------------------------------------------------


def test_gemma_rms_norm_passes_the_raw_weight(sgl_kernel: SglKernelDouble) -> None:
    """The kernel adds the 1 itself: the adapter hands it the checkpoint's offset as is."""
    layer, x = norm_layer(16), rows(4, 16)
    gemma_rms_norm(layer, x)
    ((name, (kernel_x, weight, eps, _), _),) = sgl_kernel.calls
    assert name == "gemma_rmsnorm"
    assert kernel_x is x
    assert torch.equal(weight, layer.weight)
    assert eps == 1e-5


def test_gemma_rms_norm_with_residual_is_fused_in_place(sgl_kernel: SglKernelDouble) -> None:
    layer, x, residual = norm_layer(16), rows(4, 16), rows(4, 16) * 2
    total = (x.float() + residual.float()).to(torch.bfloat16)
    out, new_residual = gemma_rms_norm(layer, x, residual)
    ((name, (kernel_x, kernel_residual, _, _), _),) = sgl_kernel.calls
    assert name == "gemma_fused_add_rmsnorm"
    assert kernel_x is x
    assert kernel_residual is residual
    assert out is x
    assert new_residual is residual
    torch.testing.assert_close(new_residual, total)


def test_gemma_rms_norm_declines_float32_before_writing(sgl_kernel: SglKernelDouble) -> None:
    x, residual = rows(4, 16, torch.float32), rows(4, 16, torch.float32)
    before = (x.clone(), residual.clone())
    with pytest.raises(Unsupported, match=r"Gemma norms have no torch\.float32 kernel"):
        gemma_rms_norm(norm_layer(16, torch.float32), x, residual)
    assert sgl_kernel.calls == []
    assert torch.equal(x, before[0])
    assert torch.equal(residual, before[1])


# --- MoE -------------------------------------------------------------------------------------


def router(**options: object) -> SimpleNamespace:
    return topk_config(**{"top_k": 2, **options})


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_topk_writes_float32_weights_and_int32_ids(
    sgl_kernel: SglKernelDouble, scoring: str
) -> None:
    logits = rows(5, 8)
    weights, ids = topk(router(scoring_func=scoring, renormalize=False), logits)
    ((name, (kernel_weights, kernel_ids, kernel_logits, renormalize), _),) = sgl_kernel.calls
    assert name == f"topk_{scoring}"
    assert kernel_weights is weights
    assert kernel_ids is ids
    assert kernel_logits is logits
    assert renormalize is False
    assert (weights.dtype, ids.dtype, ids.shape) == (torch.float32, torch.int32, (5, 2))


def test_topk_applies_the_routed_scaling_factor_when_asked(sgl_kernel: SglKernelDouble) -> None:
    logits = rows(3, 8)
    plain, _ = topk(router(), logits)
    scaled, _ = topk(
        router(routed_scaling_factor=2.5, apply_routed_scaling_factor_on_output=True), logits
    )
    torch.testing.assert_close(scaled, plain * 2.5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"use_grouped_topk": True, "num_expert_group": 4, "topk_group": 2}, "grouped"),
        ({"correction_bias": torch.zeros(8)}, "correction bias"),
    ],
)
def test_topk_declines_before_calling(
    sgl_kernel: SglKernelDouble, options: dict[str, object], message: str
) -> None:
    with pytest.raises(Unsupported, match=message):
        topk(router(**options), rows(3, 8))
    assert sgl_kernel.calls == []


def test_fused_moe_calls_sglang_outplace_fused_experts(
    sgl_kernel: SglKernelDouble, sglang_triton_moe: SglangTritonMoeDouble
) -> None:
    x, w13, w2 = rows(3, 16), rows(4 * 8, 16).view(4, 8, 16), rows(4 * 16, 4).view(4, 16, 4)
    weights = torch.full((3, 2), 0.5)
    ids = torch.tensor([[0, 1], [2, 3], [1, 2]], dtype=torch.int32)
    out = fused_moe(None, x, w13, w2, weights, ids, "gelu")  # the contract's gelu: tanh
    ((name, (kernel_x, kernel_w13, kernel_w2, kernel_weights, kernel_ids), options),) = (
        sglang_triton_moe.calls
    )
    assert name == "outplace_fused_experts"
    for passed, given in zip(
        (kernel_x, kernel_w13, kernel_w2, kernel_weights, kernel_ids),
        (x, w13, w2, weights, ids),
        strict=True,
    ):
        assert passed is given
    # SGLang's Triton path names tanh-GELU "gelu_tanh" (its "gelu" is erf-GELU).
    assert options == {"activation": "gelu_tanh", "is_gated": True}
    assert out.shape == (3, 16)
    assert out.dtype == torch.bfloat16


def test_fused_moe_declines_outside_an_sglang_worker(
    sgl_kernel: SglKernelDouble, sglang_triton_moe: SglangTritonMoeDouble
) -> None:
    """No SGLang runtime context (the kit, the hardware script, vLLM): a clean decline."""
    sglang_triton_moe.published = False
    x, w13, w2 = rows(3, 16), rows(4 * 8, 16).view(4, 8, 16), rows(4 * 16, 4).view(4, 16, 4)
    ids = torch.tensor([[0, 1], [2, 3], [1, 2]], dtype=torch.int32)
    with pytest.raises(
        Unsupported, match=r"only inside an SGLang worker.*'tp_group' has not been written"
    ):
        fused_moe(None, x, w13, w2, torch.full((3, 2), 0.5), ids)
    assert sglang_triton_moe.calls == []


def test_fused_moe_declines_when_sglang_is_missing(
    sgl_kernel: SglKernelDouble, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sglang_fl_cuda.impl.moe import SGLANG_FUSED_MOE

    monkeypatch.setitem(sys.modules, SGLANG_FUSED_MOE, None)  # import raises ImportError
    x = rows(2, 16)
    with pytest.raises(Unsupported, match="cannot be imported"):
        fused_moe(
            None,
            x,
            rows(32, 16).view(2, 16, 16),
            rows(32, 8).view(2, 16, 8),
            torch.ones(2, 1),
            torch.zeros(2, 1, dtype=torch.int32),
        )


def test_topk_declines_when_sgl_kernel_lacks_the_kernel(
    sgl_kernel: SglKernelDouble, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sgl_kernel, "topk_sigmoid", None)  # an sgl_kernel without it
    with pytest.raises(Unsupported, match="has no topk_sigmoid"):
        topk(router(scoring_func="sigmoid"), rows(3, 8))
    assert sgl_kernel.calls == []


def test_topk_packs_strided_logits(sgl_kernel: SglKernelDouble) -> None:
    logits = rows(3, 16)[:, ::2]
    topk(router(), logits)
    ((_, (_, _, kernel_logits, _), _),) = sgl_kernel.calls
    assert kernel_logits.is_contiguous()
    assert torch.equal(kernel_logits, logits)
