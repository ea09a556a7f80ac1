"""``rms_norm`` on template, with the fused residual add when ``residual`` is given."""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl import Unsupported


def rms_norm(
    obj: Any, x: torch.Tensor, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    # Replace with the chip kernel: obj.weight, obj.variance_epsilon; fp32 accumulation.
    # Without residual x stays untouched. With residual: return (rms_norm(x + residual),
    # x + residual); writing both into x and residual is allowed.
    raise Unsupported("template: rms_norm is not implemented")
