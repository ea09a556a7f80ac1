"""The attention ops on torch_npu, as SGLang 0.5.23's Ascend backend calls them
(``hardware_backend/npu/attention/ascend_backend.py``, ``memory_pool_npu.py``).

- ``store_kv_cache``: ``torch_npu._npu_reshape_and_cache(key, value, key_cache, value_cache,
  slot_indices)`` (an ATB ReshapeAndCache operation) with the pool viewed as blocks of one slot:
  slot ``s`` is block ``s``, offset 0, the same address as in any page size, so the op needs no
  page size. float16/bfloat16 pools only (ATB ReshapeAndCache's dtypes, int8 aside).
- ``decode_attention``: ``npu_fused_infer_attention_score`` with PageAttention (``block_table``,
  ``block_size``) in the ``BSH`` layout the API reference asks for a ``[blocks, block_size,
  kv_heads * head_dim]`` cache, ``actual_seq_lengths_kv`` the requests' lengths.
- ``extend_attention``: the same operator in the ``TND`` layout SGLang's extend uses:
  ``actual_seq_lengths`` the cumulative new-token counts, ``sparse_mode=3`` (right-down causal,
  with the 2048 x 2048 mask the API requires), ``sparse_mode=4`` (band: ``pre_tokens`` =
  window, ``next_tokens`` = 0) for a sliding window, ``sparse_mode=0`` without a mask for a
  non-causal layer.

Both attention calls take the forward's plan (core's default planner): ``block_table`` is its
page table, and the operator's host-side lengths (``actual_seq_lengths``,
``actual_seq_lengths_kv``) come from its host lengths, read once per forward, so no layer
reads a device value on the host. The operator takes those lengths as Python lists, which a
recorded NPU graph would replay unchanged: the adapters declare no device-graph mode (the
default planner's answer); ``torch.compile`` runs them.

Declined with ``Unsupported`` before any call, each citing the torch_npu API reference page of
``torch_npu.npu_fused_infer_attention_score`` (op-plugin ``docs/zh/custom_APIs/torch_npu/``):
float32 (float16/bfloat16 only), soft-capping (the operator has no cap), a window in decode
(``pre_tokens`` "Q_S=1时无效"), a value head size other than the key's (one D for key and
value), head sizes over 512 or not 16-byte aligned, more than 256 heads or a group over 64, and
PageAttention block sizes outside "Q_S > 1: 128..512, multiples of 128; Q_S = 1: up to 512,
16-aligned". Empty batches return without a call.
"""

from __future__ import annotations

import functools
from enum import IntEnum
from itertools import accumulate
from typing import Any

import torch

from sglang_fl.ops.attention import NO_WINDOW
from sglang_fl.types import AttentionPlan, Unsupported

from ..backend import TORCH_NPU

__all__ = ["decode_attention", "extend_attention", "store_kv_cache"]

_FIA = "torch_npu API reference, torch_npu.npu_fused_infer_attention_score"
_RESHAPE = "ATB ReshapeAndCache (torch_npu._npu_reshape_and_cache)"
_HALF = frozenset({torch.float16, torch.bfloat16})
MAX_HEAD_DIM = 512
MAX_HEADS = 256
MAX_GROUP = 64  # num_heads / num_key_value_heads
MAX_BLOCK = 512
PREFILL_BLOCK = 128  # Q_S > 1: block_size a multiple of 128, at least 128
DECODE_BLOCK_ALIGN = 16
MAX_TND_BATCH = 4096  # TND: actual_seq_lengths has at most 4096 elements
MASK_SIZE = 2048  # sparse_mode 2/3/4: a (2048, 2048) mask, upper triangle True


class SparseMode(IntEnum):
    """``npu_fused_infer_attention_score``'s ``sparse_mode`` values the adapters use."""

    DEFAULT = 0  # no atten_mask: every key
    RIGHT_DOWN_CAUSAL = 3
    BAND = 4  # pre_tokens / next_tokens around the right-down diagonal


