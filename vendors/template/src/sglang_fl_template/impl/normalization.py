"""Norms on template: ``x`` ``[num_tokens, hidden]`` (maybe 0 tokens, maybe strided)."""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.types import Unsupported


def rms_norm(
    obj: Any, x: torch.Tensor, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    # Replace with the chip kernel: obj.weight, obj.variance_epsilon; fp32 accumulation.
    # Without residual x stays untouched. With residual: return (rms_norm(x + residual),
    # x + residual); writing both into x and residual is allowed.
    raise Unsupported("template: rms_norm is not implemented")


def gemma_rms_norm(
    obj: Any, x: torch.Tensor, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    # As rms_norm, scaled by 1 + obj.weight (fp32), and the residual sum s = x + residual is
    # rounded to x's dtype before it is normalised: return (norm(s), s).
    raise Unsupported("template: gemma_rms_norm is not implemented")


def layer_norm(obj: Any, x: torch.Tensor) -> torch.Tensor:
    # F.layer_norm of x converted to obj.dtype, over obj.hidden_size, eps obj.variance_epsilon;
    # obj.weight if obj.elementwise_affine, obj.bias if obj.use_bias; result in x's dtype.
    raise Unsupported("template: layer_norm is not implemented")
