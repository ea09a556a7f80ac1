"""Cases shared by the element-wise activation contracts (``gelu_new``, ``gelu_quick``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..contract import TOKEN_COUNTS, OpCase, OpInputs, axis, case_grid, layer, random_tensor


def _case_name(p: Mapping[str, Any]) -> str:
    return f"tokens={p['tokens']},width={p['width']}" + ("" if p["contiguous"] else ",strided")


# Token counts (0 included) x widths x contiguous/strided inputs.
ELEMENTWISE_CASES = case_grid(
    _case_name,
    axis("tokens", TOKEN_COUNTS),
    axis("width", (16, 128, 352)),
    axis("contiguous", (True, False)),
)


def elementwise_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    """A ``[tokens, width]`` input that the op must leave untouched; the layer has no state."""
    p = case.params
    shape = (p["tokens"], p["width"])
    x = random_tensor(shape, dtype, device, generator, contiguous=p["contiguous"])
    return OpInputs(obj=layer(), args=(x,), preserved=("x",))
