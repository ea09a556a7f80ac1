"""The ``sgl_kernel`` double rejects what the real kernels reject, one constraint at a time.

Each documented constraint of the double (see its source in ``sgl_kernel_double.py``) gets a
call that is valid except for that one constraint: the double must refuse it, naming that
constraint. The valid calls themselves must pass, so every refusal is specific, and every
constraint the double declares must have its rejecting call here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from sgl_kernel_double import SglKernelDouble

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


VALID: list[Call] = [
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
    D.ROPE_NOT_EMPTY: rope(
        positions=torch.empty(0, dtype=torch.int64), query=t(0, 4, 32), key=t(0, 2, 32)
    ),
}


test_valid_calls_pass, test_rejects_what_the_sdk_rejects, test_every_constraint_is_covered = (
    constraint_tests(SglKernelDouble, VALID, REJECTED)
)


def test_return_conventions() -> None:
    """rmsnorm and silu_and_mul return their output; fused_add_rmsnorm and rope return None."""
    sdk, x = SglKernelDouble(), t(3, 16)
    out = torch.empty(3, 8, dtype=torch.float16)
    assert sdk.silu_and_mul(t(3, 16), out) is out
    assert sdk.rmsnorm(x, t(16)).shape == x.shape
    assert fused(x, t(3, 16), t(16))(sdk) is None
    assert rope()(sdk) is None
    assert sdk.called == ["silu_and_mul", "rmsnorm", "fused_add_rmsnorm", "rotary_embedding"]
