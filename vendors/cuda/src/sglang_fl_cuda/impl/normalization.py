"""``rms_norm`` and ``gemma_rms_norm`` on ``sgl_kernel``'s norm kernels, as SGLang's
``RMSNorm.forward_cuda`` and ``GemmaRMSNorm``/``Gemma3RMSNorm.forward_cuda`` call them.

With a residual the fused kernels write both results in place (``residual += x``, then
``x = norm(residual)``) and the adapters return ``(x, residual)``: no allocation at all.

Constraints of the kernels (``sglang-kernel`` 0.4.x) and how they are met: 2-D operands (else
``Unsupported``), weight in the input's dtype (else ``Unsupported``), float16/bfloat16 for
``rmsnorm`` and both Gemma kernels (float32 is ``Unsupported``, but for ``fused_add_rmsnorm``),
contiguous input, residual and weight (strided ones are packed first), at least one row (an
empty batch is returned as it is, as ``RMSNorm.forward_cuda`` does, without a launch).
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.types import Unsupported

from ..backend import SGL_KERNEL

# sgl_kernel.rmsnorm and both Gemma kernels (FlashInfer's) are built for half precision only
# (DISPATCH_PYTORCH_DTYPE_TO_CTYPE_FP16 in FlashInfer's csrc/norm.cu); the plain fused residual
# kernel (sgl_kernel's own) also has a float32 path.
_HALF = frozenset({torch.float16, torch.bfloat16})

# (plain kernel, fused residual-add kernel) of each norm.
_RMSNORM = ("rmsnorm", "fused_add_rmsnorm")
_GEMMA_RMSNORM = ("gemma_rmsnorm", "gemma_fused_add_rmsnorm")

Norm = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


def _operands(x: torch.Tensor, weight: torch.Tensor) -> None:
    """Decline what the kernels cannot read: a weight in another dtype, other ranks."""
    if weight.dtype != x.dtype:
        # The kernels read the weight as x's element type: a mismatch would be read as garbage.
        raise Unsupported(f"sgl_kernel norms need weight dtype {x.dtype}, got {weight.dtype}")
    if x.dim() != 2:
        raise Unsupported(f"sgl_kernel norms take [num_tokens, hidden], got {tuple(x.shape)}")


def _normalise(
    kernels: tuple[str, str],
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
) -> Norm:
    """``out = plain(x, weight, eps)``, or with a residual ``fused(x, residual, weight, eps)``
    in place, on packed rows."""
    plain, fused = kernels
    sgl_kernel = SGL_KERNEL.require()
    # The kernels index rows as packed [hidden] vectors.
    x, weight = x.contiguous(), weight.contiguous()
    if residual is None:
        normed: torch.Tensor = getattr(sgl_kernel, plain)(x, weight, eps)
        return normed
    residual = residual.contiguous()
    getattr(sgl_kernel, fused)(x, residual, weight, eps)
    return x, residual


def rms_norm(obj: Any, x: torch.Tensor, residual: torch.Tensor | None = None) -> Norm:
    """``x`` ``[num_tokens, hidden]`` normalised with ``obj.weight``/``obj.variance_epsilon``."""
    if x.numel() == 0:
        return x if residual is None else (x, residual)  # one block per row: none to launch
    weight = obj.weight.data
    _operands(x, weight)
    if residual is None and x.dtype not in _HALF:
        raise Unsupported(f"sgl_kernel.rmsnorm has no {x.dtype} kernel")
    return _normalise(_RMSNORM, x, residual, weight, obj.variance_epsilon)


def gemma_rms_norm(obj: Any, x: torch.Tensor, residual: torch.Tensor | None = None) -> Norm:
    """``x`` normalised and scaled by ``1 + obj.weight`` (the kernels add the 1)."""
    if x.numel() == 0:
        return x if residual is None else (x, residual)  # one block per row: none to launch
    weight = obj.weight.data
    _operands(x, weight)
    if x.dtype not in _HALF:
        raise Unsupported(f"sgl_kernel's Gemma norms have no {x.dtype} kernel")
    return _normalise(_GEMMA_RMSNORM, x, residual, weight, obj.variance_epsilon)
