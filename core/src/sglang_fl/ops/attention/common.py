"""What the attention ops share: the KV pool their cases build, and the attention math.

SGLang keeps every layer's keys and values in a token-level pool (``mem_cache/memory_pool.py``
``MHATokenToKVPool``): ``k_buffer[layer]`` is ``[slots, kv_heads, head_dim]``, ``v_buffer`` the
same with ``v_head_dim``, slot 0 is the padding slot. ``req_to_token[row, i]`` is the slot of
token ``i`` of the request in pool row ``row``. With a page size ``P > 1`` the allocator hands
out whole pages: tokens ``i`` and ``i + 1`` of one page lie in consecutive slots and a page
starts at a multiple of ``P``, so ``req_to_token[row, ::P] // P`` is the request's page table;
the layout stays token-level (what ``torch_native`` reads), the pages only constrain it.

The math follows SGLang 0.5.23's ``layers/attention/torch_native_backend.py``
(``TorchNativeAttnBackend``): per request, ``scaled_dot_product_attention`` over the keys
gathered through ``req_to_token``, with the same shapes, flags and masks, so greedy tokens
match that backend exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.nn.functional import scaled_dot_product_attention

from ..contract import Rule, Tolerance, layer

__all__ = [
    "ATTENTION_RULES",
    "ATTENTION_TOLERANCES",
    "EXACT_TOLERANCES",
    "NO_WINDOW",
    "KvPool",
    "attend",
    "attention_layer",
    "build_pool",
    "gather_requests",
    "window_mask",
]

# ``sliding_window_size`` of a layer without a window (RadixAttention's ``-1``).
NO_WINDOW = -1

# Attention outputs are convex combinations of value rows: errors stay at the dtype's rounding.
ATTENTION_TOLERANCES: Mapping[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(atol=2e-5, rtol=2e-5),
    torch.float16: Tolerance(atol=2e-3, rtol=2e-3),
    torch.bfloat16: Tolerance(atol=1.6e-2, rtol=1.6e-2),
}
# Storing into the pool is a copy: exact.
EXACT_TOLERANCES: Mapping[torch.dtype, Tolerance] = {
    dtype: Tolerance(atol=0.0, rtol=0.0) for dtype in ATTENTION_TOLERANCES
}


# The math of ``decode_attention`` and ``extend_attention``, as formulas over a query at position
# ``i`` of its request and that request's key at position ``j`` (both counted from the request's
# first token). Each op adds the rule saying where its queries sit. ``explain`` and the API pages
# print these; the references (:func:`attend`, :func:`window_mask`) compute exactly this.
ATTENTION_RULES: tuple[Rule, ...] = (
    Rule(
        "scores",
        "s(i, j) = (q_i . k_j) * obj.scaling, for query head h and key/value head "
        "h // (heads / kv_heads) (MHA, GQA, MQA). obj.scaling is used as given: SGLang's "
        "RadixAttention.scaling, head_dim ** -0.5 unless the model sets another (e.g. "
        "query_pre_attn_scalar ** -0.5); an implementation never recomputes it from head_dim.",
    ),
    Rule(
        "soft-capping",
        "obj.logit_cap = c > 0: s(i, j) = c * tanh(s(i, j) / c), in float32, after the scaling "
        "and before the mask and the softmax. c = 0: no cap.",
    ),
    Rule(
        "causal mask",
        "obj.is_causal: query i sees the keys j <= i. Not causal (an encoder-only layer): it "
        "sees every key of its request, and the window below does not apply.",
    ),
    Rule(
        "sliding window",
        "obj.sliding_window_size = w >= 0: query i sees the keys i - w <= j <= i, so the key at "
        "i - w is included: w + 1 keys, the query's own among them. w = -1: no window.",
    ),
    Rule(
        "output",
        "o_i = sum over the visible j of softmax_j(s(i, j)) * v_j, returned in q's dtype; "
        "keys and values in another dtype are cast to q's first.",
    ),
)


def attention_layer(
    *,
    scaling: float,
    logit_cap: float = 0.0,
    sliding_window_size: int = NO_WINDOW,
    is_causal: bool = True,
) -> Any:
    """The layer stand-in the attention ops read (built once per layer by the SGLang backend).

    - ``scaling``: the softmax scale (SGLang's ``RadixAttention.scaling``);
    - ``logit_cap``: ``> 0`` caps the scores as ``cap * tanh(score / cap)`` before the mask and
      the softmax (Gemma-2, Grok); ``0`` means none;
    - ``sliding_window_size``: ``-1`` for none; else query position ``i`` sees key positions
      ``i - sliding_window_size <= j <= i`` (torch_native's ``_make_sliding_window_mask``);
    - ``is_causal``: extend attention masks future keys; ``False`` for encoder-only layers,
      which then ignore the window, as torch_native does.
    """
    return layer(
        scaling=float(scaling),
        logit_cap=float(logit_cap),
        sliding_window_size=int(sliding_window_size),
        is_causal=bool(is_causal),
    )


def window_mask(
    q_len: int, kv_len: int, window: int, device: torch.device, query_offset: int = 0
) -> torch.Tensor:
    """``[q_len, kv_len]`` bool, True where query ``query_offset + r`` may see key ``c``."""
    q_pos = torch.arange(query_offset, query_offset + q_len, device=device).unsqueeze(1)
    k_pos = torch.arange(kv_len, device=device).unsqueeze(0)
    return (k_pos <= q_pos) & (k_pos >= q_pos - window)


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    mask: torch.Tensor | None,
    causal: bool,
    scale: float,
    logit_cap: float,
) -> torch.Tensor:
    """``[heads, q_len, v_dim]``: one request's attention (``query`` ``[heads, q_len, dim]``,
    ``key``/``value`` ``[kv_heads, kv_len, dim]``), causal top-left aligned as SDPA's.

    Without a cap this is exactly torch_native's SDPA call; with one, SDPA cannot cap the
    scores, so the scores are computed, capped, masked and normalised in float32.
    """
    gqa = query.shape[0] != key.shape[0]
    if logit_cap <= 0:
        out: torch.Tensor = scaled_dot_product_attention(
            query.unsqueeze(0),
            key.unsqueeze(0),
            value.unsqueeze(0),
            attn_mask=mask,
            enable_gqa=gqa,
            scale=scale,
            is_causal=causal,
        ).squeeze(0)
        return out
    if gqa:
        group = query.shape[0] // key.shape[0]
        key = key.repeat_interleave(group, dim=0)
        value = value.repeat_interleave(group, dim=0)
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale
    scores = logit_cap * torch.tanh(scores / logit_cap)
    if causal:
        q_len, kv_len = scores.shape[-2:]
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=scores.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, value.float()).to(query.dtype)


def gather_requests(
    plan: Any, k_cache: torch.Tensor, v_cache: torch.Tensor, lens: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[kv_heads, sum(lens), dim]`` keys and values of the plan's requests, one after the
    other: request ``i``'s first ``lens[i]`` tokens (``lens``: the plan's host lengths).

    One device gather of the requests' table rows, then one of the slots: no device value is
    read on the host.
    """
    table = plan.req_to_token[plan.req_pool_indices, : max(lens)]  # [batch, longest]
    slots = torch.cat([table[i, :length] for i, length in enumerate(lens)]).long()
    return k_cache[slots].movedim(0, 1), v_cache[slots].movedim(0, 1)


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


class KvPool:
    """A seeded KV pool with requests placed in it, as SGLang's allocator would place them."""

    def __init__(
        self,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        req_to_token: torch.Tensor,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        free_slots: torch.Tensor,
    ) -> None:
        self.k_cache = k_cache
        self.v_cache = v_cache
        self.req_to_token = req_to_token
        self.req_pool_indices = req_pool_indices
        self.seq_lens = seq_lens
        self.free_slots = free_slots  # slots no request uses, in page order


def build_pool(
    seq_lens: Sequence[int],
    *,
    kv_heads: int,
    head_dim: int,
    v_head_dim: int,
    page_size: int,
    dtype: torch.dtype,
    device: torch.device,
    generator: torch.Generator,
    spare_tokens: int = 0,
) -> KvPool:
    """A pool holding ``seq_lens`` tokens per request in shuffled pages, plus spare pages.

    Requests sit in shuffled rows of a larger ``req_to_token`` (as after other requests
    finished); unused entries are 0 (the padding slot), as SGLang leaves them.
    """
    pages_per_req = [-(-length // page_size) for length in seq_lens]
    spare_pages = -(-spare_tokens // page_size) + 1
    num_pages = 1 + sum(pages_per_req) + spare_pages  # page 0 holds the padding slot
    slots = num_pages * page_size
    k_cache = torch.randn((slots, kv_heads, head_dim), generator=generator, dtype=torch.float32).to(
        device, dtype
    )
    v_cache = torch.randn(
        (slots, kv_heads, v_head_dim), generator=generator, dtype=torch.float32
    ).to(device, dtype)
    order = (torch.randperm(num_pages - 1, generator=generator) + 1).tolist()
    rows = len(seq_lens) + 3
    max_context = max([*seq_lens, 1]) + 5
    req_to_token = torch.zeros((rows, max_context), dtype=torch.int32)
    row_order = torch.randperm(rows, generator=generator)[: len(seq_lens)].tolist()
    taken = 0
    for row, length, pages in zip(row_order, seq_lens, pages_per_req, strict=True):
        own = order[taken : taken + pages]
        taken += pages
        for i in range(length):
            req_to_token[row, i] = own[i // page_size] * page_size + i % page_size
    free = [page * page_size + off for page in order[taken:] for off in range(page_size)]
    return KvPool(
        k_cache,
        v_cache,
        req_to_token.to(device),
        torch.tensor(row_order, dtype=torch.int64, device=device),
        torch.tensor(list(seq_lens), dtype=torch.int64, device=device),
        torch.tensor(free, dtype=torch.int64, device=device),
    )


def query_tensor(
    tokens: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    generator: torch.Generator,
    *,
    strided: bool,
) -> torch.Tensor:
    """``[tokens, heads, head_dim]``; ``strided``: the q part of a packed qkv projection."""
    width = heads + 2 * kv_heads if strided else heads
    packed = torch.randn((tokens, width, head_dim), generator=generator, dtype=torch.float32)
    return packed.to(device, dtype)[:, :heads]
