"""Activations on ``torch_npu``: ``silu_and_mul`` (``npu_swiglu``), ``gelu_and_mul``
(``npu_geglu``), ``gelu_new`` (``npu_gelu``) and ``gelu_quick`` (``npu_fast_gelu``), called
as SGLang's ``forward_npu`` methods call them."""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.ops.gelu_and_mul import check_approximate

from ..ascend import TORCH_NPU

# GeluAndMul.approximate -> npu_geglu's approximate flag (0: erf, 1: tanh).
_GEGLU_APPROXIMATE = {"none": 0, "tanh": 1}


def silu_and_mul_npu(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """``swish(x[:, :d]) * x[:, d:]`` (SwiGLU over the last dim) into a new tensor."""
    torch_npu = TORCH_NPU.module or TORCH_NPU.load()
    return torch_npu.npu_swiglu(x)


def gelu_and_mul_npu(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """``gelu(x[:, :d]) * x[:, d:]`` by ``npu_geglu`` (gate on the left half), a new tensor."""
    approximate = _GEGLU_APPROXIMATE[check_approximate(obj)]
    if x.shape[0] == 0:
        return x.new_empty((0, x.shape[-1] // 2))
    torch_npu = TORCH_NPU.module or TORCH_NPU.load()
    out, _gelu = torch_npu.npu_geglu(x, dim=-1, approximate=approximate, activate_left=True)
    return out


def gelu_new_npu(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """GPT-2's tanh GELU is ``npu_gelu(x, approximate="tanh")`` (the same formula)."""
    if x.numel() == 0:
        return torch.empty_like(x)
    torch_npu = TORCH_NPU.module or TORCH_NPU.load()
    return torch_npu.npu_gelu(x, approximate="tanh")


def gelu_quick_npu(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(1.702 x)`` is ``npu_fast_gelu``'s formula, as ``QuickGELU.forward_npu``."""
    if x.numel() == 0:
        return torch.empty_like(x)
    torch_npu = TORCH_NPU.module or TORCH_NPU.load()
    return torch_npu.npu_fast_gelu(x)
