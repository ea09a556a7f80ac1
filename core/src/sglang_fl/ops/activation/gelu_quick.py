"""``gelu_quick``: SGLang's ``QuickGELU``, ``x * sigmoid(1.702 * x)`` (CLIP vision towers)."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ..contract import STANDARD_DTYPES, STANDARD_TOLERANCES, OpContract
from .elementwise import ELEMENTWISE_CASES, elementwise_inputs


def _signature(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(1.702 * x)`` element-wise.

    ``x`` is ``[num_tokens, width]`` (``num_tokens`` may be 0, ``x`` may be strided); returns a
    new tensor of the same shape and dtype, ``x`` untouched. The layer carries no state.
    """
    raise NotImplementedError


def reference(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """Same math as ``QuickGELU.forward_native``, in the input dtype."""
    return x * torch.sigmoid(1.702 * x)


CONTRACT = OpContract(
    name="gelu_quick",
    sglang_layer="QuickGELU",
    summary="Quick GELU, x * sigmoid(1.702 x), element-wise",
    signature=inspect.signature(_signature),
    details=inspect.getdoc(_signature) or "",
    reference=reference,
    dtypes=STANDARD_DTYPES,
    tolerances=STANDARD_TOLERANCES,
    cases=ELEMENTWISE_CASES,
    make_inputs=elementwise_inputs,
)
