"""``decode_attention`` and ``extend_attention`` on sgl_kernel's FlashAttention-3, as SGLang's
``fa3`` attention backend calls it (``layers/attention/flashattention_backend.py``, SGLang
0.5.23, the default attention backend on Hopper).

Both ops are one ``sgl_kernel.flash_attn.flash_attn_with_kvcache`` call over the paged pool,
everything the batch needs taken from the forward's plan (core's default plan, made once per
forward, as SGLang's ``fa3`` backend makes its metadata once): ``q`` as varlen rows
(``cu_seqlens_q``, ``max_seqlen_q``; one row per request in decode), the pool viewed as
``[pages, page_size, kv_heads, dim]`` with the plan's ``page_table``, ``cache_seqlens`` the
requests' full lengths. No call reads a value on the host, so CUDA graphs capture and replay
them: :data:`PLANNER` claims both graph modes (a graph-mode plan's page table spans the whole
context and is rewritten in place). The causal mask is bottom-right aligned, which puts each
new token at its position after the prefix; a sliding window is ``(window, 0)``, SGLang's own
mapping.

What the kernel cannot serve is declined with ``Unsupported`` before anything runs, citing
``hopper/flash_api.cpp`` (``mha_fwd``) of FlashAttention-3, which sgl_kernel builds:
float16/bfloat16 only, head sizes up to 256 and multiples of 8, a value head size other than
the key's only in (128, 192] -> (96, 128] or <= 64 -> <= 512 and only on Hopper; K/V in
``q``'s dtype. An fp8 (e4m3) pool is declined for what it is: ``mha_fwd`` takes one only with
``q`` in fp8 too and per-request descales, on Hopper, returning bfloat16; the contract casts
K/V to ``q``'s dtype with no scale, so serving it would quantize ``q`` (SGLang's ``fa3``
backend does, with the layer's ``k_scale``/``v_scale``, which the contract does not carry).
FA3 itself runs only where ``is_fa3_supported`` holds (sm80/86/89/90, CUDA >= 12.3): the
backend's probe asks it for every visible GPU (:data:`~sglang_fl_cuda.backend.FA3_DEVICES`)
and each call for its own. Empty batches return without a launch.

``store_kv_cache`` has no adapter: sgl_kernel has no KV store kernel (SGLang's CUDA
``set_kv_buffer`` runs its own JIT ``store_cache``), so the plugin declares none.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from sglang_fl.ops.attention import NO_WINDOW
from sglang_fl.ops.attention.paging import paged_cache
from sglang_fl.types import AttentionPlan, DefaultPlanner, Unsupported

from ..backend import FA3_DEVICES, FLASH_ATTN

__all__ = ["NO_KERNEL", "PLANNER", "decode_attention", "extend_attention"]

NO_KERNEL = {
    "store_kv_cache": "sgl_kernel has no KV store kernel (SGLang's CUDA set_kv_buffer runs its "
    "own JIT store_cache kernel, which stays in place)",
}

# The default plan, and no graph mode refused: the calls read only its device tensors and
# plain values (page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q).
PLANNER = DefaultPlanner({})

_SOURCE = "FlashAttention-3 hopper/flash_api.cpp mha_fwd"
_DTYPES = frozenset({torch.float16, torch.bfloat16})
# mha_fwd's fp8 input (flash_api.cpp:715-722, 859, 1115-1144): q, K and V all e4m3 with
# [batch, kv_heads] descales, bfloat16 out, Hopper only.
_FP8 = frozenset({torch.float8_e4m3fn, torch.float8_e5m2})
MAX_HEAD_DIM = 256  # get_max_headdim() of the sm90 build
HEAD_DIM_ALIGNMENT = 8  # head_size % 8 for 16-bit inputs


def _flash_attn(q: torch.Tensor) -> ModuleType:
    """The FA3 wrapper module, or ``Unsupported`` where this wheel or GPU has none."""
    try:
        module = FLASH_ATTN.require()
    except ImportError as exc:
        raise Unsupported(f"sgl_kernel has no FlashAttention-3 here: {exc}") from exc
    if not module.is_fa3_supported(q.device):
        raise Unsupported(f"sgl_kernel's FlashAttention-3 runs on {FA3_DEVICES} only")
    return module


def _check_shapes(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Decline what ``mha_fwd`` rejects, before anything is allocated or launched."""
    if q.dtype not in _DTYPES:
        raise Unsupported(f"FlashAttention-3 takes float16/bfloat16, not {q.dtype} ({_SOURCE})")
    if k_cache.dtype in _FP8 or v_cache.dtype in _FP8:
        raise Unsupported(
            f"an fp8 KV pool ({k_cache.dtype}/{v_cache.dtype}): FlashAttention-3 reads fp8 (e4m3 "
            f"only) K/V with q in e4m3 too and q/k/v descales, on Hopper ({_SOURCE}: 'query and "
            "key must have the same dtype', q/k/v_descale); serving it would quantize q, and the "
            "contract computes in q's dtype with K/V cast to it, unscaled"
        )
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise Unsupported(
            f"FlashAttention-3 needs the KV pool in q's dtype {q.dtype}, got "
            f"{k_cache.dtype}/{v_cache.dtype} ({_SOURCE}: 'query and key must have the same dtype')"
        )
    d, dv = q.shape[-1], v_cache.shape[-1]
    for name, size in (("head_dim", d), ("v_head_dim", dv)):
        if size % HEAD_DIM_ALIGNMENT:
            raise Unsupported(
                f"FlashAttention-3 needs {name} a multiple of {HEAD_DIM_ALIGNMENT}, got {size} "
                f"({_SOURCE})"
            )
    if d > MAX_HEAD_DIM:
        raise Unsupported(
            f"FlashAttention-3 supports head_dim <= {MAX_HEAD_DIM}, got {d} ({_SOURCE})"
        )
    if dv != d:
        if not ((128 < d <= 192 and 96 < dv <= 128) or (d <= 64 and dv <= 512)):
            raise Unsupported(
                f"FlashAttention-3 takes a v_head_dim other than head_dim only for head_dim in "
                f"(128, 192] with v_head_dim in (96, 128], or head_dim <= 64 with v_head_dim "
                f"<= 512; got {d}/{dv} ({_SOURCE})"
            )
        if torch.cuda.get_device_capability(q.device)[0] != 9:
            raise Unsupported(
                f"FlashAttention-3 takes v_head_dim != head_dim on Hopper only ({_SOURCE})"
            )
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise Unsupported(
            "FlashAttention-3 needs the KV pool's last dim contiguous "
            "(sgl_kernel/flash_attn.py flash_attn_with_kvcache asserts)"
        )


