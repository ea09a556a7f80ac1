"""``silu_and_mul`` on ``torch_npu.npu_swiglu``, as ``SiluAndMul.forward_npu`` calls it.

Constraints of the operator (torch_npu API doc of ``npu_swiglu``) and how they are met: no
non-contiguous input (a strided ``x`` is packed first: the contract only reads ``x``, so the
copy is allowed), no empty tensor (an empty batch returns its empty output without a call),
float32/float16/bfloat16 (the contract's dtypes).
"""

from __future__ import annotations

from typing import Any

import torch

from ..backend import TORCH_NPU


def silu_and_mul(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """``swish(x[:, :d]) * x[:, d:]`` (SwiGLU over the last dim) into a new tensor."""
    if x.numel() == 0:
        return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))
    out: torch.Tensor = TORCH_NPU.require().npu_swiglu(x.contiguous())  # the SDK is untyped
    return out