def store_kv_cache(
    obj: Any,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``k``/``v`` into slots ``loc`` of the caches, in place (SGLang's NPU set_kv_buffer)."""
    if k_cache.dtype not in _HALF or v_cache.dtype not in _HALF:
        raise Unsupported(
            f"{_RESHAPE} stores float16/bfloat16 (or int8) caches, not "
            f"{k_cache.dtype}/{v_cache.dtype}"
        )
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise Unsupported(f"{_RESHAPE} writes contiguous [blocks, block_size, heads, dim] caches")
    if loc.shape[0] == 0:
        return k_cache, v_cache
    kv_heads = k_cache.shape[1]
    _operator("_npu_reshape_and_cache")(
        key=k.to(k_cache.dtype).contiguous(),
        value=v.to(v_cache.dtype).contiguous(),
        key_cache=k_cache.view(-1, 1, kv_heads, k_cache.shape[-1]),
        value_cache=v_cache.view(-1, 1, kv_heads, v_cache.shape[-1]),
        slot_indices=loc.to(torch.int32),
    )
    return k_cache, v_cache


def _operator(name: str) -> Any:
    """``torch_npu.<name>``, or ``Unsupported`` on a release without it (the backend's probe
    does not require the attention operators, so older releases still serve the other ops)."""
    torch_npu = TORCH_NPU.require()
    operator = getattr(torch_npu, name, None)
    if operator is None:
        version = getattr(torch_npu, "__version__", "?")
        raise Unsupported(f"torch_npu {version} has no {name}")
    return operator


def _check(
    obj: Any, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_size: int
) -> None:
    """Decline what the fused attention operator cannot serve, for decode and extend alike."""
    if q.dtype not in _HALF:
        raise Unsupported(f"{_FIA}: query float16/bfloat16 only, not {q.dtype}")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise Unsupported(
            f"{_FIA}: key/value in the query's dtype {q.dtype} (int8 aside), got "
            f"{k_cache.dtype}/{v_cache.dtype}"
        )
    if obj.logit_cap > 0:
        raise Unsupported(f"{_FIA} has no logit soft-capping parameter")
    heads, d = q.shape[1], q.shape[2]
    kv_heads, dv = k_cache.shape[1], v_cache.shape[-1]
    if dv != d:
        raise Unsupported(f"{_FIA}: key and value share one head dim D, got {d} and {dv}")
    if d > MAX_HEAD_DIM or d * q.dtype.itemsize % 16:
        raise Unsupported(
            f"{_FIA}: head dim D <= {MAX_HEAD_DIM} and 16-byte aligned in float16/bfloat16, got {d}"
        )
    if heads > MAX_HEADS or heads // kv_heads > MAX_GROUP:
        raise Unsupported(
            f"{_FIA}: at most {MAX_HEADS} heads and num_heads / num_key_value_heads <= "
            f"{MAX_GROUP}, got {heads}/{kv_heads}"
        )
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise Unsupported(f"{_FIA}: key/value contiguous ('不支持非连续Tensor')")
    if page_size > MAX_BLOCK:
        raise Unsupported(f"{_FIA}: block_size <= {MAX_BLOCK}, got page size {page_size}")


def _blocks(cache: torch.Tensor, page_size: int) -> torch.Tensor:
    """The pool as PageAttention's ``[blocks, block_size, kv_heads * dim]`` (BnBsH)."""
    return cache.view(-1, page_size, cache.shape[1] * cache.shape[2])


def decode_attention(
    obj: Any, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionPlan
) -> torch.Tensor:
    """One query per request: ``BSH`` query ``[batch, 1, heads * dim]`` over the paged pool."""
    page_size = plan.page_size
    _check(obj, q, k_cache, v_cache, page_size)
    if obj.sliding_window_size > NO_WINDOW:
        raise Unsupported(f"{_FIA}: pre_tokens has no effect with one query token ('Q_S=1时无效')")
    if page_size % DECODE_BLOCK_ALIGN:
        raise Unsupported(
            f"{_FIA}: with one query token block_size is 16-aligned (float16/bfloat16), "
            f"got page size {page_size}"
        )
    batch, heads, d = q.shape
    if batch == 0:
        return q.new_empty((0, heads, d))
    out, _ = _operator("npu_fused_infer_attention_score")(
        q.contiguous().view(batch, 1, heads * d),
        _blocks(k_cache, page_size),
        _blocks(v_cache, page_size),
        num_heads=heads,
        num_key_value_heads=k_cache.shape[1],
        input_layout="BSH",
        block_table=plan.page_table,
        block_size=page_size,
        actual_seq_lengths_kv=plan.seq_lens_host.tolist(),
        scale=obj.scaling,
    )
    result: torch.Tensor = out.view(batch, heads, d)
    return result


def extend_attention(
    obj: Any, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionPlan
) -> torch.Tensor:
    """The new tokens as a ``TND`` query over the paged pool, right-down causal (or banded)."""
    page_size = plan.page_size
    _check(obj, q, k_cache, v_cache, page_size)
    if page_size < PREFILL_BLOCK or page_size % PREFILL_BLOCK:
        raise Unsupported(
            f"{_FIA}: with more than one query token block_size is 128..512 in multiples of "
            f"128, got page size {page_size}"
        )
    if plan.batch_size > MAX_TND_BATCH:
        raise Unsupported(f"{_FIA}: TND takes at most {MAX_TND_BATCH} requests")
    assert plan.extend_seq_lens_host is not None  # an extend plan
    tokens, heads, d = q.shape
    if tokens == 0 or plan.batch_size == 0:
        return q.new_empty((tokens, heads, d))
    options: dict[str, Any] = {"sparse_mode": SparseMode.DEFAULT}
    if obj.is_causal:
        options = {
            "atten_mask": _causal_mask(q.device),
            "sparse_mode": SparseMode.RIGHT_DOWN_CAUSAL,
        }
        if obj.sliding_window_size > NO_WINDOW:
            options.update(
                sparse_mode=SparseMode.BAND, pre_tokens=obj.sliding_window_size, next_tokens=0
            )
    out, _ = _operator("npu_fused_infer_attention_score")(
        q.contiguous(),
        _blocks(k_cache, page_size),
        _blocks(v_cache, page_size),
        num_heads=heads,
        num_key_value_heads=k_cache.shape[1],
        input_layout="TND",
        block_table=plan.page_table,
        block_size=page_size,
        actual_seq_lengths=list(accumulate(plan.extend_seq_lens_host.tolist())),
        actual_seq_lengths_kv=plan.seq_lens_host.tolist(),
        scale=obj.scaling,
        **options,
    )
    result: torch.Tensor = out
    return result


@functools.cache
def _causal_mask(device: torch.device) -> torch.Tensor:
    """The operator's optimised causal mask: ``[2048, 2048]`` bool, True above the diagonal
    (SGLang's ``generate_mask_flag``), built once per device."""
    return ~torch.ones((MASK_SIZE, MASK_SIZE), dtype=torch.bool, device=device).tril()
