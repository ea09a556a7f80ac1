"""Attention kernel functions on template."""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.types import AttentionPlan, Unsupported


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
    obj: Any, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionPlan
) -> torch.Tensor:
    # q [batch, heads, head_dim], one token per request; the pool [slots, kv_heads, head_dim].
    # plan: this forward's plan, made once for all layers (plan.page_table [batch, pages]
    # int32, plan.cache_seqlens int32, plan.cu_seqlens_q, plan.max_seqlen_q, plan.page_size;
    # host copies of the lengths in plan.seq_lens_host). Read no device value on the host
    # here (no .item()/.tolist()/.cpu()): the kit fails such a call. obj.scaling,
    # obj.logit_cap (0: none), obj.sliding_window_size (-1: none). Returns
    # [batch, heads, v_head_dim]. Raise Unsupported for options the kernel lacks. A kernel that
    # plans its own metadata once per forward registers a planner: subclass
    # sglang_fl.types.DefaultPlanner (a plan subclassing AttentionPlan) and pass
    # backend.implementations(..., planner=...); DefaultPlanner({}) declares that these calls
    # replay under CUDA/NPU graphs.
    raise Unsupported("template: decode_attention is not implemented")


def extend_attention(
    obj: Any, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionPlan
) -> torch.Tensor:
    # Each request's new tokens (q, one request after another, starting at
    # plan.cu_seqlens_q[i]) over its cached prefix and themselves (plan.extend_prefix_lens,
    # plan.extend_seq_lens); obj.is_causal as well as decode_attention's options.
    # Returns [num_tokens, heads, v_head_dim]. Raise Unsupported for options the kernel lacks.
    raise Unsupported("template: extend_attention is not implemented")
