"""Calls of the ``torch_npu`` double's attention operators for ``test_double_constraints.py``:
valid ones, and for each constraint one call that breaks only it (sources in
``torch_npu_attention_double.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch_npu_attention_double import MASK_SIZE, AttentionOperators
from torch_npu_double import TorchNpuDouble

from sglang_fl.testing.doubles import Constraint

A = AttentionOperators
Call = Callable[[Any], object]
CAUSAL = ~torch.ones(MASK_SIZE, MASK_SIZE, dtype=torch.bool).tril()
INT32 = torch.int32


def t(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


def reshape(**parts: Any) -> Call:
    """A valid store of 3 tokens (2 heads of 16) into caches of 4 blocks of 4 slots."""
    args: dict[str, Any] = {
        "key": t(3, 2, 16),
        "value": t(3, 2, 16),
        "key_cache": t(4, 4, 2, 16),
        "value_cache": t(4, 4, 2, 16),
        "slot_indices": torch.tensor([5, 6, 12], dtype=INT32),
    }
    args.update(parts)
    return lambda sdk: sdk._npu_reshape_and_cache(**args)


def paged(**parts: Any) -> Call:
    """A valid ATB PagedAttention decode: 2 requests (5 and 20 tokens), 4 heads over 2 of 64,
    blocks of 16, ND caches [blocks, 16, 2, 64]."""
    args: dict[str, Any] = {
        "query": t(2, 4, 64),
        "key_cache": t(3, 16, 2, 64),
        "value_cache": t(3, 16, 2, 64),
        "num_kv_heads": 2,
        "num_heads": 4,
        "scale_value": 0.125,
        "block_table": torch.tensor([[2, 0], [0, 1]], dtype=INT32),
        "context_lens": torch.tensor([5, 20], dtype=INT32),
        "out": t(2, 4, 64),
    }
    args.update(parts)
    return lambda sdk: sdk._npu_paged_attention(**args)


def fia(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **args: Any) -> Call:
    return lambda sdk: sdk.npu_fused_infer_attention_score(query, key, value, **args)


def decode(**parts: Any) -> Call:
    """A valid PageAttention decode: 2 requests (5 and 20 tokens), 4 heads over 2 of D=64,
    blocks of 16, BSH."""
    args: dict[str, Any] = {
        "query": t(2, 1, 4 * 64),
        "key": t(3, 16, 2 * 64),
        "value": t(3, 16, 2 * 64),
        "block_table": torch.tensor([[2, 0], [0, 1]], dtype=INT32),
        "actual_seq_lengths_kv": [5, 20],
        "num_heads": 4,
        "num_key_value_heads": 2,
        "input_layout": "BSH",
        "block_size": 16,
        "scale": 0.125,
    }
    args.update(parts)
    return fia(args.pop("query"), args.pop("key"), args.pop("value"), **args)


def extend(**parts: Any) -> Call:
    """A valid PageAttention extend: 2 requests (3 of 130 new, 2 of 2 new), blocks of 128,
    TND with D=128 (what TND takes on A2/A3)."""
    args: dict[str, Any] = {
        "query": t(5, 4, 128),
        "key": t(3, 128, 2 * 128),
        "value": t(3, 128, 2 * 128),
        "block_table": torch.tensor([[1, 2], [0, 0]], dtype=INT32),
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
    return fia(args.pop("query"), args.pop("key"), args.pop("value"), **args)


def per_request(**parts: Any) -> Call:
    """A valid BSND extend of one request (3 new of 130, D=64), blocks of 128."""
    args: dict[str, Any] = {
        "query": t(1, 3, 4, 64),
        "key": t(3, 128, 2 * 64),
        "value": t(3, 128, 2 * 64),
        "block_table": torch.tensor([[1, 2]], dtype=INT32),
        "actual_seq_lengths": [3],
        "actual_seq_lengths_kv": [130],
        "num_heads": 4,
        "num_key_value_heads": 2,
        "input_layout": "BSND",
        "block_size": 128,
        "atten_mask": CAUSAL,
        "sparse_mode": 3,
        "scale": 0.125,
    }
    args.update(parts)
    return fia(args.pop("query"), args.pop("key"), args.pop("value"), **args)


# A window of 8 at one query token: each request's row keeps its last 9 keys (B, KV_S = 32).
WINDOW = torch.ones(2, 32, dtype=torch.bool)
WINDOW[0, :5] = False
WINDOW[1, 11:20] = False


def on_310p(call: Call) -> Call:
    """``call`` on a double emulating an Atlas 300I/310P (SoC 200)."""
    return lambda _: call(TorchNpuDouble(soc_version=200))


ATTENTION_VALID: list[Call] = [
    reshape(),
    reshape(
        key=t(3, 2, 16, dtype=torch.bfloat16),
        value=t(3, 2, 16, dtype=torch.bfloat16),
        key_cache=t(4, 4, 2, 16, dtype=torch.bfloat16),
        value_cache=t(4, 4, 2, 16, dtype=torch.bfloat16),
    ),
    reshape(value=t(3, 2, 8), value_cache=t(4, 4, 2, 8)),  # a narrower value head
    paged(),
    paged(value_cache=t(3, 16, 2, 32), out=t(2, 4, 32)),  # a narrower value head
    decode(),
    decode(
        block_size=32,
        key=t(2, 32, 128),
        value=t(2, 32, 128),
        block_table=torch.tensor([[1], [0]], dtype=INT32),
    ),
    decode(  # one query token: any multiple of 16 up to 512, not only powers of two
        block_size=48,
        key=t(2, 48, 128),
        value=t(2, 48, 128),
        block_table=torch.tensor([[1], [0]], dtype=INT32),
    ),
    decode(atten_mask=WINDOW, sparse_mode=0),
    extend(),
    extend(sparse_mode=4, pre_tokens=4, next_tokens=0),
    extend(sparse_mode=0, atten_mask=None),
    extend(
        block_size=16,
        key=t(12, 16, 256),
        value=t(12, 16, 256),
        block_table=torch.tensor([[*range(1, 10)], [0] * 9], dtype=INT32),
    ),
    extend(query=t(5, 4, 192), key=t(3, 128, 2 * 192), value=t(3, 128, 2 * 128)),
    per_request(),
    per_request(sparse_mode=4, pre_tokens=4, next_tokens=0),
    per_request(
        query=t(1, 1, 4, 64), actual_seq_lengths=[1], atten_mask=None, sparse_mode=0, block_size=128
    ),
]

ATTENTION_REJECTED: dict[Constraint, Call] = {
    A.RESHAPE_DTYPE: reshape(
        value=t(3, 2, 16, dtype=torch.bfloat16), value_cache=t(4, 4, 2, 16, dtype=torch.bfloat16)
    ),
    A.RESHAPE_SHAPES: reshape(slot_indices=torch.tensor([5, 6, 12])),  # int64
    A.RESHAPE_CONTIGUOUS: reshape(key=t(3, 4, 16)[:, ::2]),
    A.RESHAPE_SLOTS: reshape(slot_indices=torch.tensor([5, 6, 5], dtype=INT32)),
    A.RESHAPE_TOKENS: reshape(
        key=t(0, 2, 16), value=t(0, 2, 16), slot_indices=torch.zeros(0, dtype=INT32)
    ),
    A.PAGED_DTYPE: paged(out=t(2, 4, 64, dtype=torch.bfloat16)),
    A.PAGED_SHAPES: on_310p(paged()),
    A.PAGED_BLOCK_SIZE: paged(key_cache=t(3, 8, 2, 64), value_cache=t(3, 8, 2, 64)),
    A.PAGED_CONTIGUOUS: paged(query=t(2, 8, 64)[:, ::2]),
    A.PAGED_LENGTHS: paged(block_table=torch.tensor([[2, 0], [0, 3]], dtype=INT32)),
    A.PAGED_BATCH: paged(
        query=t(0, 4, 64),
        block_table=torch.zeros(0, 2, dtype=INT32),
        context_lens=torch.zeros(0, dtype=INT32),
        out=t(0, 4, 64),
    ),
    A.FIA_DTYPE: decode(query=t(2, 1, 256, dtype=torch.float32)),
    A.FIA_CONTIGUOUS: decode(query=t(2, 1, 512)[..., ::2]),
    A.FIA_HEADS: decode(num_heads=4, num_key_value_heads=3),
    A.FIA_HEAD_DIM: decode(query=t(2, 1, 4 * 36), key=t(3, 16, 72), value=t(3, 16, 72)),
    A.FIA_PAGED: decode(block_table=torch.tensor([[2, 0], [0, 1]])),  # int64
    A.FIA_KV_SHAPE: per_request(value=t(3, 128, 2 * 32)),
    A.FIA_BLOCK_SIZE: per_request(
        block_size=64,
        key=t(6, 64, 128),
        value=t(6, 64, 128),
        block_table=torch.tensor([[1, 2, 3]], dtype=INT32),
    ),
    A.FIA_TND_PAGED: lambda _: extend()(TorchNpuDouble(version="2.8.0.post1")),  # 7.2.0.1
    A.FIA_TND_HEAD_DIM: extend(query=t(5, 4, 64), key=t(3, 128, 2 * 64), value=t(3, 128, 2 * 64)),
    A.FIA_ONE_TOKEN_MASK: decode(atten_mask=WINDOW[:, :16], sparse_mode=0),
    A.FIA_SEQ_KV: decode(actual_seq_lengths_kv=[5, 40]),
    A.FIA_TND: extend(actual_seq_lengths=[3, 4]),
    A.FIA_MASK: extend(atten_mask=CAUSAL.T.contiguous()),
    A.FIA_BATCH: decode(
        query=t(0, 1, 256),
        block_table=torch.zeros(0, 2, dtype=INT32),
        actual_seq_lengths_kv=[],
    ),
}
