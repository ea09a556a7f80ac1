"""``gelu_and_mul``: SGLang's ``GeluAndMul``, ``gelu(x[..., :d]) * x[..., d:]`` (GeGLU)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from ..contract import (
    STANDARD_DTYPES,
    STANDARD_TOLERANCES,
    TOKEN_COUNTS,
    OpCase,
    OpContract,
    OpInputs,
    axis,
    case_grid,
)
from .silu_and_mul import NARROW_GATES, gate_inputs

# The two GELU forms GeluAndMul takes (``obj.approximate``), as torch's F.gelu names them.
APPROXIMATIONS = ("none", "tanh")


def _signature(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """``x`` is ``[num_tokens, 2*d]``; returns a new ``[num_tokens, d]`` tensor, ``x`` untouched.

    ``obj.approximate`` selects the GELU: ``"none"`` (erf) or ``"tanh"``; any other value is a
    ``ValueError``. ``num_tokens`` may be 0; ``x`` may be a strided view.
    """
    raise NotImplementedError


def check_approximate(obj: Any) -> str:
    """``obj.approximate``, or a ``ValueError`` naming the value and the two allowed ones."""
    approximate = obj.approximate
    if approximate not in APPROXIMATIONS:
        raise ValueError(
            f"gelu_and_mul: obj.approximate is {approximate!r}; allowed: "
            + ", ".join(repr(a) for a in APPROXIMATIONS)
        )
    return str(approximate)


def reference(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """Same math as ``GeluAndMul.forward_native``, in the input dtype."""
    approximate = check_approximate(obj)
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d], approximate=approximate) * x[..., d:]


def _case_name(p: Mapping[str, Any]) -> str:
    name = f"tokens={p['tokens']},d={p['d']},approximate={p['approximate']}"
    return name + ("" if p["contiguous"] else ",strided")


CASES = (
    *case_grid(
        _case_name,
        axis("tokens", TOKEN_COUNTS),
        axis("d", (16, 128, 352)),
        axis("approximate", APPROXIMATIONS),
        axis("contiguous", (True, False)),
    ),
    *case_grid(
        _case_name,
        axis("tokens", (3,)),
        axis("d", NARROW_GATES),
        axis("approximate", APPROXIMATIONS),
        axis("contiguous", (True,)),
    ),
)


def _make_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    return gate_inputs(case, dtype, device, generator, approximate=case.params["approximate"])


CONTRACT = OpContract(
    name="gelu_and_mul",
    sglang_layer="GeluAndMul",
    summary="GeGLU gate: gelu (erf or tanh) of the first half of the last dim times the second",
    signature=inspect.signature(_signature),
    details=inspect.getdoc(_signature) or "",
    reference=reference,
    dtypes=STANDARD_DTYPES,
    tolerances=STANDARD_TOLERANCES,
    cases=CASES,
    make_inputs=_make_inputs,
)
