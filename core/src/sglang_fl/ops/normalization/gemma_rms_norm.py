"""``gemma_rms_norm``: SGLang's ``GemmaRMSNorm`` and ``Gemma3RMSNorm``, scaled by ``1 + weight``.

Name and signature are those of the FlagOS SGLang plugin, so its vendor kernels register as is.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

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
from .rms_norm import case_name, residual_norm_inputs


def _signature(
    obj: Any, x: torch.Tensor, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Normalise ``x`` ``[num_tokens, hidden]`` and scale it by ``1 + obj.weight``.

    ``obj.weight`` is ``[hidden]`` (the checkpoint's offset from 1, in any float dtype) and
    ``obj.variance_epsilon`` the epsilon. Without ``residual``: returns the normalised tensor,
    ``x`` untouched. With ``residual``: ``s = x + residual`` rounded to ``x``'s dtype; returns
    ``(norm(s), s)``, and may write these two results into ``x`` and ``residual`` (as fused
    kernels do), so callers use the returned tensors. Statistics and the scaling are computed
    in float32, the result is in ``x``'s dtype. ``num_tokens`` may be 0; ``x`` may be strided.
    """
    raise NotImplementedError


def reference(
    obj: Any, x: torch.Tensor, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Same math as ``GemmaRMSNorm.forward_native`` and ``Gemma3RMSNorm.forward_native``."""
    orig_dtype = x.dtype
    if residual is not None:
        x = x + residual  # in x's dtype, as both SGLang layers add
        residual = x
    hidden = x.float()
    hidden = hidden * torch.rsqrt(hidden.pow(2).mean(dim=-1, keepdim=True) + obj.variance_epsilon)
    out = (hidden * (1.0 + obj.weight.float())).to(orig_dtype)
    return out if residual is None else (out, residual)


CASES = case_grid(
    case_name,
    axis("tokens", TOKEN_COUNTS),
    axis("hidden", (16, 128, 1024)),
    axis("residual", (False, True)),
    axis("contiguous", (True, False)),
)


def _make_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    # Gemma checkpoints store the offset from 1: small values around 0, in the model dtype.
    return residual_norm_inputs(case, dtype, device, generator, lambda noise: 0.1 * noise)


CONTRACT = OpContract(
    name="gemma_rms_norm",
    sglang_layer="GemmaRMSNorm, Gemma3RMSNorm",
    summary="Gemma RMS normalisation (scale 1 + weight) with an optional fused residual add",
    signature=inspect.signature(_signature),
    details=inspect.getdoc(_signature) or "",
    reference=reference,
    dtypes=STANDARD_DTYPES,
    tolerances=STANDARD_TOLERANCES,
    cases=CASES,
    make_inputs=_make_inputs,
)
