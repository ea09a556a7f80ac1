"""``rms_norm`` on ``torch_npu.npu_rms_norm`` / ``npu_add_rms_norm``, as ``RMSNorm.forward_npu``,
``gemma_rms_norm`` on the same two operators with ``1 + weight`` as gamma, as
``GemmaRMSNorm.forward_npu`` does with a residual, and ``layer_norm`` on
``npu_layer_norm_eval`` (SGLang's own ``LayerNorm.forward_npu`` is ``forward_native``).

The operators return new tensors: with a residual, ``npu_add_rms_norm(residual, x, ...)``
returns ``(norm(x + residual), rstd, x + residual)`` and the adapters return the first and the
last; their inputs are left untouched.

Constraints of the operators (torch_npu API docs) and how they are met: gamma in the input's
dtype (``rms_norm``: else ``Unsupported``; ``gemma_rms_norm`` computes ``1 + weight`` in the
input's dtype), no empty tensor for ``npu_add_rms_norm`` (an empty batch is returned without a
call, as ``RMSNorm.forward_cuda`` does, for both operators), float32/float16/bfloat16 (the
contracts' dtypes).
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.types import Unsupported

from ..backend import TORCH_NPU

Normed = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


def _norm(obj: Any, x: torch.Tensor, gamma: torch.Tensor, residual: torch.Tensor | None) -> Normed:
    """``npu_rms_norm`` without a residual, ``npu_add_rms_norm(residual, x, ...)`` with one."""
    torch_npu = TORCH_NPU.require()
    if residual is None:
        normed: torch.Tensor = torch_npu.npu_rms_norm(x, gamma, obj.variance_epsilon)[0]
        return normed
    out, _, residual_out = torch_npu.npu_add_rms_norm(residual, x, gamma, obj.variance_epsilon)
    return out, residual_out


def rms_norm(obj: Any, x: torch.Tensor, residual: torch.Tensor | None = None) -> Normed:
    """``x`` ``[num_tokens, hidden]`` normalised with ``obj.weight``/``obj.variance_epsilon``."""
    if x.numel() == 0:
        return x if residual is None else (x, residual)
    weight = obj.weight.data
    if weight.dtype != x.dtype:
        raise Unsupported(f"torch_npu RMS norms need gamma dtype {x.dtype}, got {weight.dtype}")
    return _norm(obj, x, weight, residual)


def gemma_rms_norm(obj: Any, x: torch.Tensor, residual: torch.Tensor | None = None) -> Normed:
    """``x`` normalised and scaled by ``1 + obj.weight``, passed to the plain RMS norms as their
    gamma (in ``x``'s dtype, as ``GemmaRMSNorm.forward_npu`` passes it to ``npu_add_rms_norm``).

    ``npu_gemma_rms_norm``, which SGLang uses without a residual, is not registered on every
    Ascend generation (SGLang 0.5.23's layernorm.py: not on Ascend 950), so it is not used.
    """
    if x.numel() == 0:
        return torch.empty_like(x) if residual is None else (torch.empty_like(x), x + residual)
    gamma = (1.0 + obj.weight.data.float()).to(x.dtype)
    return _norm(obj, x, gamma, residual)


def layer_norm(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """``x`` ``[num_tokens, hidden]`` layer-normalised by ``npu_layer_norm_eval`` in the layer's
    compute dtype ``obj.dtype``, the result converted back to ``x``'s dtype (as
    ``LayerNorm.forward_native`` computes it); a new tensor, ``x`` untouched.

    ``npu_layer_norm_eval(input, normalized_shape, weight=None, bias=None, eps)`` (torch_npu API
    page ``(beta)torch_npu.npu_layer_norm_eval``) is ``F.layer_norm``'s semantics; a missing
    weight or bias is ones or zeros, so the layer's options pass ``None``. Weight and bias are
    the layer's, in its compute dtype: the operator builds its defaults and statistics in the
    input's and the weight's dtype (op-plugin ``LayerNormEvalKernelNpu.cpp``), so a weight in
    another dtype is declined. Strided inputs are taken as they are (the page says
    non-contiguous tensors are supported); an empty batch returns without a call.
    """
    compute = obj.dtype
    weight = obj.weight if obj.elementwise_affine else None
    bias = obj.bias if obj.use_bias else None
    for name, tensor in (("weight", weight), ("bias", bias)):
        if tensor is not None and tensor.dtype != compute:
            raise Unsupported(
                f"npu_layer_norm_eval needs the {name} in the compute dtype {compute}, "
                f"got {tensor.dtype}"
            )
    if x.numel() == 0:
        return torch.empty_like(x)
    out: torch.Tensor = TORCH_NPU.require().npu_layer_norm_eval(
        x.to(compute), [obj.hidden_size], weight=weight, bias=bias, eps=obj.variance_epsilon
    )
    return out.to(x.dtype)
