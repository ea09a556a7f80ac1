"""The double of SGLang's Triton GDN kernels rejects what they reject, one constraint at a time.

Each constraint of ``SglangTritonGdnDouble`` (sources in ``sglang_triton_double.py``) gets a
call valid but for that constraint; the valid calls must pass, so each refusal is specific, and
every declared constraint must have its rejecting call here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from sglang_triton_double import SglangTritonGdnDouble

from sglang_fl.testing.doubles import constraint_tests

D = SglangTritonGdnDouble
Call = Callable[[SglangTritonGdnDouble], object]
BF16 = torch.bfloat16


def t(*shape: int, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


def strided(x: torch.Tensor) -> torch.Tensor:
    """``x``'s values in a view whose last dim has stride 2."""
    wide = torch.zeros(*x.shape[:-1], x.shape[-1] * 2, dtype=x.dtype)
    wide[..., ::2] = x
    return wide[..., ::2]


def qkv(heads_v: int = 4, dk: int = 16, tokens: int = 5, dtype: torch.dtype = BF16) -> Any:
    """q, k ``[1, T, 2, K]``, v ``[1, T, HV, 8]``, float32 g and beta ``[1, T, HV]``."""
    return (
        t(1, tokens, 2, dk, dtype=dtype),
        t(1, tokens, 2, dk, dtype=dtype),
        t(1, tokens, heads_v, 8, dtype=dtype),
        -0.5 * torch.rand(1, tokens, heads_v),
        torch.rand(1, tokens, heads_v),
    )


def pool(slots: int = 3, heads_v: int = 4, dk: int = 16) -> torch.Tensor:
    return 0.1 * torch.randn(slots, heads_v, 8, dk)


def chunk(*operands: Any, **options: Any) -> Call:
    """A valid prefill: sequences of 2 and 3 tokens, pool slots 2 and 0, unless replaced."""
    q, k, v, g, beta = operands or qkv()
    kwargs: dict[str, Any] = {
        "initial_state": pool(heads_v=v.shape[2], dk=k.shape[3]),
        "initial_state_indices": torch.tensor([2, 0], dtype=torch.int32),
        "cu_seqlens": torch.tensor([0, 2, q.shape[1]]),
        "use_qk_l2norm_in_kernel": True,
        **options,
    }
    return lambda sdk: sdk.chunk_gated_delta_rule(q, k, v, g, beta, **kwargs)


def recurrent(*operands: Any, **options: Any) -> Call:
    q, k, v, g, beta = operands or qkv()
    kwargs: dict[str, Any] = {
        "beta": beta,
        "initial_state": pool(2, v.shape[2]),
        "output_final_state": True,
        "cu_seqlens": torch.tensor([0, 2, 5]),
        **options,
    }
    return lambda sdk: sdk.fused_recurrent_gated_delta_rule(q, k, v, g, **kwargs)


def packed(**replace: Any) -> Call:
    """A valid decode of 3 rows (H=2, HV=4, K=16, V=8), the middle one padding."""
    args: dict[str, Any] = {
        "mixed_qkv": t(3, 2 * 2 * 16 + 4 * 8),
        "a": t(3, 4),
        "b": t(3, 4),
        "A_log": torch.rand(4),
        "dt_bias": t(4),
        "scale": 0.25,
        "initial_state": pool(5),
        "out": t(3, 1, 4, 8),
        "ssm_state_indices": torch.tensor([4, -1, 0], dtype=torch.int32),
        **replace,
    }
    return lambda sdk: sdk.fused_recurrent_gated_delta_rule_packed_decode(**args)


