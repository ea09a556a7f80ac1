"""``silu_and_mul`` on ``torch_npu.npu_swiglu``, as ``SiluAndMul.forward_npu`` calls it."""

from __future__ import annotations

from typing import Any

import torch

from ..ascend import TORCH_NPU


def silu_and_mul_npu(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """``swish(x[:, :d]) * x[:, d:]`` (SwiGLU over the last dim) into a new tensor."""
    torch_npu = TORCH_NPU.module or TORCH_NPU.load()
    out: torch.Tensor = torch_npu.npu_swiglu(x)  # the SDK is untyped
    return out
