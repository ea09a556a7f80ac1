"""The attention ops on torch_npu, as SGLang 0.5.23's Ascend backend calls them
(``hardware_backend/npu/attention/ascend_backend.py``, ``memory_pool_npu.py``).

- ``store_kv_cache``: ``torch_npu._npu_reshape_and_cache(key, value, key_cache, value_cache,
  slot_indices)`` (an ATB ReshapeAndCache operation) with the pool viewed as blocks of one slot:
  slot ``s`` is block ``s``, offset 0, the same address as in any page size, so the op needs no
  page size.
- ``decode_attention``: SGLang's default decode, ``torch_npu._npu_paged_attention`` (an ATB
  PagedAttention operation; ``forward_decode`` without ``ASCEND_USE_FIA``), or
  ``npu_fused_infer_attention_score`` (FIA) with PageAttention in the ``BSH`` layout
  (``ASCEND_USE_FIA=1``, read with the platform, puts FIA first). Each serves what the other
  declines: PagedAttention has no window, FIA takes one as SGLang's ``swa_mask``, a
  ``(B, KV_S)`` bool mask at one query token; FIA needs one head size for key and value,
  PagedAttention does not; FIA takes blocks of 16 up to 512, PagedAttention up to 128.
- ``extend_attention``: FIA in the ``TND`` layout where Atlas A2/A3's TND holds (a 7.3.0
  build or later, whose pages first allow PageAttention in TND; head sizes 128, or 192 with a
  value head of 128/192; blocks in multiples of 16 up to 1024), else one
  ``BSND`` call per request (what SGLang does when ``_can_use_tnd`` is false):
  ``sparse_mode=3`` (right-down causal, with the 2048 x 2048 mask the API requires),
  ``sparse_mode=4`` (band: ``pre_tokens`` = window, ``next_tokens`` = 0) for a sliding window,
  ``sparse_mode=0`` without a mask for a non-causal layer; a one-token request (FIA's
  IncreFlashAttention branch, where ``sparse_mode`` has no effect) gets the decode mask.

Declined with ``Unsupported`` before any call, each with its source (the op-plugin API page
``docs/zh/custom_APIs/torch_npu/torch_npu-npu_fused_infer_attention_score.md``, cited as
"FIA"; the ATB PagedAttention limits of op-plugin ``op_plugin/python/atb/_atb_api_docs.py``,
the same ATB operation ``op_plugin/ops/atb/PagedAttentionAtb.cpp`` runs): float32, soft-capping
(neither operator has a cap), head sizes, head counts and block sizes outside the operators'
ranges. Empty batches return without a call.

Both attention calls take the forward's plan (core's default planner): ``block_table`` is its
page table, and the operators' host-side lengths (``actual_seq_lengths``,
``actual_seq_lengths_kv``, PagedAttention's CPU ``context_lens``) come from its host lengths,
read once per forward, so no layer reads a device value on the host. The operators take those
lengths from the host, which a recorded NPU graph would replay unchanged: the adapters declare
no device-graph mode (the default planner's answer); ``torch.compile`` runs them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from enum import IntEnum
from itertools import accumulate
from typing import Any

import torch

from sglang_fl.ops.attention import NO_WINDOW
from sglang_fl.ops.attention.paging import paged_cache
from sglang_fl.types import AttentionPlan, Unsupported

from ..backend import TORCH_NPU, platform

__all__ = ["decode_attention", "extend_attention", "store_kv_cache"]

_FIA = "FIA (torch_npu.npu_fused_infer_attention_score API page)"
_PA = (
    "ATB PagedAttention (torch_npu._npu_paged_attention; op-plugin "
    "op_plugin/python/atb/_atb_api_docs.py, 规格约束 of the same operation)"
)
_RESHAPE = "ATB ReshapeAndCache (torch_npu._npu_reshape_and_cache)"
_HALF = frozenset({torch.float16, torch.bfloat16})
MAX_HEAD_DIM = 512
MAX_HEADS = 256
MAX_GROUP = 64  # num_heads / num_key_value_heads
MAX_BLOCK = 512  # PageAttention block_size, decode and BSND prefill
# One query token: float16/bfloat16 K/V take blocks in multiples of 16 (the API page's Q_S = 1
# PageAttention constraints: "must be a multiple of 16" in the 7.3.0, 26.0.0 and 26.1.0
# pages, "16字节对齐" on master, whose summary table omits it).
ONE_TOKEN_BLOCK_ALIGN = 16
PREFILL_BLOCK = 128  # Q_S > 1 outside TND: block_size a multiple of 128, at least 128
MAX_TND_BLOCK = 1024  # TND with PageAttention: multiples of 16 up to 1024
TND_BLOCK_ALIGN = 16
MAX_TND_BATCH = 4096  # TND: actual_seq_lengths has at most 4096 elements
# TND without rope on Atlas A2/A3: Q_D = K_D = V_D = 128, or Q_D = K_D = 192 with V_D 128/192.
TND_HEAD_DIMS = frozenset({(128, 128), (192, 128), (192, 192)})
MASK_SIZE = 2048  # sparse_mode 2/3/4: a (2048, 2048) mask, upper triangle True
PA_BLOCK_ALIGN = 16
PA_MAX_BLOCK = 128
PA_MAX_HEAD_DIM = 576  # key and value head sizes may differ, each in (0, 576]


class SparseMode(IntEnum):
    """``npu_fused_infer_attention_score``'s ``sparse_mode`` values the adapters use."""

    DEFAULT = 0  # every key, or those atten_mask leaves
    RIGHT_DOWN_CAUSAL = 3
    BAND = 4  # pre_tokens / next_tokens around the right-down diagonal


