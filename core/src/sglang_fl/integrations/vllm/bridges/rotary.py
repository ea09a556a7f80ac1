"""Bridges of vLLM's rotary embeddings (``vllm.model_executor.layers.rotary_embedding``)."""

from __future__ import annotations

from typing import Any

import torch

from ...routing import Forward, Handoff, rotate_heads
from .base import VllmBridge

__all__ = ["MRotaryEmbeddingBridge", "RotaryEmbeddingBridge"]

Rotated = tuple[torch.Tensor, torch.Tensor | None]


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
