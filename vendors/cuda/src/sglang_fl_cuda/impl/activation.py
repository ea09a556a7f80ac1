"""``silu_and_mul`` and ``gelu_and_mul`` on ``sgl_kernel``'s act-and-mul kernels, called as
``SiluAndMul.forward_cuda`` / ``GeluAndMul.forward_cuda`` call them.

Constraints of the kernels (``sglang-kernel`` 0.4.x; ``silu_and_mul``, ``gelu_and_mul`` and
``gelu_tanh_and_mul`` share them) and how they are met: rows of a multiple of 16 bytes
(otherwise ``Unsupported``), contiguous input (a strided ``x`` is packed first), at least one
token (an empty batch returns its empty output without a launch).
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.ops.activation.gelu_and_mul import check_approximate
from sglang_fl.types import Unsupported

from ..backend import SGL_KERNEL

# sgl_kernel's act-and-mul kernels load rows in 16-byte vectors and refuse other row widths.
_ROW_ALIGNMENT_BYTES = 16
# GeluAndMul.approximate -> the sgl_kernel kernel computing that GELU.
_GELU_KERNELS = {"none": "gelu_and_mul", "tanh": "gelu_tanh_and_mul"}


def _act_and_mul(kernel_name: str, x: torch.Tensor) -> torch.Tensor:
    """``act(x[:, :d]) * x[:, d:]`` into a new ``[num_tokens, d]`` tensor by ``kernel_name``."""
    if x.shape[-1] * x.element_size() % _ROW_ALIGNMENT_BYTES:
        raise Unsupported(
            f"sgl_kernel.{kernel_name} needs rows of a multiple of {_ROW_ALIGNMENT_BYTES} bytes; "
            f"got {x.shape[-1]} x {x.dtype}"
        )
    out = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out  # the kernel launches one block per token: with none it would fail
    # The kernel reads each token's 2*d values as one packed row.
    getattr(SGL_KERNEL.require(), kernel_name)(x.contiguous(), out)
    return out


def silu_and_mul(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """``silu(x[:, :d]) * x[:, d:]`` into a new ``[num_tokens, d]`` tensor; ``x`` is read only."""
    return _act_and_mul("silu_and_mul", x)


def gelu_and_mul(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """``gelu(x[:, :d]) * x[:, d:]``, erf or tanh GELU as ``obj.approximate`` says."""
    return _act_and_mul(_GELU_KERNELS[check_approximate(obj)], x)
