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

from sglang_fl.testing.doubles import Constraint, assert_rejects, constraint_tests

D = SglKernelDouble
Call = Callable[[SglKernelDouble], object]


def t(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


ACT_AND_MUL_KERNELS = ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul")


def act(x: torch.Tensor, out: torch.Tensor | None = None, kernel: str = "silu_and_mul") -> Call:
    return lambda sdk: getattr(sdk, kernel)(x, out)


def silu(x: torch.Tensor, out: torch.Tensor | None = None) -> Call:
    return act(x, out)


def gemma(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None) -> Call:
    if residual is None:
        return lambda sdk: sdk.gemma_rmsnorm(x, weight, 1e-6)
    return lambda sdk: sdk.gemma_fused_add_rmsnorm(x, residual, weight, 1e-6)


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
    router(logits=t(0, 8)),  # an empty batch: the current kernels return without a launch
    silu(t(3, 16)),
    silu(t(3, 16), torch.empty(3, 8, dtype=torch.float16)),
    act(t(3, 16), kernel="gelu_and_mul"),
    act(t(3, 16, dtype=torch.bfloat16), kernel="gelu_tanh_and_mul"),
    rmsnorm(t(3, 16), t(16)),
    gemma(t(3, 16), t(16)),
    gemma(t(3, 16, dtype=torch.bfloat16), t(16, dtype=torch.bfloat16), t(3, 16).bfloat16()),
    fused(t(3, 16), t(3, 16), t(16)),
    fused(t(3, 16, dtype=torch.float32), t(3, 16, dtype=torch.float32), t(16, dtype=torch.float32)),
    rope(),
]

REJECTED: dict[Constraint, Call] = {
    D.ACT_ROW_BYTES: silu(t(3, 6)),  # 12 bytes per row
    D.ACT_HALF_ROW: silu(t(3, 8)),  # 16 bytes per row, but d=4 is 8 bytes per half
    D.ACT_OUT_SHAPE: silu(t(3, 16), torch.empty(3, 16, dtype=torch.float16)),
    D.ACT_DTYPE: silu(t(3, 16), torch.empty(3, 8, dtype=torch.bfloat16)),
    D.ACT_CONTIGUOUS: silu(t(3, 32)[:, ::2]),
    D.ACT_ALIGNED: silu(t(1, 24).flatten()[4:20].view(1, 16)),  # starts 8 bytes in
    D.ACT_TOKENS: silu(t(0, 16)),
    D.NORM_SHAPES: rmsnorm(t(2, 3, 16), t(16)),
    D.NORM_CONTIGUOUS: fused(t(3, 16), t(3, 16), t(32)[::2]),  # a strided weight
    D.NORM_DTYPE: rmsnorm(t(3, 16), t(16, dtype=torch.float32)),
    D.RMSNORM_HALF: rmsnorm(t(3, 16, dtype=torch.float32), t(16, dtype=torch.float32)),
    D.GEMMA_HALF: gemma(
        t(3, 16, dtype=torch.float32), t(16, dtype=torch.float32), t(3, 16, dtype=torch.float32)
    ),
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
    D.ROPE_NOT_EMPTY: rope(
        positions=torch.empty(0, dtype=torch.int64), query=t(0, 4, 32), key=t(0, 2, 32)
    ),
}


test_valid_calls_pass, test_rejects_what_the_sdk_rejects, test_every_constraint_is_covered = (
    constraint_tests(SglKernelDouble, VALID, REJECTED)
)

# The rejecting calls of the act-and-mul rules, for every kernel that shares them.
ACT_REJECTED: dict[Constraint, Callable[[str], Call]] = {
    D.ACT_ROW_BYTES: lambda k: act(t(3, 6), kernel=k),
    D.ACT_HALF_ROW: lambda k: act(t(3, 4, dtype=torch.float32), kernel=k),  # d=2: 8 bytes
    D.ACT_OUT_SHAPE: lambda k: act(t(3, 16), torch.empty(3, 16, dtype=torch.float16), k),
    D.ACT_DTYPE: lambda k: act(t(3, 16), torch.empty(3, 8, dtype=torch.bfloat16), k),
    D.ACT_CONTIGUOUS: lambda k: act(t(3, 32)[:, ::2], kernel=k),
    D.ACT_ALIGNED: lambda k: act(t(1, 24).flatten()[4:20].view(1, 16), kernel=k),
    D.ACT_TOKENS: lambda k: act(t(0, 16), kernel=k),
}
# ... and of the norm rules, for both Gemma kernels.
GEMMA_REJECTED: dict[Constraint, list[Call]] = {
    D.NORM_SHAPES: [gemma(t(2, 3, 16), t(16)), gemma(t(3, 16), t(16), t(2, 16))],
    D.NORM_CONTIGUOUS: [gemma(t(3, 16), t(32)[::2]), gemma(t(3, 16), t(16), t(3, 32)[:, ::2])],
    D.NORM_DTYPE: [gemma(t(3, 16), t(16).bfloat16()), gemma(t(3, 16), t(16), t(3, 16).bfloat16())],
    D.NORM_TOKENS: [gemma(t(0, 16), t(16)), gemma(t(0, 16), t(16), t(0, 16))],
    D.GEMMA_HALF: [gemma(t(3, 16, dtype=torch.float32), t(16, dtype=torch.float32))],
}


