"""``silu_and_mul``: SGLang's ``SiluAndMul``, ``silu(x[..., :d]) * x[..., d:]``."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from ..contract import (
    STANDARD_DTYPES,
    STANDARD_TOLERANCES,
    OpCase,
    OpContract,
    OpInputs,
    axis,
    case_grid,
    layer,
    random_tensor,
)


def _signature(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """``x`` is ``[num_tokens, 2*d]`` (``num_tokens`` may be 0, and ``x`` a strided view);
    returns a new ``[num_tokens, d]`` tensor, ``x`` untouched."""
    raise NotImplementedError


def reference(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """Same math as ``SiluAndMul.forward_native``, in the input dtype."""
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def _case_name(p: Mapping[str, Any]) -> str:
    return f"tokens={p['tokens']},d={p['d']}" + ("" if p["contiguous"] else ",strided")


# Gate widths whose half-row is not a whole number of 16-byte vectors in some dtype: 2 and 6
# (8 and 24 bytes in float32), 4, 12 and 20 (8, 24 and 40 bytes in float16/bfloat16, while the
# whole row 2d is a multiple of 16 bytes). Kernels that load each half in 16-byte vectors (an
# SGLang layer with intermediate size 4 on a GPU is legal) must compute them or decline them.
NARROW_GATES = (2, 4, 6, 12, 20)


CASES = (
    *case_grid(
        _case_name,
        axis("tokens", (1, 7, 33)),
        axis("d", (16, 128, 352)),
        axis("contiguous", (True, False)),
    ),
    # An empty batch (0 tokens) reaches the layer too, e.g. an idle data-parallel rank.
    *case_grid(_case_name, axis("tokens", (0,)), axis("d", (128,)), axis("contiguous", (True,))),
    *case_grid(
        _case_name, axis("tokens", (3,)), axis("d", NARROW_GATES), axis("contiguous", (True,))
    ),
)


def gate_inputs(
    case: OpCase,
    dtype: torch.dtype,
    device: torch.device,
    generator: torch.Generator,
    **attributes: Any,
) -> OpInputs:
    """A ``[tokens, 2*d]`` input the op must leave untouched, and a layer with ``attributes``.

    Shared by the gated activations (``silu_and_mul``, ``gelu_and_mul``).
    """
    p = case.params
    x = random_tensor(
        (p["tokens"], 2 * p["d"]), dtype, device, generator, contiguous=p["contiguous"]
    )
    return OpInputs(obj=layer(**attributes), args=(x,), preserved=("x",))


def _make_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    return gate_inputs(case, dtype, device, generator)


CONTRACT = OpContract(
    name="silu_and_mul",
    sglang_layer="SiluAndMul",
    summary="SwiGLU gate: silu of the first half of the last dim times the second half",
    signature=inspect.signature(_signature),
    details=inspect.getdoc(_signature) or "",
    reference=reference,
    dtypes=STANDARD_DTYPES,
    tolerances=STANDARD_TOLERANCES,
    cases=CASES,
    make_inputs=_make_inputs,
    reference_traceable=True,
)
