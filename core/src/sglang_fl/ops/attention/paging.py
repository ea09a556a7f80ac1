"""The paged view of the attention ops' arguments, as paged attention kernels take them.

FlashAttention-3 (``sgl_kernel``) and Ascend's fused inference attention read the KV pool as
pages (``[pages, page_size, kv_heads, head_dim]``) through a per-request block table, as
SGLang's own ``fa3`` and ``ascend`` backends build them from ``req_to_token`` (see
:mod:`.common` for why ``req_to_token[row, ::page_size] // page_size`` is a page table).
Every vendor adapter of a paged kernel derives them here, once.
"""

from __future__ import annotations

import torch

__all__ = ["cumulative_lengths", "page_table", "paged_cache"]


def page_table(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
) -> torch.Tensor:
    """``[batch, max_pages]`` contiguous int32: the pages of each request, in token order.

    ``max_pages`` covers the longest request; shorter rows end in page ids the kernels never
    read (they stop at each request's length).
    """
    max_len = int(seq_lens.max()) if seq_lens.numel() else 0
    slots = req_to_token[req_pool_indices.long(), :max_len]
    return (slots[:, ::page_size] // page_size).to(torch.int32).contiguous()


def paged_cache(cache: torch.Tensor, page_size: int) -> torch.Tensor:
    """``[slots, kv_heads, dim]`` as ``[slots // page_size, page_size, kv_heads, dim]``, a view.

    Built from the buffer's own strides (as SGLang's ``mem_cache/layout/paged_view.py``), so a
    strided pool buffer keeps its slot stride. The pool always holds whole pages.
    """
    slots = int(cache.shape[0])
    if slots % page_size:
        raise ValueError(f"a KV pool of {slots} slots is not whole pages of {page_size}")
    stride = cache.stride(0)
    return cache.as_strided(
        (slots // page_size, page_size, *cache.shape[1:]),
        (stride * page_size, stride, *cache.stride()[1:]),
    )


def cumulative_lengths(lengths: torch.Tensor, *, leading_zero: bool = True) -> torch.Tensor:
    """int32 running sums of ``lengths`` (``[0, l0, l0 + l1, ...]`` with ``leading_zero``)."""
    sums = torch.cumsum(lengths.to(torch.int64), dim=0).to(torch.int32)
    if not leading_zero:
        return sums
    return torch.cat([sums.new_zeros(1), sums])
