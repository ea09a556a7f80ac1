"""The paged view of the attention ops' arguments (``sglang_fl.ops.attention.paging``): the page
table and paged pool a paged kernel reads address exactly the slots ``req_to_token`` names."""

from __future__ import annotations

import pytest
import torch

from sglang_fl.ops.attention.common import build_pool
from sglang_fl.ops.attention.paging import cumulative_lengths, page_table, paged_cache


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_pages_and_offsets_address_the_slots_of_req_to_token(page_size: int) -> None:
    pool = build_pool(
        (5, 17, 1),
        kv_heads=2,
        head_dim=8,
        v_head_dim=4,
        page_size=page_size,
        dtype=torch.float32,
        device=torch.device("cpu"),
        generator=torch.Generator().manual_seed(0),
    )
    table = page_table(pool.req_to_token, pool.req_pool_indices, pool.seq_lens, page_size)
    assert table.dtype == torch.int32
    assert table.is_contiguous()
    assert table.shape == (3, -(-17 // page_size))
    paged = paged_cache(pool.k_cache, page_size)
    assert paged.shape == (pool.k_cache.shape[0] // page_size, page_size, 2, 8)
    assert paged.data_ptr() == pool.k_cache.data_ptr()
    for b, (row, length) in enumerate(zip(pool.req_pool_indices, pool.seq_lens, strict=True)):
        slots = pool.req_to_token[row, :length].long()
        pages = table[b, : -(-int(length) // page_size)].long()
        keys = paged[pages].reshape(-1, 2, 8)[:length]
        assert torch.equal(keys, pool.k_cache[slots])


def test_a_strided_pool_keeps_its_slot_stride() -> None:
    buffer = torch.arange(8 * 2 * 6, dtype=torch.float32).view(8, 2, 6)[:, :, :4]  # v of a kv
    paged = paged_cache(buffer, 4)
    assert torch.equal(paged.reshape(8, 2, 4), buffer)


def test_a_pool_of_partial_pages_is_refused() -> None:
    with pytest.raises(ValueError, match="not whole pages of 4"):
        paged_cache(torch.zeros(6, 2, 8), 4)


def test_an_empty_batch_has_an_empty_table() -> None:
    empty = torch.zeros(0, dtype=torch.int64)
    table = page_table(torch.zeros(2, 8, dtype=torch.int32), empty, empty, 4)
    assert table.shape == (0, 0)


def test_cumulative_lengths() -> None:
    lens = torch.tensor([3, 0, 5])
    assert cumulative_lengths(lens).tolist() == [0, 3, 3, 8]
    assert cumulative_lengths(lens, leading_zero=False).tolist() == [3, 3, 8]
    assert cumulative_lengths(lens).dtype == torch.int32
