"""The ``torch_npu`` double rejects what the real operators reject, one constraint at a time.

Each documented constraint of the double (see its source in ``torch_npu_double.py``) gets a
call that is valid except for that one constraint: the double must refuse it, naming that
constraint. The valid calls themselves must pass, so every refusal is specific, and every
constraint the double declares must have its rejecting call here.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch_npu_double import TorchNpuDouble

from sglang_fl.testing.doubles import Constraint, ConstraintViolation, constraint_tests

D = TorchNpuDouble
Call = Callable[[TorchNpuDouble], object]


def t(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


def swiglu(x: torch.Tensor, dim: int = -1) -> Call:
    return lambda sdk: sdk.npu_swiglu(x, dim=dim)


def geglu(x: torch.Tensor, dim: int = -1, approximate: int = 1) -> Call:
    return lambda sdk: sdk.npu_geglu(x, dim=dim, approximate=approximate, activate_left=True)


def gelu(x: torch.Tensor, approximate: str = "tanh") -> Call:
    return lambda sdk: sdk.npu_gelu(x, approximate=approximate)


def fast_gelu(x: torch.Tensor) -> Call:
    return lambda sdk: sdk.npu_fast_gelu(x)


def rms_norm(x: torch.Tensor, gamma: torch.Tensor) -> Call:
    return lambda sdk: sdk.npu_rms_norm(x, gamma, 1e-6)


def add_rms_norm(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor) -> Call:
    return lambda sdk: sdk.npu_add_rms_norm(x1, x2, gamma, 1e-6)


def mrope(
    positions: torch.Tensor | None = None,
    query: torch.Tensor | None = None,
    cache: torch.Tensor | None = None,
    head_size: int = 32,
    mode: str = "half",
    section: list[int] | None = None,
) -> Call:
    """A valid call (3 tokens, 4 q heads, 2 kv heads, head size 32) with parts replaced."""
    positions = torch.tensor([0, 5, 2]) if positions is None else positions
    section = [0, 0, 0] if section is None else section
    query = t(3, 4 * 32) if query is None else query
    key = t(query.shape[0], 2 * 32, dtype=query.dtype)
    cache = t(8, 32, dtype=query.dtype) if cache is None else cache
    return lambda sdk: sdk.npu_mrope(
        positions, query, key, cache, head_size, mrope_section=section, rotary_mode=mode
    )


VALID: list[Call] = [
    swiglu(t(3, 16)),
    swiglu(t(2, 6, 4), dim=1),
    geglu(t(3, 16)),
    geglu(t(3, 32)[:, ::2], approximate=0),  # strided input: documented as supported
    geglu(t(2, 6, 4), dim=1),
    gelu(t(3, 16)),
    gelu(t(3, 32)[:, ::2], approximate="none"),
    fast_gelu(t(3, 16, dtype=torch.bfloat16)),
    rms_norm(t(3, 16), t(16)),
    add_rms_norm(t(3, 16), t(3, 16), t(16)),
    mrope(),
    mrope(mode="interleave"),
    mrope(query=t(3, 64, dtype=torch.float32), cache=t(8, 16, dtype=torch.float32), head_size=16),
    mrope(query=t(3, 4 * 64), cache=t(8, 32), head_size=64),  # partial rotary
    mrope(positions=torch.randint(0, 8, (3, 3)), section=[4, 6, 6]),  # mrope: [3, tokens]
]

REJECTED: dict[Constraint, Call] = {
    D.SWIGLU_CONTIGUOUS: swiglu(t(3, 32)[:, ::2]),
    D.SWIGLU_NOT_EMPTY: swiglu(t(0, 16)),
    D.SWIGLU_SHAPE: swiglu(t(3, 15)),
    D.GEGLU_OPERANDS: geglu(t(3, 15)),
    D.GELU_OPERANDS: gelu(t(3, 16), approximate="erf"),
    D.FAST_GELU_OPERANDS: fast_gelu(torch.randn(3, 16, dtype=torch.float64)),
    D.RMS_NORM_OPERANDS: rms_norm(t(3, 16), t(16, dtype=torch.float32)),
    D.ADD_RMS_NORM_PAIR: add_rms_norm(t(3, 16), t(2, 16), t(16)),
    D.ADD_RMS_NORM_NOT_EMPTY: add_rms_norm(t(0, 16), t(0, 16), t(16)),
    D.MROPE_POSITIONS: mrope(positions=torch.tensor([0.0, 5.0, 2.0])),
    D.MROPE_OPERANDS: mrope(cache=t(8, 32, dtype=torch.float32)),
    D.MROPE_ALIGNMENT: mrope(query=t(3, 4 * 16), cache=t(8, 16), head_size=16),  # fp16: 32
}


test_valid_calls_pass, test_rejects_what_the_sdk_rejects, test_every_constraint_is_covered = (
    constraint_tests(TorchNpuDouble, VALID, REJECTED)
)


def test_return_conventions() -> None:
    """New tensors, never the inputs: y; (y, rstd); (y, rstd, x1 + x2); (query, key)."""
    sdk, x, residual, gamma = TorchNpuDouble(), t(3, 16), t(3, 16), t(16)
    before = (x.clone(), residual.clone())
    assert sdk.npu_swiglu(x).shape == (3, 8)
    y, rstd = sdk.npu_rms_norm(x, gamma)
    assert (y.shape, rstd.shape) == ((3, 16), (3, 1))
    y, rstd, total = sdk.npu_add_rms_norm(residual, x, gamma)
    torch.testing.assert_close(total, (before[0].float() + before[1].float()).half())
    assert torch.equal(x, before[0])
    assert torch.equal(residual, before[1])
    rotated = mrope()(sdk)
    assert isinstance(rotated, tuple)
    query, key = rotated
    assert (query.shape, key.shape) == ((3, 128), (3, 64))
    assert sdk.called == ["npu_swiglu", "npu_rms_norm", "npu_add_rms_norm", "npu_mrope"]


@pytest.mark.parametrize(
    "call",
    [
        mrope(positions=torch.randint(0, 8, (3, 3)), section=[4, 6, 5]),  # 15 lanes, not 16
        mrope(section=[4, 6, 6]),  # [tokens] positions take no sections
    ],
)
def test_mrope_sections_must_match_the_positions(call: Call) -> None:
    """[3, tokens] positions need sections covering rotary_dim // 2 lanes; [tokens] none."""
    with pytest.raises(ConstraintViolation) as info:
        call(TorchNpuDouble())
    assert info.value.constraint is D.MROPE_POSITIONS


def test_geglu_returns_the_product_and_the_gelu() -> None:
    x = t(3, 16)
    y, gelu = TorchNpuDouble().npu_geglu(x, dim=-1, approximate=1, activate_left=True)
    assert (y.shape, gelu.shape) == ((3, 8), (3, 8))
    torch.testing.assert_close(y.float(), gelu.float() * x[:, 8:].float(), atol=1e-2, rtol=1e-2)
