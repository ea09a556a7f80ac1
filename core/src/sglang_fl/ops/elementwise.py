"""Cases shared by the element-wise activation contracts (``gelu_new``, ``gelu_quick``)."""

from __future__ import annotations

import itertools

import torch

from .contract import TOKEN_COUNTS, OpCase, OpInputs, layer, random_tensor


def elementwise_cases() -> tuple[OpCase, ...]:
    """Token counts (0 included) x widths x contiguous/strided inputs."""
    cases = []
    for tokens, width, contiguous in itertools.product(TOKEN_COUNTS, (16, 128, 352), (True, False)):
        name = f"tokens={tokens},width={width}" + ("" if contiguous else ",strided")
        cases.append(OpCase(name, {"tokens": tokens, "width": width, "contiguous": contiguous}))
    return tuple(cases)


def elementwise_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    """A ``[tokens, width]`` input that the op must leave untouched; the layer has no state."""
    p = case.params
    shape = (p["tokens"], p["width"])
    x = random_tensor(shape, dtype, device, generator, contiguous=p["contiguous"])
    return OpInputs(obj=layer(), args=(x,), preserved=("x",))
