"""The bridge of SGLang's ``MRotaryEmbedding`` (``sglang.srt.layers.rotary_embedding.mrope``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...routing import Forward, Handoff, rotate_heads
from .base import Bridge

__all__ = ["MRotaryEmbeddingBridge", "RotaryEmbeddingBridge"]


class RotaryEmbeddingBridge(Bridge):
    op_name = "rotary_embedding"

    def bind(self, layer: Any, fn: Forward, sglang_forward: Forward, handoff: Handoff) -> Forward:
        sglang: Callable[..., tuple[torch.Tensor, torch.Tensor]] = sglang_forward
        rotate, cos_sin = rotate_heads(layer, fn)

        def rotary_embedding(
            positions: torch.Tensor,
            query: torch.Tensor,
            key: torch.Tensor,
            offsets: torch.Tensor | None = None,
            fused_set_kv_buffer_arg: Any = None,
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if fused_set_kv_buffer_arg is not None:
                handoff(
                    "fused_set_kv_buffer_arg (rope fused with the KV-cache write) is "
                    "SGLang's own path"
                )
                return sglang(positions, query, key, offsets, fused_set_kv_buffer_arg)
            if "sin_cos_cache" in layer.__dict__:
                handoff("a precomputed sin_cos_cache on the layer is SGLang's own path")
                return sglang(positions, query, key, offsets, fused_set_kv_buffer_arg)
            if offsets is not None:
                positions = positions + offsets
            return rotate(positions.reshape(-1), query, key)

        rotary_embedding.cos_sin_halves = cos_sin.halves  # type: ignore[attr-defined]  # inspection
        return rotary_embedding


class MRotaryEmbeddingBridge(Bridge):
    """``MRotaryEmbedding(positions, query, key, fused_set_kv_buffer_arg)`` -> ``fn`` as is.

    The standard op already takes SGLang's flattened ``query``/``key`` and ``[tokens]`` or
    ``[3, tokens]`` positions, so the bridge only hands the fused KV-cache write to SGLang.
    """

    op_name = "mrotary_embedding"

    def refuse_instance(self, layer: Any) -> str | None:
        if getattr(layer, "mrope_interleaved_glm", False):
            # SGLang 0.5.23's forward_native ignores the GLM lane layout its kernels apply.
            return (
                "mrope_interleaved_glm: SGLang's forward_native and its kernels lay out GLM's "
                "interleaved sections differently, so there is no one reference; left to SGLang"
            )
        return None

    def bind(self, layer: Any, fn: Forward, sglang_forward: Forward, handoff: Handoff) -> Forward:
        def mrotary_embedding(
            positions: torch.Tensor,
            query: torch.Tensor,
            key: torch.Tensor,
            fused_set_kv_buffer_arg: Any = None,
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if fused_set_kv_buffer_arg is not None:
                handoff(
                    "fused_set_kv_buffer_arg (rope fused with the KV-cache write) is "
                    "SGLang's own path"
                )
                sglang_rotated: tuple[torch.Tensor, torch.Tensor] = sglang_forward(
                    positions, query, key, fused_set_kv_buffer_arg
                )
                return sglang_rotated
            rotated: tuple[torch.Tensor, torch.Tensor] = fn(layer, positions, query, key)
            return rotated

        return mrotary_embedding
