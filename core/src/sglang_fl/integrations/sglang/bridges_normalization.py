"""Bridges of SGLang's Gemma norms and ``LayerNorm`` (``sglang.srt.layers.layernorm``)."""

from __future__ import annotations

from typing import Any

import torch

from ..routing import norm_rows
from .bridges import Bridge, Forward, Handoff

__all__ = ["EpsilonAlias", "GemmaRMSNormBridge", "LayerNormBridge"]

Norm = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


class EpsilonAlias:
    """A layer seen under the contract's attribute names: its ``eps`` as ``variance_epsilon``.

    ``Gemma3RMSNorm`` keeps its epsilon in ``eps``; ``GemmaRMSNorm`` and the FlagOS kernels use
    ``variance_epsilon``. Every other attribute reads through to the layer (live, so reloaded
    weights are seen); attributes an implementation sets stay on this per-layer view.
    """

    def __init__(self, layer: Any) -> None:
        self.layer = layer

    @property
    def variance_epsilon(self) -> float:
        return float(self.layer.eps)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.layer, name)


class GemmaRMSNormBridge(Bridge):
    """``GemmaRMSNorm(x, residual, post_residual_addition)`` and ``Gemma3RMSNorm(x, residual)``."""

    op_name = "gemma_rms_norm"

    def bind(self, layer: Any, fn: Forward, sglang_forward: Forward, handoff: Handoff) -> Forward:
        if not hasattr(layer, "variance_epsilon"):  # Gemma3RMSNorm: eps
            obj = EpsilonAlias(layer)

            def gemma3_rms_norm(x: torch.Tensor, residual: torch.Tensor | None = None) -> Norm:
                return norm_rows(fn, obj, x, residual)

            return gemma3_rms_norm

        def gemma_rms_norm(
            x: torch.Tensor,
            residual: torch.Tensor | None = None,
            post_residual_addition: torch.Tensor | None = None,
        ) -> Norm:
            if residual is not None and post_residual_addition is not None:
                residual = residual + post_residual_addition  # as forward_native adds it first
            return norm_rows(fn, layer, x, residual)

        return gemma_rms_norm


class LayerNormBridge(Bridge):
    op_name = "layer_norm"

    def bind(self, layer: Any, fn: Forward, sglang_forward: Forward, handoff: Handoff) -> Forward:
        hidden = layer.hidden_size

        def layer_norm(x: torch.Tensor) -> torch.Tensor:
            if x.shape[-1] != hidden:
                raise ValueError(f"Expected hidden_size to be {hidden}, but found: {x.shape[-1]}")
            if x.dim() == 2:
                normed: torch.Tensor = fn(layer, x)
                return normed
            rows: torch.Tensor = fn(layer, x.reshape(-1, hidden))
            return rows.reshape(x.shape)

        return layer_norm
