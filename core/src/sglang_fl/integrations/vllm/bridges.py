"""Bridges: vLLM layer call arguments -> the standard op signatures, bound once per layer.

The op implementations are the ones SGLang's bridges call; only the call shapes differ
(vLLM's rope takes ``(positions, query, key=None)``, its ``LayerNorm`` keeps ``eps`` and
reduces in the wider of the input and weight dtypes, ...). A bridge must compute exactly what
the layer's ``forward_native`` computes, or the layer (or the one call) stays with vLLM.
"""

from __future__ import annotations

from typing import Any

import torch

from ...ops.gelu_and_mul import APPROXIMATIONS
from .. import routing
from ..routing import (
    Forward,
    Handoff,
    NormResult,
    norm_rows,
    rotate_heads,
    rows_forward,
)

__all__ = ["BRIDGES", "VllmBridge"]

Rotated = tuple[torch.Tensor, torch.Tensor | None]


class VllmBridge(routing.Bridge):
    """How one standard op is bridged to its vLLM layer class."""

    engine = "vLLM"


class SiluAndMulBridge(VllmBridge):
    op_name = "silu_and_mul"

    def bind(self, layer: Any, fn: Forward, vllm_forward: Forward, handoff: Handoff) -> Forward:
        return rows_forward(layer, fn, halves=True)


class GeluAndMulBridge(VllmBridge):
    op_name = "gelu_and_mul"

    def refuse_instance(self, layer: Any) -> str | None:
        if layer.approximate not in APPROXIMATIONS:
            return (
                f"GeluAndMul approximate={layer.approximate!r} is outside gelu_and_mul "
                f"({', '.join(APPROXIMATIONS)}); left to vLLM"
            )
        return None

    def bind(self, layer: Any, fn: Forward, vllm_forward: Forward, handoff: Handoff) -> Forward:
        return rows_forward(layer, fn, halves=True)


class ElementwiseBridge(VllmBridge):
    """``NewGELU`` and ``QuickGELU``: one tensor in, one of the same shape out."""

    def bind(self, layer: Any, fn: Forward, vllm_forward: Forward, handoff: Handoff) -> Forward:
        return rows_forward(layer, fn, halves=False)


class GeluNewBridge(ElementwiseBridge):
    op_name = "gelu_new"


class GeluQuickBridge(ElementwiseBridge):
    op_name = "gelu_quick"


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


class RotaryEmbeddingBridge(VllmBridge):
    """``RotaryEmbedding(positions, query, key=None)``: rotates the heads' rotary part in place.

    vLLM's ``forward_native`` returns new tensors; its kernels (``forward_cuda``) rotate
    ``query``/``key`` in place and return them, so callers take the returned tensors either way.
    """

    op_name = "rotary_embedding"

    def bind(self, layer: Any, fn: Forward, vllm_forward: Forward, handoff: Handoff) -> Forward:
        rotate, _ = rotate_heads(layer, fn)

        def rotary_embedding(
            positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None = None
        ) -> Rotated:
            if key is None:
                handoff("a call without key (cross-layer KV sharing) is vLLM's own path")
                vllm_rotated: Rotated = vllm_forward(positions, query, key)
                return vllm_rotated
            return rotate(positions.flatten(), query, key)

        return rotary_embedding


class MRotaryEmbeddingBridge(VllmBridge):
    """``MRotaryEmbedding(positions, query, key=None, offsets=None)`` -> ``fn`` as is.

    The standard op takes vLLM's flattened ``query``/``key`` and ``[tokens]`` or
    ``[3, tokens]`` positions as they are.
    """

    op_name = "mrotary_embedding"

    def bind(self, layer: Any, fn: Forward, vllm_forward: Forward, handoff: Handoff) -> Forward:
        def mrotary_embedding(
            positions: torch.Tensor,
            query: torch.Tensor,
            key: torch.Tensor | None = None,
            offsets: torch.Tensor | None = None,
        ) -> Rotated:
            if key is None or offsets is not None:
                handoff("a call without key, or with offsets, is vLLM's own path")
                vllm_rotated: Rotated = vllm_forward(positions, query, key, offsets)
                return vllm_rotated
            rotated: tuple[torch.Tensor, torch.Tensor] = fn(layer, positions, query, key)
            return rotated

        return mrotary_embedding


BRIDGES: dict[str, VllmBridge] = {
    bridge.op_name: bridge
    for bridge in (
        SiluAndMulBridge(),
        GeluAndMulBridge(),
        GeluNewBridge(),
        GeluQuickBridge(),
        RMSNormBridge(),
        GemmaRMSNormBridge(),
        LayerNormBridge(),
        RotaryEmbeddingBridge(),
        MRotaryEmbeddingBridge(),
    )
}
