"""Bridges of vLLM's norms (``vllm.model_executor.layers.layernorm``)."""

from __future__ import annotations

from typing import Any

import torch

from ...routing import Forward, Handoff, NormResult, norm_rows
from .base import VllmBridge

__all__ = ["GemmaRMSNormBridge", "LayerNormBridge", "LayerNormView", "RMSNormBridge"]


def _checked_norm(layer: Any, fn: Forward, hidden: int) -> Forward:
    """``forward(x, residual=None)`` of a residual norm: ``fn`` on 2-D rows."""

    def norm(x: torch.Tensor, residual: torch.Tensor | None = None) -> NormResult:
        if x.shape[-1] != hidden:
            raise ValueError(f"Expected hidden_size to be {hidden}, but found: {x.shape[-1]}")
        return norm_rows(fn, layer, x, residual)

    return norm


class RMSNormBridge(VllmBridge):
    op_name = "rms_norm"

    def refuse_instance(self, layer: Any) -> str | None:
        if layer.variance_size_override is not None:
            return (
                f"RMSNorm var_hidden_size={layer.variance_size_override} (statistics over part "
                "of the row) is outside rms_norm; left to vLLM"
            )
        return None

    def bind(self, layer: Any, fn: Forward, vllm_forward: Forward, handoff: Handoff) -> Forward:
        return _checked_norm(layer, fn, layer.hidden_size)


class GemmaRMSNormBridge(VllmBridge):
    op_name = "gemma_rms_norm"

    def bind(self, layer: Any, fn: Forward, vllm_forward: Forward, handoff: Handoff) -> Forward:
        return _checked_norm(layer, fn, layer.weight.shape[0])


class LayerNormView:
    """vLLM's ``LayerNorm`` under the contract's attribute names, for one compute dtype.

    vLLM keeps ``eps`` and ``normalized_shape``, has no weight (and no bias) without
    ``elementwise_affine``, and normalises in the wider of the input and weight dtypes; the
    contract reads ``variance_epsilon``, ``hidden_size``, ``elementwise_affine``, ``use_bias``
    and ``dtype`` (the compute dtype). Weights are read live, so reloaded ones are seen.
    """

    def __init__(self, layer: Any, dtype: torch.dtype) -> None:
        self.layer = layer
        self.dtype = dtype
        self.hidden_size = int(layer.normalized_shape[0])

    @property
    def weight(self) -> torch.Tensor | None:
        weight: torch.Tensor | None = self.layer.weight
        return weight

    @property
    def bias(self) -> torch.Tensor | None:
        bias: torch.Tensor | None = self.layer.bias
        return bias

    @property
    def elementwise_affine(self) -> bool:
        return self.layer.weight is not None

    @property
    def use_bias(self) -> bool:
        return self.layer.bias is not None

    @property
    def variance_epsilon(self) -> float:
        return float(self.layer.eps)


class LayerNormBridge(VllmBridge):
    op_name = "layer_norm"

    def bind(self, layer: Any, fn: Forward, vllm_forward: Forward, handoff: Handoff) -> Forward:
        views: dict[torch.dtype, LayerNormView] = {}  # input dtype -> the view it computes in
        hidden = int(layer.normalized_shape[0])

        def view(dtype: torch.dtype) -> LayerNormView:
            found = views.get(dtype)
            if found is None:
                weight = layer.weight
                compute = dtype if weight is None else torch.promote_types(dtype, weight.dtype)
                found = views[dtype] = LayerNormView(layer, compute)
            return found

        def layer_norm(x: torch.Tensor) -> torch.Tensor:
            if x.shape[-1] != hidden:
                raise ValueError(f"Expected hidden_size to be {hidden}, but found: {x.shape[-1]}")
            obj = view(x.dtype)
            if x.dim() == 2:
                normed: torch.Tensor = fn(obj, x)
                return normed
            rows: torch.Tensor = fn(obj, x.reshape(-1, hidden))
            return rows.reshape(x.shape)

        return layer_norm
