"""``gelu_new``: SGLang's ``NewGELU``, the tanh GELU written out as GPT-2 does."""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch

from ..contract import STANDARD_DTYPES, STANDARD_TOLERANCES, OpContract
from .elementwise import ELEMENTWISE_CASES, elementwise_inputs

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _signature(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))`` element-wise.

    ``x`` is ``[num_tokens, width]`` (``num_tokens`` may be 0, ``x`` may be strided); returns a
    new tensor of the same shape and dtype, ``x`` untouched. The layer carries no state.
    """
    raise NotImplementedError


def reference(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """Same math as ``NewGELU.forward_native``, every step in the input dtype."""
    return 0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * torch.pow(x, 3.0))))


CONTRACT = OpContract(
    name="gelu_new",
    sglang_layer="NewGELU",
    summary="GPT-2's tanh GELU, element-wise",
    signature=inspect.signature(_signature),
    details=inspect.getdoc(_signature) or "",
    reference=reference,
    dtypes=STANDARD_DTYPES,
    tolerances=STANDARD_TOLERANCES,
    cases=ELEMENTWISE_CASES,
    make_inputs=elementwise_inputs,
)