# -- store_kv_cache -------------------------------------------------------------------------------


def store_kv_cache(
    obj: Any,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``k``/``v`` into slots ``loc`` of the caches, in place (SGLang's NPU set_kv_buffer).

    ATB ReshapeAndCache takes float16/bfloat16 (int8 aside), one dtype for key, value and both
    caches, ND caches, and a value head size other than the key's from CANN 8.0.RC3 on (the
    CANN 8.0.RC2 page: "在key和value最后一维不同的情况下只支持Atlas 800I A2推理产品"; the 8.0.RC3
    page drops the product limit): with an older torch_npu, which may pair with an older CANN,
    differing head sizes are declined.
    """
    if k_cache.dtype not in _HALF or v_cache.dtype != k_cache.dtype:
        raise Unsupported(
            f"{_RESHAPE} stores float16/bfloat16 (or int8) caches of one dtype, not "
            f"{k_cache.dtype}/{v_cache.dtype}"
        )
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise Unsupported(f"{_RESHAPE} writes contiguous [blocks, block_size, heads, dim] caches")
    if k_cache.shape[-1] != v_cache.shape[-1] and not platform().store_differing_head_dims:
        raise Unsupported(
            f"{_RESHAPE}: key/value head sizes {k_cache.shape[-1]}/{v_cache.shape[-1]} need "
            f"CANN 8.0.RC3+ (torch_npu 2.4.0+, Ascend/pytorch COMPATIBILITY.md), not "
            f"{platform().describe()}: ATB 8.0.RC2 takes them on Atlas 800I A2 only"
        )
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


def _missing(name: str) -> str | None:
    """Why ``torch_npu.<name>`` cannot be called here (a release without it), or ``None``."""
    try:
        _operator(name)
    except Unsupported as why:
        return str(why)
    return None


# -- what each operator cannot serve ---------------------------------------------------------------

Why = str | None  # a reason to decline, or None


def _fia_declines(obj: Any, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> Why:
    """What FIA refuses in every layout (dtypes, cap, head sizes and counts, strides)."""
    if q.dtype not in _HALF:
        return f"{_FIA}: query float16/bfloat16 only, not {q.dtype}"
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        return (
            f"{_FIA}: key/value in the query's dtype {q.dtype} (int8 aside), got "
            f"{k_cache.dtype}/{v_cache.dtype}"
        )
    if obj.logit_cap > 0:
        return f"{_FIA} has no logit soft-capping parameter"
    heads, d, kv_heads = q.shape[1], q.shape[2], k_cache.shape[1]
    if d > MAX_HEAD_DIM or d * q.dtype.itemsize % 16:
        return (
            f"{_FIA}: head dim D <= {MAX_HEAD_DIM} and 16-byte aligned in float16/bfloat16, got {d}"
        )
    if heads > MAX_HEADS or heads % kv_heads or heads // kv_heads > MAX_GROUP:
        return (
            f"{_FIA}: at most {MAX_HEADS} heads, num_heads a multiple of num_key_value_heads "
            f"with a ratio <= {MAX_GROUP}, got {heads}/{kv_heads}"
        )
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        return f"{_FIA}: key/value contiguous ('不支持非连续Tensor')"
    return _missing("npu_fused_infer_attention_score")


def _one_head_dim(q: torch.Tensor, v_cache: torch.Tensor) -> Why:
    if v_cache.shape[-1] != q.shape[-1]:
        return (
            f"{_FIA}: key and value of one shape outside TND ('key与value的shape必须完全一致'), "
            f"got head dims {q.shape[-1]} and {v_cache.shape[-1]}"
        )
    return None


def _fia_one_token_block(page_size: int) -> Why:
    if page_size % ONE_TOKEN_BLOCK_ALIGN or not 0 < page_size <= MAX_BLOCK:
        return (
            f"{_FIA}: with one query token and float16/bfloat16 K/V, block_size is a non-zero "
            f"multiple of {ONE_TOKEN_BLOCK_ALIGN} up to {MAX_BLOCK} (Q_S = 1 PageAttention "
            f"constraints), got page size {page_size}"
        )
    return None


def _fia_prefill_block(page_size: int) -> Why:
    if not PREFILL_BLOCK <= page_size <= MAX_BLOCK or page_size % PREFILL_BLOCK:
        return (
            f"{_FIA}: outside TND, with more than one query token block_size is "
            f"{PREFILL_BLOCK}..{MAX_BLOCK} in multiples of {PREFILL_BLOCK}, got page size "
            f"{page_size}"
        )
    return None


def _paged_declines(
    obj: Any, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_size: int
) -> Why:
    """What ATB PagedAttention refuses (the ``_npu_paged_attention_v2`` 规格约束, the same
    ``PagedAttentionOperation`` with ``maskType`` UNDEFINED that ``_npu_paged_attention`` runs)."""
    if obj.sliding_window_size > NO_WINDOW:
        return f"{_PA} has no sliding window (its masks: none, alibi)"
    if obj.logit_cap > 0:
        return f"{_PA} has no logit soft-capping"
    if q.dtype not in _HALF or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        return (
            f"{_PA}: query and caches float16/bfloat16 of one dtype, got "
            f"{q.dtype}/{k_cache.dtype}/{v_cache.dtype}"
        )
    if page_size % PA_BLOCK_ALIGN or not 0 < page_size <= PA_MAX_BLOCK:
        return (
            f"{_PA}: block_size % {PA_BLOCK_ALIGN} == 0 and <= {PA_MAX_BLOCK} ('因硬件限制'), "
            f"got page size {page_size}"
        )
    d, dv, heads, kv_heads = q.shape[2], v_cache.shape[-1], q.shape[1], k_cache.shape[1]
    if not (0 < d <= PA_MAX_HEAD_DIM and 0 < dv <= PA_MAX_HEAD_DIM):
        return f"{_PA}: key/value head sizes in (0, {PA_MAX_HEAD_DIM}], got {d}/{dv}"
    if heads % kv_heads:
        return f"{_PA}: head_num a multiple of kv_head_num (GQA), got {heads}/{kv_heads}"
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        return f"{_PA}: contiguous ND caches (ATB tensors carry no strides)"
    found = platform()
    if not found.a2_or_a3:
        return (
            f"{_PA}: ND caches [num_blocks, block_size, kv_heads, head_size] on Atlas A2/A3 "
            f"only (Atlas 300I/310P takes NZ caches), not {found.describe()}"
        )
    return _missing("_npu_paged_attention")


# -- decode_attention -----------------------------------------------------------------------------

Run = Callable[[], torch.Tensor]


def decode_attention(
    obj: Any, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionPlan
) -> torch.Tensor:
    """One new token per request over its cached KV: PagedAttention (SGLang's default) or FIA
    (first with ``ASCEND_USE_FIA=1``), whichever serves the call; declined when neither does."""
    page_size = plan.page_size
    args = (obj, q, k_cache, v_cache, plan)
    paged: tuple[Why, Run] = (
        _paged_declines(obj, q, k_cache, v_cache, page_size),
        lambda: _paged_decode(*args),
    )
    fia: tuple[Why, Run] = (
        _fia_declines(obj, q, k_cache, v_cache)
        or _one_head_dim(q, v_cache)
        or _fia_one_token_block(page_size),
        lambda: _fia_decode(*args),
    )
    order = (fia, paged) if platform().fia_decode else (paged, fia)
    for why, run in order:
        if why is None:
            batch, heads = q.shape[0], q.shape[1]
            if batch == 0:
                return q.new_empty((0, heads, v_cache.shape[-1]))
            return run()
    raise Unsupported("; ".join(why for why, _ in order if why is not None))


def _paged_decode(
    obj: Any, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionPlan
) -> torch.Tensor:
    """``_npu_paged_attention`` as SGLang's ``forward_decode`` calls it: caches as ``[blocks,
    block_size, kv_heads, head_size]``, lengths on the host (ATB's ``contextLens`` is a CPU
    int32 tensor), the output preallocated."""
    batch, heads, _ = q.shape
    page_size = plan.page_size
    out = q.new_empty((batch, heads, v_cache.shape[-1]))
    _operator("_npu_paged_attention")(
        query=q.contiguous(),
        key_cache=paged_cache(k_cache, page_size),
        value_cache=paged_cache(v_cache, page_size),
        num_kv_heads=k_cache.shape[1],
        num_heads=heads,
        scale_value=obj.scaling,
        block_table=plan.page_table,
        context_lens=plan.seq_lens_host.to(torch.int32),
        out=out,
    )
    return out


def _fia_decode(
    obj: Any, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionPlan
) -> torch.Tensor:
    """FIA with PageAttention in ``BSH``; a window as SGLang's ``swa_mask``: ``(B, KV_S)``
    bool, True outside the last ``window + 1`` keys, ``KV_S`` = the block table's width in
    tokens (FIA: at one query token the mask's last dim >= block_table columns x block_size)."""
    batch, heads, d = q.shape
    page_size, table = plan.page_size, plan.page_table
    lengths = plan.seq_lens_host.tolist()
    options: dict[str, Any] = {}
    if obj.sliding_window_size > NO_WINDOW:
        width = table.shape[1] * page_size
        options = {
            "atten_mask": _window_mask(lengths, obj.sliding_window_size, width, q.device),
            "sparse_mode": SparseMode.DEFAULT,
        }
    out, _ = _operator("npu_fused_infer_attention_score")(
        q.contiguous().view(batch, 1, heads * d),
        _blocks(k_cache, page_size),
        _blocks(v_cache, page_size),
        num_heads=heads,
        num_key_value_heads=k_cache.shape[1],
        input_layout="BSH",
        block_table=table,
        block_size=page_size,
        actual_seq_lengths_kv=lengths,
        scale=obj.scaling,
        **options,
    )
    result: torch.Tensor = out.view(batch, heads, d)
    return result


def _window_mask(
    lengths: Sequence[int], window: int, width: int, device: torch.device
) -> torch.Tensor:
    """``[len(lengths), width]`` bool: True (masked) outside keys ``[n - 1 - window, n)`` of a
    request of ``n`` tokens, whose one query token sits at ``n - 1`` (the contract's window)."""
    n = torch.tensor(list(lengths), device=device).unsqueeze(1)
    key = torch.arange(width, device=device).unsqueeze(0)
    return (key < n - 1 - window) | (key >= n)


def _blocks(cache: torch.Tensor, page_size: int) -> torch.Tensor:
    """The pool as PageAttention's ``[blocks, block_size, kv_heads * dim]`` (BnBsH)."""
    return cache.view(-1, page_size, cache.shape[1] * cache.shape[2])


# -- extend_attention -----------------------------------------------------------------------------


def extend_attention(
    obj: Any, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionPlan
) -> torch.Tensor:
    """The new tokens over the paged pool, right-down causal (or banded): one ``TND`` call
    where TND holds, else one ``BSND`` call per request."""
    why = _fia_declines(obj, q, k_cache, v_cache)
    if why is not None:
        raise Unsupported(why)
    tokens, heads = q.shape[0], q.shape[1]
    page_size = plan.page_size
    assert plan.extend_seq_lens_host is not None  # an extend plan
    new_tokens = plan.extend_seq_lens_host.tolist()
    tnd = _tnd_declines(q, v_cache, page_size, len(new_tokens))
    if tnd is not None:
        bsnd = _one_head_dim(q, v_cache) or _bsnd_block_declines(page_size, new_tokens)
        if bsnd is not None:
            raise Unsupported(f"{tnd}; per request (BSND): {bsnd}")
    if tokens == 0 or not new_tokens:
        return q.new_empty((tokens, heads, v_cache.shape[-1]))
    call = _tnd_extend if tnd is None else _bsnd_extend
    lengths = plan.seq_lens_host.tolist()
    return call(obj, q, k_cache, v_cache, plan.page_table, lengths, new_tokens, page_size)


def _tnd_declines(q: torch.Tensor, v_cache: torch.Tensor, page_size: int, batch: int) -> Why:
    """FIA's TND on Atlas A2/A3 (its "TND布局约束", query D != 512): the release, head sizes,
    blocks, batch."""
    found = platform()
    if not found.extension_7_3:
        return (
            f"{_FIA}: TND takes PageAttention from the Ascend Extension for PyTorch 7.3.0 builds "
            f"(2.6.0.post5, 2.7.1.post2, 2.8.0.post2, 2.9.0+; the op-plugin 7.1.0/7.2.0 pages, "
            f"TND with query D != 512: '不支持...page attention'), not {found.describe()}"
        )
    dims = (q.shape[-1], v_cache.shape[-1])
    if dims not in TND_HEAD_DIMS:
        return (
            f"{_FIA}: TND without rope takes Q/K/V head dims 128, or Q/K 192 with V 128/192 "
            f"(TND布局约束), got {dims[0]}/{dims[1]}"
        )
    if page_size % TND_BLOCK_ALIGN or not 0 < page_size <= MAX_TND_BLOCK:
        return (
            f"{_FIA}: TND with PageAttention takes block_size in multiples of "
            f"{TND_BLOCK_ALIGN} up to {MAX_TND_BLOCK}, got page size {page_size}"
        )
    if batch > MAX_TND_BATCH:
        return f"{_FIA}: TND takes at most {MAX_TND_BATCH} requests, got {batch}"
    return None


def _bsnd_block_declines(page_size: int, new_tokens: Sequence[int]) -> Why:
    """The block size each request's own call takes: one token (decode's rule) or more."""
    if any(n > 1 for n in new_tokens):
        return _fia_prefill_block(page_size)
    return _fia_one_token_block(page_size)


def _prefill_options(obj: Any, device: torch.device) -> dict[str, Any]:
    """``sparse_mode`` (and mask, band) of a causal, banded or non-causal call of Q_S > 1."""
    if not obj.is_causal:
        return {"sparse_mode": SparseMode.DEFAULT}
    if obj.sliding_window_size > NO_WINDOW:
        return {
            "atten_mask": _causal_mask(device),
            "sparse_mode": SparseMode.BAND,
            "pre_tokens": obj.sliding_window_size,
            "next_tokens": 0,
        }
    return {"atten_mask": _causal_mask(device), "sparse_mode": SparseMode.RIGHT_DOWN_CAUSAL}


def _tnd_extend(
    obj: Any,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    lengths: list[int],
    new_tokens: list[int],
    page_size: int,
) -> torch.Tensor:
    out, _ = _operator("npu_fused_infer_attention_score")(
        q.contiguous(),
        _blocks(k_cache, page_size),
        _blocks(v_cache, page_size),
        num_heads=q.shape[1],
        num_key_value_heads=k_cache.shape[1],
        input_layout="TND",
        block_table=table,
        block_size=page_size,
        actual_seq_lengths=list(accumulate(new_tokens)),
        actual_seq_lengths_kv=lengths,
        scale=obj.scaling,
        **_prefill_options(obj, q.device),
    )
    result: torch.Tensor = out
    return result


def _bsnd_extend(
    obj: Any,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    lengths: list[int],
    new_tokens: list[int],
    page_size: int,
) -> torch.Tensor:
    """One ``BSND`` call per request with new tokens (its ``[1, q_len, heads, D]`` query, its
    block-table row), as SGLang's ``forward_extend`` when ``_can_use_tnd`` is false."""
    tokens, heads, d = q.shape
    out = q.new_empty((tokens, heads, d))
    keys, values = _blocks(k_cache, page_size), _blocks(v_cache, page_size)
    prefill = _prefill_options(obj, q.device)
    start = 0
    for row, (n, length) in enumerate(zip(new_tokens, lengths, strict=True)):
        if n == 0:
            continue
        options = prefill
        if n == 1:  # IncreFlashAttention: sparse_mode has no effect; a window is a mask
            options = {}
            if obj.is_causal and obj.sliding_window_size > NO_WINDOW:
                width = table.shape[1] * page_size
                mask = _window_mask([length], obj.sliding_window_size, width, q.device)
                options = {"atten_mask": mask, "sparse_mode": SparseMode.DEFAULT}
        result, _ = _operator("npu_fused_infer_attention_score")(
            q[start : start + n].contiguous().unsqueeze(0),
            keys,
            values,
            num_heads=heads,
            num_key_value_heads=k_cache.shape[1],
            input_layout="BSND",
            block_table=table[row : row + 1],
            block_size=page_size,
            actual_seq_lengths=[n],
            actual_seq_lengths_kv=[length],
            scale=obj.scaling,
            **options,
        )
        out[start : start + n] = result[0]
        start += n
    return out


@functools.cache
def _causal_mask(device: torch.device) -> torch.Tensor:
    """The operator's optimised causal mask: ``[2048, 2048]`` bool, True above the diagonal
    (SGLang's ``generate_mask_flag``), built once per device."""
    return ~torch.ones((MASK_SIZE, MASK_SIZE), dtype=torch.bool, device=device).tril()
