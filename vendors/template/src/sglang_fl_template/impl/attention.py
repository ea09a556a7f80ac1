"""Attention kernel functions on template."""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.types import Unsupported


def clamp_position(obj: Any, seq_lens: torch.Tensor) -> torch.Tensor:
    # max(seq_lens - 1, 0) as a new int64 tensor; seq_lens [batch] is int32 or int64 and
    # stays untouched; exact.
    raise Unsupported("template: clamp_position is not implemented")


def store_kv_cache(
    obj: Any,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    # k [tokens, kv_heads, head_dim] and v (v_head_dim) into rows loc of the layer's pool
    # buffers [slots, kv_heads, head_dim], cast to their dtype, in place; return the caches.
    # A paged-cache kernel may rely on one page's slots being consecutive. Exact.
    raise Unsupported("template: store_kv_cache is not implemented")


def decode_attention(
    obj: Any,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int = 1,
) -> torch.Tensor:
    # q [batch, heads, head_dim], one token per request, over req_to_token[row, :seq_len]
    # slots; obj.scaling, obj.logit_cap (0: none), obj.sliding_window_size (-1: none).
    # Returns [batch, heads, v_head_dim]. Raise Unsupported for options the kernel lacks.
    # A paged kernel takes sglang_fl.ops.attention.paging's page_table / paged_cache.
    raise Unsupported("template: decode_attention is not implemented")


def extend_attention(
    obj: Any,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    page_size: int = 1,
) -> torch.Tensor:
    # Each request's new tokens (q, one request after another) over its cached prefix and
    # themselves; obj.is_causal as well as decode_attention's options.
    # Returns [num_tokens, heads, v_head_dim]. Raise Unsupported for options the kernel lacks.
    raise Unsupported("template: extend_attention is not implemented")
