"""``rms_norm`` on ``torch_npu.npu_rms_norm`` / ``npu_add_rms_norm``, as ``RMSNorm.forward_npu``.

Both operators return new tensors: with a residual, ``npu_add_rms_norm(residual, x, ...)``
returns ``(norm(x + residual), rstd, x + residual)`` and the adapter returns the first and the
last; its inputs are left untouched.

Constraints of the operators (torch_npu API docs) and how they are met: gamma in the input's
dtype (else ``Unsupported``), no empty tensor for ``npu_add_rms_norm`` (an empty batch is
returned as it is, as ``RMSNorm.forward_cuda`` does, for both operators), float32/float16/
bfloat16 (the contract's dtypes).
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl import Unsupported

from ..backend import TORCH_NPU


def rms_norm(
    obj: Any, x: torch.Tensor, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``[num_tokens, hidden]`` normalised with ``obj.weight``/``obj.variance_epsilon``."""
    if x.numel() == 0:
        return x if residual is None else (x, residual)
    weight = obj.weight.data
    if weight.dtype != x.dtype:
        raise Unsupported(f"torch_npu RMS norms need gamma dtype {x.dtype}, got {weight.dtype}")
    torch_npu = TORCH_NPU.require()
    if residual is None:
        normed: torch.Tensor = torch_npu.npu_rms_norm(x, weight, obj.variance_epsilon)[0]
        return normed
    out, _, residual_out = torch_npu.npu_add_rms_norm(residual, x, weight, obj.variance_epsilon)
    return out, residual_out
