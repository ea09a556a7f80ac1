"""``rms_norm`` on ``sgl_kernel.rmsnorm`` / ``fused_add_rmsnorm``, as ``RMSNorm.forward_cuda``.

With a residual the fused kernel writes both results in place (``residual += x``, then
``x = rms_norm(residual)``) and the adapter returns ``(x, residual)``: no allocation at all.

Constraints of the kernels (``sglang-kernel`` 0.4.x) and how they are met: 2-D operands (else
``Unsupported``), weight in the input's dtype (else ``Unsupported``), float16/bfloat16 for
``rmsnorm`` (float32 without a residual is ``Unsupported``), contiguous input, residual and
weight (strided ones are packed first), at least one row (an empty batch is returned as it is,
as ``RMSNorm.forward_cuda`` does, without a launch).
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl import Unsupported

from ..backend import SGL_KERNEL

# sgl_kernel.rmsnorm (FlashInfer's kernel) is built for half precision only; the fused
# residual kernel also has a float32 path.
_RMSNORM_DTYPES = frozenset({torch.float16, torch.bfloat16})


def rms_norm(
    obj: Any, x: torch.Tensor, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``[num_tokens, hidden]`` normalised with ``obj.weight``/``obj.variance_epsilon``."""
    if x.numel() == 0:
        return x if residual is None else (x, residual)
    weight = obj.weight.data
    if weight.dtype != x.dtype:
        # The kernels read the weight as x's element type: a mismatch would be read as garbage.
        raise Unsupported(f"sgl_kernel norms need weight dtype {x.dtype}, got {weight.dtype}")
    if x.dim() != 2:
        raise Unsupported(f"sgl_kernel norms take [num_tokens, hidden], got {tuple(x.shape)}")
    if residual is None and x.dtype not in _RMSNORM_DTYPES:
        raise Unsupported(f"sgl_kernel.rmsnorm has no {x.dtype} kernel")
    sgl_kernel = SGL_KERNEL.require()
    # The kernels index rows as packed [hidden] vectors.
    x, weight = x.contiguous(), weight.contiguous()
    if residual is None:
        normed: torch.Tensor = sgl_kernel.rmsnorm(x, weight, obj.variance_epsilon)
        return normed
    residual = residual.contiguous()
    sgl_kernel.fused_add_rmsnorm(x, residual, weight, obj.variance_epsilon)
    return x, residual
