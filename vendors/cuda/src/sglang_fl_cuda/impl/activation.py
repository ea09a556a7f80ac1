"""``silu_and_mul`` and ``gelu_and_mul`` on ``sgl_kernel``'s act-and-mul kernels, called as
``SiluAndMul.forward_cuda`` / ``GeluAndMul.forward_cuda`` call them.

Constraints of the kernels (``sglang-kernel`` 0.4.x; ``silu_and_mul``, ``gelu_and_mul`` and
``gelu_tanh_and_mul`` share them) and how they are met: each *half* row (``d`` values) a whole
number of 16-byte vectors (otherwise ``Unsupported``), contiguous input (a strided ``x`` is
packed first), at least one token (an empty batch returns its empty output without a launch).

The wrapper (``sgl_kernel/elementwise.py``) only checks the whole row, ``2 * d * itemsize``,
but FlashInfer's ``act_and_mul_kernel`` (``include/flashinfer/activation.cuh``) loads the gate
at ``input + t * 2d`` and the up half at ``input + t * 2d + d`` in 16-byte vectors and the
launcher (``csrc/elementwise/activation.cu``) starts ``min(d / (16 / itemsize), 1024)`` threads
per token: with ``d * itemsize`` not a multiple of 16 the up-half loads are misaligned, and with
``d < 16 / itemsize`` the block has no thread (an invalid launch, or an output never written).
So ``d * itemsize % 16 == 0`` is required; float16 ``d = 4``, or float32 ``d = 2``, pass the
wrapper's check and are declined here.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.ops.activation.gelu_and_mul import check_approximate
from sglang_fl.types import Unsupported

from ..backend import SGL_KERNEL

# sgl_kernel's act-and-mul kernels load each half row in 16-byte vectors.
_VECTOR_BYTES = 16
# GeluAndMul.approximate -> the sgl_kernel kernel computing that GELU.
_GELU_KERNELS = {"none": "gelu_and_mul", "tanh": "gelu_tanh_and_mul"}


def _act_and_mul(kernel_name: str, x: torch.Tensor) -> torch.Tensor:
    """``act(x[:, :d]) * x[:, d:]`` into a new ``[num_tokens, d]`` tensor by ``kernel_name``."""
    d = x.shape[-1] // 2
    if d == 0 or d * x.element_size() % _VECTOR_BYTES:
        raise Unsupported(
            f"sgl_kernel.{kernel_name} needs each half row (d values) to be a multiple of "
            f"{_VECTOR_BYTES} bytes; got d={d} x {x.dtype}"
        )
    out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
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
