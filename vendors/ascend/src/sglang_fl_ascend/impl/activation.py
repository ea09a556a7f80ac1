"""Activations on ``torch_npu``, called as SGLang's ``forward_npu`` methods call them:
``silu_and_mul`` (``npu_swiglu``), ``gelu_and_mul`` (``npu_geglu``), ``gelu_new``
(``npu_gelu``) and ``gelu_quick`` (``npu_fast_gelu``).

Constraints of the operators (torch_npu API docs) and how they are met: ``npu_swiglu`` takes
no non-contiguous input (a strided ``x`` is packed first: the contracts only read ``x``, so the
copy is allowed) and no empty tensor; ``npu_geglu``, ``npu_gelu`` and ``npu_fast_gelu`` take
strided inputs as they are (their pages say non-contiguous tensors are supported). An empty
batch returns its empty output without a call, for every operator. float32/float16/bfloat16
are the contracts' dtypes; ``npu_geglu``'s ``approximate`` flag is 0 (erf) or 1 (tanh).

bfloat16: ``npu_gelu``, ``npu_fast_gelu`` and ``npu_geglu`` take it on Atlas A2/A3 only (their
pages list float16/float32 for the training and inference series); on another SoC, as the
probe read it (:func:`~sglang_fl_ascend.backend.platform`), a bfloat16 call is declined.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.ops.activation.gelu_and_mul import check_approximate
from sglang_fl.types import Unsupported

from ..backend import TORCH_NPU, platform

# GeluAndMul.approximate -> npu_geglu's approximate flag (0: erf, 1: tanh).
_GEGLU_APPROXIMATE = {"none": 0, "tanh": 1}


def _check_bf16_gelu(operator: str, x: torch.Tensor) -> None:
    """``Unsupported`` for bfloat16 where the SoC's ``operator`` has no bfloat16 kernel."""
    if x.dtype == torch.bfloat16:
        found = platform()
        if not found.bf16_gelu:
            raise Unsupported(
                f"{operator} takes bfloat16 on Atlas A2/A3 only; this is {found.describe()}"
            )


def _gated_empty(x: torch.Tensor) -> torch.Tensor:
    """The output of a gated activation of an empty batch: the last dim halved."""
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def silu_and_mul(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """``swish(x[:, :d]) * x[:, d:]`` (SwiGLU over the last dim) into a new tensor."""
    if x.numel() == 0:
        return _gated_empty(x)
    out: torch.Tensor = TORCH_NPU.require().npu_swiglu(x.contiguous())  # the SDK is untyped
    return out


def gelu_and_mul(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """``gelu(x[:, :d]) * x[:, d:]`` by ``npu_geglu`` (gate on the left half), a new tensor."""
    approximate = _GEGLU_APPROXIMATE[check_approximate(obj)]
    _check_bf16_gelu("npu_geglu", x)
    if x.numel() == 0:
        return _gated_empty(x)
    out, _gelu = TORCH_NPU.require().npu_geglu(
        x, dim=-1, approximate=approximate, activate_left=True
    )
    return out  # type: ignore[no-any-return]  # the SDK is untyped


def gelu_new(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """GPT-2's tanh GELU is ``npu_gelu(x, approximate="tanh")`` (the same formula)."""
    _check_bf16_gelu("npu_gelu", x)
    if x.numel() == 0:
        return torch.empty_like(x)
    out: torch.Tensor = TORCH_NPU.require().npu_gelu(x, approximate="tanh")
    return out


def gelu_quick(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(1.702 x)`` is ``npu_fast_gelu``'s formula, as ``QuickGELU.forward_npu``."""
    _check_bf16_gelu("npu_fast_gelu", x)
    if x.numel() == 0:
        return torch.empty_like(x)
    out: torch.Tensor = TORCH_NPU.require().npu_fast_gelu(x)
    return out