def sigmoid(heads_v: int = 4, **replace: Any) -> Call:
    """A valid decode of 3 one-token sequences, the middle one padding."""
    q, k, v, _, _ = qkv(heads_v, tokens=3)
    args: dict[str, Any] = {
        "A_log": torch.rand(heads_v),
        "a": t(3, heads_v),
        "dt_bias": t(heads_v),
        "softplus_beta": 1.0,
        "softplus_threshold": 20.0,
        "q": q,
        "k": k,
        "v": v,
        "b": t(3, heads_v),
        "initial_state_source": pool(5, heads_v),
        "initial_state_indices": torch.tensor([4, -1, 0], dtype=torch.int32),
        "use_qk_l2norm_in_kernel": True,
        "cu_seqlens": torch.tensor([0, 1, 2, 3], dtype=torch.int32),
        **replace,
    }
    return lambda sdk: sdk.fused_sigmoid_gating_delta_rule_update(**args)


def gating(a: torch.Tensor | None = None) -> Call:
    a = t(5, 4) if a is None else a
    return lambda sdk: sdk.fused_gdn_gating(torch.rand(4), a, t(5, 4), t(4))


def norm(
    x: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    activation: str = "silu",
) -> Call:
    x = t(5, 16) if x is None else x
    weight = t(16) if weight is None else weight
    return lambda sdk: sdk.layer_norm_gated_fwd(
        x, t(*x.shape), weight, None, activation, 1e-6, out_dtype=x.dtype, is_rms_norm=True
    )


def _batch_of_two() -> Call:
    q, k, v, g, beta = (x.expand(2, *x.shape[1:]) for x in qkv())
    return chunk(q, k, v, g, beta)


VALID: list[Call] = [chunk(), recurrent(), packed(), sigmoid(), gating(), norm()]
REJECTED = {
    D.CHUNK_DTYPE: chunk(*qkv(dtype=torch.float32)),
    D.CHUNK_BETA: chunk(*qkv()[:4], torch.rand(1, 5, 4, 1)),
    D.CHUNK_HEAD_DIM: chunk(*qkv(dk=512)),
    D.CHUNK_HEADS: chunk(*qkv(heads_v=3)),
    D.CHUNK_VARLEN: _batch_of_two(),
    D.CHUNK_POOL: chunk(initial_state=None),
    D.CHUNK_POOL_CONTIGUOUS: chunk(initial_state=strided(pool())),
    D.CHUNK_INDEX: chunk(initial_state_indices=torch.tensor([2, 3], dtype=torch.int32)),
    D.CHUNK_TOKENS: chunk(
        *qkv(tokens=0),
        cu_seqlens=torch.tensor([0]),
        initial_state_indices=torch.zeros(0, dtype=torch.int32),
    ),
    D.RECURRENT_SCALE: recurrent(scale=-1.0),
    D.RECURRENT_HEADS: recurrent(*qkv(heads_v=3)),
    D.RECURRENT_BETA: recurrent(beta=None),
    D.RECURRENT_VARLEN: recurrent(initial_state=pool(3)),
    D.PACKED_LAYOUT: packed(out=strided(t(3, 1, 4, 8))),
    D.PACKED_SHAPES: packed(a=t(3, 3)),
    D.PACKED_STATE: packed(initial_state=strided(pool(5))),
    D.PACKED_INDEX: packed(ssm_state_indices=torch.tensor([4, 5, 0], dtype=torch.int32)),
    D.SIGMOID_SCALE: sigmoid(scale=0.0),
    D.SIGMOID_HEADS: sigmoid(heads_v=3),
    D.SIGMOID_LAYOUT: sigmoid(q=strided(t(1, 3, 2, 16))),
    D.SIGMOID_POOL: sigmoid(initial_state_source=strided(pool(5))),
    D.SIGMOID_INDEX: sigmoid(initial_state_indices=torch.tensor([4, 5, 0], dtype=torch.int32)),
    D.GATING_LAYOUT: gating(strided(t(5, 4))),
    D.NORM_ROWS: norm(strided(t(5, 16))),
    D.NORM_WIDTH: norm(t(2, 40000), t(40000)),  # 80 KB of bfloat16
    D.NORM_WEIGHT: norm(weight=t(8)),
    D.NORM_ACTIVATION: norm(activation="gelu"),
}

test_valid_calls_pass, test_rejects_what_the_kernels_reject, test_every_constraint_is_covered = (
    constraint_tests(SglangTritonGdnDouble, VALID, REJECTED)
)
