"""``rms_norm`` on ``torch_npu.npu_rms_norm`` / ``npu_add_rms_norm``, as ``RMSNorm.forward_npu``.

Both operators return new tensors: with a residual, ``npu_add_rms_norm(residual, x, ...)``
returns ``(norm(x + residual), rstd, x + residual)`` and the adapter returns the first and the
last; its inputs are left untouched.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl import Unsupported

from ..ascend import TORCH_NPU


def rms_norm_npu(
    obj: Any, x: torch.Tensor, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``[num_tokens, hidden]`` normalised with ``obj.weight``/``obj.variance_epsilon``."""
    weight = obj.weight.data
    if weight.dtype != x.dtype:
        raise Unsupported(f"torch_npu RMS norms need gamma dtype {x.dtype}, got {weight.dtype}")
    torch_npu = TORCH_NPU.module or TORCH_NPU.load()
    if residual is None:
        normed: torch.Tensor = torch_npu.npu_rms_norm(x, weight, obj.variance_epsilon)[0]
        return normed
    out, _, residual_out = torch_npu.npu_add_rms_norm(residual, x, weight, obj.variance_epsilon)
    return out, residual_out
