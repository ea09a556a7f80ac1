"""``rms_norm``: SGLang's ``RMSNorm`` with optional fused residual add."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

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


def _signature(
    obj: Any, x: torch.Tensor, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Normalise ``x`` ``[num_tokens, hidden]`` with ``obj.weight`` and ``obj.variance_epsilon``.

    ``num_tokens`` may be 0; ``x`` may be a strided view.

    Without ``residual``: returns the normalised tensor. With ``residual``: computes
    ``s = x + residual`` and returns ``(rms_norm(s), s)``; an implementation may write these
    two results into ``x`` and ``residual`` (as fused kernels do), so callers use the returned
    tensors. Statistics are accumulated in float32; results are in ``x``'s dtype.
    """
    raise NotImplementedError


def reference(
    obj: Any, x: torch.Tensor, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Same math as ``RMSNorm.forward_native`` for a layer with default options."""
    orig_dtype = x.dtype
    hidden = x.to(torch.float32)
    if residual is not None:
        hidden = hidden + residual.to(torch.float32)
        residual = hidden.to(orig_dtype)
    variance = hidden.pow(2).mean(dim=-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + obj.variance_epsilon)
    out = (hidden * obj.weight).to(orig_dtype)
    return out if residual is None else (out, residual)


def case_name(p: Mapping[str, Any]) -> str:
    """The case name of a residual-norm op (``rms_norm``, ``gemma_rms_norm``)."""
    name = f"tokens={p['tokens']},hidden={p['hidden']}"
    name += ",residual" if p["residual"] else ""
    return name + ("" if p["contiguous"] else ",strided")


_RESIDUAL = axis("residual", (False, True))
CASES = (
    *case_grid(
        case_name,
        axis("tokens", (1, 7, 33)),
        axis("hidden", (16, 128, 1024)),
        _RESIDUAL,
        axis("contiguous", (True, False)),
    ),
    # An empty batch (0 tokens), with and without the residual.
    *case_grid(
        case_name,
        axis("tokens", (0,)),
        axis("hidden", (128,)),
        _RESIDUAL,
        axis("contiguous", (True,)),
    ),
)


def residual_norm_inputs(
    case: OpCase,
    dtype: torch.dtype,
    device: torch.device,
    generator: torch.Generator,
    weight_from_noise: Callable[[torch.Tensor], torch.Tensor],
    **attributes: Any,
) -> OpInputs:
    """Inputs of a residual-norm case; ``weight_from_noise`` maps float32 noise to the weight.

    Shared by ``rms_norm`` and ``gemma_rms_norm``, whose layers differ only in the weight's
    form; ``attributes`` are the layer's further attributes.
    """
    p = case.params
    shape = (p["tokens"], p["hidden"])
    x = random_tensor(shape, dtype, device, generator, contiguous=p["contiguous"])
    noise = random_tensor((p["hidden"],), torch.float32, device, generator)
    obj = layer(weight=weight_from_noise(noise).to(dtype), variance_epsilon=1e-6, **attributes)
    if not p["residual"]:
        return OpInputs(obj=obj, args=(x,), preserved=("x",))
    residual = random_tensor(shape, dtype, device, generator)
    # Fused kernels may write both results in place: nothing is preserved, nothing required.
    return OpInputs(obj=obj, args=(x, residual))


def _make_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    return residual_norm_inputs(
        case,
        dtype,
        device,
        generator,
        lambda noise: 1.0 + 0.1 * noise,
        hidden_size=case.params["hidden"],
    )


CONTRACT = OpContract(
    name="rms_norm",
    sglang_layer="RMSNorm",
    summary="RMS normalisation with an optional fused residual add (fp32 accumulation)",
    signature=inspect.signature(_signature),
    details=inspect.getdoc(_signature) or "",
    reference=reference,
    dtypes=STANDARD_DTYPES,
    tolerances=STANDARD_TOLERANCES,
    cases=CASES,
    make_inputs=_make_inputs,
)