def _window(obj: Any, causal: bool) -> tuple[int, int]:
    """FlashAttention's ``(left, right)`` of a causal call's window (SGLang's mapping); a
    non-causal layer ignores its window, as the contract says."""
    if causal and obj.sliding_window_size > NO_WINDOW:
        return (obj.sliding_window_size, 0)
    return (-1, -1)


def _attend(
    obj: Any,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: AttentionPlan,
    causal: bool,
) -> torch.Tensor:
    """One varlen ``flash_attn_with_kvcache`` over the paged pool: ``[tokens, heads, dv]``."""
    _check_shapes(q, k_cache, v_cache)
    module = _flash_attn(q)
    if q.shape[0] == 0 or plan.batch_size == 0:
        return q.new_empty((q.shape[0], q.shape[1], v_cache.shape[-1]))
    out: torch.Tensor = module.flash_attn_with_kvcache(
        q=q,
        k_cache=paged_cache(k_cache, plan.page_size),
        v_cache=paged_cache(v_cache, plan.page_size),
        page_table=plan.page_table,
        cache_seqlens=plan.cache_seqlens,
        cu_seqlens_q=plan.cu_seqlens_q,
        max_seqlen_q=plan.max_seqlen_q,
        softmax_scale=obj.scaling,
        causal=causal,
        window_size=_window(obj, causal),
        softcap=obj.logit_cap,
    )
    return out


def decode_attention(
    obj: Any, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionPlan
) -> torch.Tensor:
    """One query row per request (``cu_seqlens_q`` = 0, 1, ..., batch), as SGLang's fa3 decode."""
    return _attend(obj, q, k_cache, v_cache, plan, True)


def extend_attention(
    obj: Any, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionPlan
) -> torch.Tensor:
    """Each request's new rows over its whole cached sequence (prefix and new tokens)."""
    return _attend(obj, q, k_cache, v_cache, plan, obj.is_causal)
