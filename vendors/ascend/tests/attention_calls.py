"""Calls of the ``torch_npu`` double's attention operators for ``test_double_constraints.py``:
valid ones, and for each constraint one call that breaks only it (sources in
``torch_npu_attention_double.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch_npu_attention_double import MASK_SIZE, AttentionOperators

from sglang_fl.testing.doubles import Constraint

A = AttentionOperators
Call = Callable[[Any], object]
CAUSAL = ~torch.ones(MASK_SIZE, MASK_SIZE, dtype=torch.bool).tril()


def t(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


def reshape(**parts: Any) -> Call:
    """A valid store of 3 tokens (2 heads of 16) into caches of 4 blocks of 4 slots."""
    args: dict[str, Any] = {
        "key": t(3, 2, 16),
        "value": t(3, 2, 16),
        "key_cache": t(4, 4, 2, 16),
        "value_cache": t(4, 4, 2, 16),
        "slot_indices": torch.tensor([5, 6, 12], dtype=torch.int32),
    }
    args.update(parts)
    return lambda sdk: sdk._npu_reshape_and_cache(**args)


def decode(**parts: Any) -> Call:
    """A valid PageAttention decode: 2 requests (5 and 20 tokens), 4 heads over 2 of D=64,
    blocks of 16, BSH."""
    args: dict[str, Any] = {
        "query": t(2, 1, 4 * 64),
        "key": t(3, 16, 2 * 64),
        "value": t(3, 16, 2 * 64),
        "block_table": torch.tensor([[2, 0], [0, 1]], dtype=torch.int32),
        "actual_seq_lengths_kv": [5, 20],
        "num_heads": 4,
        "num_key_value_heads": 2,
        "input_layout": "BSH",
        "block_size": 16,
        "scale": 0.125,
    }
    args.update(parts)
    query, key, value = args.pop("query"), args.pop("key"), args.pop("value")
    return lambda sdk: sdk.npu_fused_infer_attention_score(query, key, value, **args)


def extend(**parts: Any) -> Call:
    """A valid PageAttention extend: 2 requests (3 of 130 new, 2 of 2 new), blocks of 128, TND."""
    args: dict[str, Any] = {
        "query": t(5, 4, 64),
        "key": t(3, 128, 2 * 64),
        "value": t(3, 128, 2 * 64),
        "block_table": torch.tensor([[1, 2], [0, 0]], dtype=torch.int32),
        "actual_seq_lengths": [3, 5],
        "actual_seq_lengths_kv": [130, 2],
        "num_heads": 4,
        "num_key_value_heads": 2,
        "input_layout": "TND",
        "block_size": 128,
        "atten_mask": CAUSAL,
        "sparse_mode": 3,
        "scale": 0.125,
    }
    args.update(parts)
    query, key, value = args.pop("query"), args.pop("key"), args.pop("value")
    return lambda sdk: sdk.npu_fused_infer_attention_score(query, key, value, **args)


ATTENTION_VALID: list[Call] = [
    reshape(),
    reshape(key=t(3, 2, 16, dtype=torch.bfloat16), key_cache=t(4, 4, 2, 16, dtype=torch.bfloat16)),
    reshape(value=t(3, 2, 8), value_cache=t(4, 4, 2, 8)),  # a narrower value head
    decode(),
    decode(
        block_size=32,
        key=t(2, 32, 128),
        value=t(2, 32, 128),
        block_table=torch.tensor([[1], [0]], dtype=torch.int32),
    ),
    extend(),
    extend(sparse_mode=4, pre_tokens=4, next_tokens=0),
    extend(sparse_mode=0, atten_mask=None),
]

ATTENTION_REJECTED: dict[Constraint, Call] = {
    A.RESHAPE_DTYPE: reshape(key=t(3, 2, 16, dtype=torch.float32)),
    A.RESHAPE_SHAPES: reshape(slot_indices=torch.tensor([5, 6, 12])),  # int64
    A.RESHAPE_CONTIGUOUS: reshape(key=t(3, 4, 16)[:, ::2]),
    A.RESHAPE_SLOTS: reshape(slot_indices=torch.tensor([5, 6, 16], dtype=torch.int32)),
    A.RESHAPE_TOKENS: reshape(
        key=t(0, 2, 16), value=t(0, 2, 16), slot_indices=torch.zeros(0, dtype=torch.int32)
    ),
    A.FIA_DTYPE: decode(query=t(2, 1, 256, dtype=torch.float32)),
    A.FIA_CONTIGUOUS: decode(query=t(2, 1, 512)[..., ::2]),
    A.FIA_HEADS: decode(num_heads=4, num_key_value_heads=3),
    A.FIA_HEAD_DIM: decode(query=t(2, 1, 4 * 36), key=t(3, 16, 72), value=t(3, 16, 72)),
    A.FIA_PAGED: decode(block_table=torch.tensor([[2, 0], [0, 1]])),  # int64
    A.FIA_BLOCK_SIZE: extend(block_size=64, key=t(6, 64, 128), value=t(6, 64, 128)),
    A.FIA_SEQ_KV: decode(actual_seq_lengths_kv=[5, 40]),
    A.FIA_TND: extend(actual_seq_lengths=[3, 4]),
    A.FIA_MASK: extend(atten_mask=CAUSAL.T.contiguous()),
    A.FIA_BATCH: decode(
        query=t(0, 1, 256),
        block_table=torch.zeros(0, 2, dtype=torch.int32),
        actual_seq_lengths_kv=[],
    ),
}