@pytest.mark.parametrize("kernel", ACT_AND_MUL_KERNELS)
@pytest.mark.parametrize("constraint", list(ACT_REJECTED), ids=lambda c: c.rule)
def test_every_act_and_mul_kernel_rejects_what_the_sdk_rejects(
    kernel: str, constraint: Constraint
) -> None:
    assert_rejects(SglKernelDouble(), constraint, ACT_REJECTED[constraint](kernel))


@pytest.mark.parametrize(
    ("constraint", "call"),
    [(c, call) for c, calls in GEMMA_REJECTED.items() for call in calls],
    ids=lambda value: value.rule if isinstance(value, Constraint) else "",
)
def test_gemma_kernels_reject_what_the_sdk_rejects(constraint: Constraint, call: Call) -> None:
    assert_rejects(SglKernelDouble(), constraint, call)


def test_gelu_kernels_compute_erf_and_tanh_gelu() -> None:
    sdk, x = SglKernelDouble(), t(3, 16, dtype=torch.float32)
    gate, value = x[:, :8], x[:, 8:]
    exact = torch.nn.functional.gelu(gate) * value
    tanh = torch.nn.functional.gelu(gate, approximate="tanh") * value
    torch.testing.assert_close(sdk.gelu_and_mul(x), exact)
    torch.testing.assert_close(sdk.gelu_tanh_and_mul(x), tanh)


@pytest.mark.parametrize("kernel", ACT_AND_MUL_KERNELS)
def test_act_and_mul_kernels_round_once(kernel: str) -> None:
    """act(x) * y in float32, rounded once into out's dtype (act_and_mul_kernel's cast_store)."""
    x = t(64, 64, dtype=torch.bfloat16) * 3
    gate, value = x[:, :32].float(), x[:, 32:].float()
    act = {
        "silu_and_mul": torch.nn.functional.silu,
        "gelu_and_mul": torch.nn.functional.gelu,
        "gelu_tanh_and_mul": lambda g: torch.nn.functional.gelu(g, approximate="tanh"),
    }[kernel]
    assert torch.equal(getattr(SglKernelDouble(), kernel)(x), (act(gate) * value).bfloat16())


def test_moe_gelu_is_erf_and_gelu_tanh_is_tanh() -> None:
    """SGLang's Triton path: 'gelu' is gelu_and_mul (erf), 'gelu_tanh' is tanh-GELU."""
    erf, tanh = experts_with("gelu")(M()), experts_with("gelu_tanh")(M())
    assert isinstance(erf, torch.Tensor)
    assert isinstance(tanh, torch.Tensor)
    assert not torch.equal(erf, tanh)


def test_the_runtime_context_reads_raise_as_sglangs_do() -> None:
    sdk = M(published=False)
    with pytest.raises(ValueError, match="'exec' not published"):
        sdk.get_exec()
    with pytest.raises(RuntimeError, match="tp_group"):
        sdk.get_parallel().tp_group  # noqa: B018


def test_gemma_kernels_scale_by_one_plus_weight() -> None:
    sdk, x, weight = SglKernelDouble(), t(3, 16, dtype=torch.bfloat16), t(16) * 0.1
    weight = weight.bfloat16()
    plain = sdk.rmsnorm(x, (1.0 + weight.float()).bfloat16())
    torch.testing.assert_close(sdk.gemma_rmsnorm(x, weight), plain, atol=2e-2, rtol=2e-2)
    residual = t(3, 16).bfloat16()
    total = (x.float() + residual.float()).bfloat16()
    assert sdk.gemma_fused_add_rmsnorm(x, residual, weight, 1e-6) is None  # in place
    torch.testing.assert_close(residual, total)


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


def unpublished(call: MoeCall) -> MoeCall:
    """``call`` in a process where no SGLang worker published its runtime context."""

    def run(sdk: SglangTritonMoeDouble) -> object:
        sdk.published = False
        return call(sdk)

    return run


def experts_with(activation: str) -> MoeCall:
    x, w13, w2 = t(3, 16), t(4, 16, 16), t(4, 16, 8)
    ids = torch.tensor([[0, 1], [2, 3], [1, 2]], dtype=torch.int32)
    weights = torch.full((3, 2), 0.5)
    return lambda sdk: sdk.outplace_fused_experts(x, w13, w2, weights, ids, activation=activation)


MOE_VALID: list[MoeCall] = [experts(), experts_with("gelu"), experts_with("gelu_tanh")]

MOE_REJECTED: dict[Constraint, MoeCall] = {
    M.FUSED_HIDDEN: experts(x=t(3, 32)),
    M.FUSED_TOPK: experts(topk_weights=torch.full((3, 1), 0.5)),
    M.FUSED_CONTIGUOUS: experts(x=t(3, 32)[:, ::2]),
    M.FUSED_DTYPE: experts(x=t(3, 16, dtype=torch.float64), w13=t(4, 16, 16, dtype=torch.float64)),
    M.FUSED_ACTIVATION: experts_with("swiglu"),
    M.FUSED_RUNTIME: unpublished(experts()),
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
