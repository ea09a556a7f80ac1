"""The ``sgl_kernel`` double rejects what the real kernels reject, one constraint at a time.

Each documented constraint of the double (see its source in ``sgl_kernel_double.py``) gets a
call that is valid except for that one constraint: the double must refuse it, naming that
constraint. The valid calls themselves must pass, so every refusal is specific, and every
constraint the double declares must have its rejecting call here.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from sgl_kernel_double import SglangTritonMoeDouble, SglKernelDouble

from sglang_fl.testing.doubles import Constraint, constraint_tests

D = SglKernelDouble
Call = Callable[[SglKernelDouble], object]


def t(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


def silu(x: torch.Tensor, out: torch.Tensor | None = None) -> Call:
    return lambda sdk: sdk.silu_and_mul(x, out)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor) -> Call:
    return lambda sdk: sdk.rmsnorm(x, weight, 1e-6)


def fused(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> Call:
    return lambda sdk: sdk.fused_add_rmsnorm(x, residual, weight, 1e-6)


def rope(
    positions: torch.Tensor | None = None,
    query: torch.Tensor | None = None,
    key: torch.Tensor | None = None,
    cache: torch.Tensor | None = None,
) -> Call:
    """A valid rope call (4 tokens, 4 q heads, 2 kv heads, head size 32) with parts replaced."""
    positions = torch.tensor([0, 3, 1, 2]) if positions is None else positions
    query = t(4, 4, 32) if query is None else query
    key = t(4, 2, 32) if key is None else key
    cache = t(8, 32) if cache is None else cache
    return lambda sdk: sdk.rotary_embedding(positions, query, key, 32, cache, True)


def router(
    logits: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    ids: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    kernel: str = "topk_softmax",
) -> Call:
    """A valid router call (3 tokens, 8 experts, top 2) with parts replaced."""
    logits = t(3, 8) if logits is None else logits
    tokens = logits.shape[0]
    weights = torch.empty(tokens, 2) if weights is None else weights
    ids = torch.empty(tokens, 2, dtype=torch.int32) if ids is None else ids
    return lambda sdk: getattr(sdk, kernel)(weights, ids, logits, True, correction_bias=bias)


VALID: list[Call] = [
    router(),
    router(kernel="topk_sigmoid", bias=torch.zeros(8)),
    router(logits=t(3, 8, dtype=torch.float32)),
    silu(t(3, 16)),
    silu(t(3, 16), torch.empty(3, 8, dtype=torch.float16)),
    rmsnorm(t(3, 16), t(16)),
    fused(t(3, 16), t(3, 16), t(16)),
    fused(t(3, 16, dtype=torch.float32), t(3, 16, dtype=torch.float32), t(16, dtype=torch.float32)),
    rope(),
]

REJECTED: dict[Constraint, Call] = {
    D.SILU_ROW_BYTES: silu(t(3, 6)),  # 12 bytes per row
    D.SILU_OUT_SHAPE: silu(t(3, 16), torch.empty(3, 16, dtype=torch.float16)),
    D.SILU_DTYPE: silu(t(3, 16), torch.empty(3, 8, dtype=torch.bfloat16)),
    D.SILU_CONTIGUOUS: silu(t(3, 32)[:, ::2]),
    D.SILU_ALIGNED: silu(t(1, 24).flatten()[4:20].view(1, 16)),  # starts 8 bytes in
    D.SILU_TOKENS: silu(t(0, 16)),
    D.NORM_SHAPES: rmsnorm(t(2, 3, 16), t(16)),
    D.NORM_CONTIGUOUS: fused(t(3, 16), t(3, 16), t(32)[::2]),  # a strided weight
    D.NORM_DTYPE: rmsnorm(t(3, 16), t(16, dtype=torch.float32)),
    D.RMSNORM_HALF: rmsnorm(t(3, 16, dtype=torch.float32), t(16, dtype=torch.float32)),
    D.FUSED_ADD_DTYPE: fused(
        t(3, 16, dtype=torch.float64), t(3, 16, dtype=torch.float64), t(16, dtype=torch.float64)
    ),
    D.NORM_TOKENS: fused(t(0, 16), t(0, 16), t(16)),
    D.ROPE_POSITIONS: rope(positions=torch.tensor([0, 3, 1, 2], dtype=torch.int32)),
    D.ROPE_TOKENS_MATCH: rope(key=t(3, 2, 32)),
    D.ROPE_HEAD_SIZE: rope(query=t(4, 3, 16)),  # 48 values per token, head size 32
    D.ROPE_GQA: rope(key=t(4, 3, 32)),
    D.ROPE_DTYPE: rope(cache=t(8, 32, dtype=torch.float32)),
    D.ROPE_LAYOUT: rope(key=t(4, 2, 64)[..., :32]),  # head stride 64, query's is 32
    D.TOPK_OUTPUTS: router(weights=torch.empty(3, 2, dtype=torch.float16)),
    D.TOPK_GATING: router(logits=t(3, 8, dtype=torch.float64)),
    D.TOPK_CONTIGUOUS: router(logits=t(3, 16)[:, ::2]),
    D.TOPK_BIAS: router(kernel="topk_sigmoid", bias=torch.zeros(8, dtype=torch.float16)),
    D.TOPK_TOKENS: router(logits=t(0, 8)),
    D.ROPE_NOT_EMPTY: rope(
        positions=torch.empty(0, dtype=torch.int64), query=t(0, 4, 32), key=t(0, 2, 32)
    ),
}


test_valid_calls_pass, test_rejects_what_the_sdk_rejects, test_every_constraint_is_covered = (
    constraint_tests(SglKernelDouble, VALID, REJECTED)
)


M = SglangTritonMoeDouble
MoeCall = Callable[[SglangTritonMoeDouble], object]


def experts(
    x: torch.Tensor | None = None,
    w13: torch.Tensor | None = None,
    topk_weights: torch.Tensor | None = None,
) -> MoeCall:
    """A valid fused-experts call (3 tokens, hidden 16, 4 experts, inter 8, top 2)."""
    x = t(3, 16) if x is None else x
    w13 = t(4, 16, 16) if w13 is None else w13
    w2 = t(4, 16, 8)
    ids = torch.tensor([[0, 1], [2, 3], [1, 2]], dtype=torch.int32)
    topk_weights = torch.full((3, 2), 0.5) if topk_weights is None else topk_weights
    return lambda sdk: sdk.outplace_fused_experts(x, w13, w2, topk_weights, ids)


MOE_VALID: list[MoeCall] = [experts()]

MOE_REJECTED: dict[Constraint, MoeCall] = {
    M.FUSED_HIDDEN: experts(x=t(3, 32)),
    M.FUSED_TOPK: experts(topk_weights=torch.full((3, 1), 0.5)),
    M.FUSED_CONTIGUOUS: experts(x=t(3, 32)[:, ::2]),
    M.FUSED_DTYPE: experts(x=t(3, 16, dtype=torch.float64), w13=t(4, 16, 16, dtype=torch.float64)),
}

test_moe_valid_calls_pass, test_moe_rejects_what_sglang_rejects, test_every_moe_constraint = (
    constraint_tests(SglangTritonMoeDouble, MOE_VALID, MOE_REJECTED)
)


def test_moe_double_refuses_what_it_does_not_model() -> None:
    """float32 (TF32 on the GPU) and bias/option calls are refused, not computed wrongly."""
    with pytest.raises(NotImplementedError, match="float32"):
        experts(x=t(3, 16, dtype=torch.float32), w13=t(4, 16, 16, dtype=torch.float32))(M())
    with pytest.raises(NotImplementedError, match="softcapping"):
        SglKernelDouble().topk_softmax(
            torch.empty(3, 2), torch.empty(3, 2, dtype=torch.int32), t(3, 8), moe_softcapping=30.0
        )


def test_return_conventions() -> None:
    """rmsnorm and silu_and_mul return their output; fused_add_rmsnorm and rope return None."""
    sdk, x = SglKernelDouble(), t(3, 16)
    out = torch.empty(3, 8, dtype=torch.float16)
    assert sdk.silu_and_mul(t(3, 16), out) is out
    assert sdk.rmsnorm(x, t(16)).shape == x.shape
    assert fused(x, t(3, 16), t(16))(sdk) is None
    assert rope()(sdk) is None
    weights, ids = torch.empty(3, 2), torch.empty(3, 2, dtype=torch.int32)
    assert sdk.topk_sigmoid(weights, ids, t(3, 8), True) is None  # written in place
    assert (weights.sum(dim=-1) - 1).abs().max() < 1e-5
    assert sdk.called == [
        "silu_and_mul",
        "rmsnorm",
        "fused_add_rmsnorm",
        "rotary_embedding",
        "topk_sigmoid",
    ]
    x = t(3, 16)
    out = experts(x=x)(M())
    assert isinstance(out, torch.Tensor)
    assert (out.shape, out.dtype) == (x.shape, x.dtype)
    assert out.data_ptr() != x.data_ptr()
