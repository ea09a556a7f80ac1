"""Attention ops: what an SGLang attention backend runs per layer, as standard ops.

``store_kv_cache`` writes a forward's new K/V into SGLang's KV pool; ``decode_attention`` and
``extend_attention`` attend over it. :mod:`sglang_fl.integrations.sglang.attention_backend`
builds SGLang's ``sglang_fl`` attention backend around whichever implementations the policy
chooses; the references follow SGLang's ``torch_native`` backend. ``clamp_position`` (the decode
positions that index the rope and KV caches) belongs to SGLang's attention path too.
:mod:`.sglang_backend` is the SGLang-only contract of a whole backend a vendor offers instead.
"""

from __future__ import annotations

from .common import NO_WINDOW, attention_layer
from .decode import DECODE_ATTENTION
from .extend import EXTEND_ATTENTION
from .sglang_backend import SGLANG_ATTENTION_BACKEND, SglangAttentionBackendOffer
from .store import STORE_KV_CACHE

__all__ = [
    "DECODE_ATTENTION",
    "EXTEND_ATTENTION",
    "NO_WINDOW",
    "SGLANG_ATTENTION_BACKEND",
    "STORE_KV_CACHE",
    "SglangAttentionBackendOffer",
    "attention_layer",
]
