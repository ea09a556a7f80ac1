"""``store_kv_cache``: write a forward's new keys and values into SGLang's KV pool.

The "reshape and cache" step every attention backend runs before attending: SGLang's
``MHATokenToKVPool.set_kv_buffer`` (``mem_cache/memory_pool.py``) casts the new rows to the
pool's dtype and writes row ``i`` of ``k``/``v`` into slot ``loc[i]`` of the layer's buffers.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from ..contract import OpCase, OpContract, OpInputs, axis, case_grid, layer
from .cases import shape_name
from .common import EXACT_TOLERANCES, build_pool, query_tensor

__all__ = ["STORE_KV_CACHE"]


def _signature(
    obj: Any,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Write ``k`` ``[num_tokens, kv_heads, head_dim]`` and ``v`` (``v_head_dim``) into rows
    ``loc`` (``[num_tokens]``, int64 slots) of ``k_cache``/``v_cache``, in place.

    The caches are one layer's pool buffers, ``[slots, kv_heads, head_dim]``; ``k``/``v`` are
    cast to the caches' dtype and may be strided views (slices of a packed qkv projection);
    ``num_tokens`` may be 0. The slots of one page are consecutive (see
    :mod:`sglang_fl.ops.attention.common`), which paged kernels may rely on; ``loc`` never
    repeats a slot. Returns ``(k_cache, v_cache)``: the caches themselves, written in place.
    No other slot, and neither ``k``, ``v`` nor ``loc``, may change. ``obj`` carries nothing.
    """
    raise NotImplementedError


def reference(
    obj: Any,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``set_kv_buffer``'s portable path (``_set_kv_buffer_impl`` without a device kernel)."""
    k_cache[loc] = k.to(k_cache.dtype)
    v_cache[loc] = v.to(v_cache.dtype)
    return k_cache, v_cache


def _case_name(p: Mapping[str, Any]) -> str:
    strided = ",strided" if p["strided"] else ""
    return f"tokens={p['tokens']},{shape_name(p)}{strided}"


_SHAPES = (
    {"heads": 4, "kv_heads": 4, "head_dim": 64, "v_head_dim": 64},
    {"heads": 8, "kv_heads": 2, "head_dim": 128, "v_head_dim": 128},
    {"heads": 4, "kv_heads": 1, "head_dim": 256, "v_head_dim": 256},
    {"heads": 4, "kv_heads": 2, "head_dim": 96, "v_head_dim": 64},
    {"heads": 2, "kv_heads": 2, "head_dim": 16, "v_head_dim": 16},
)
CASES = (
    *case_grid(
        _case_name,
        axis("tokens", (1, 7, 33)),
        _SHAPES,
        axis("page_size", (1, 4)),
        axis("strided", (False,)),
    ),
    *case_grid(
        _case_name,
        axis("tokens", (7, 33)),
        _SHAPES[1:2],
        axis("page_size", (1, 16)),
        axis("strided", (True,)),
    ),
    *case_grid(
        _case_name,
        axis("tokens", (0,)),
        _SHAPES[:2],
        axis("page_size", (1,)),
        axis("strided", (False,)),
    ),
)


def _make_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    p = case.params
    tokens, kv_heads = p["tokens"], p["kv_heads"]
    # Two requests already in the pool; the new tokens go to free slots, as the allocator
    # hands them out (whole pages, in page order).
    pool = build_pool(
        (5, 9),
        kv_heads=kv_heads,
        head_dim=p["head_dim"],
        v_head_dim=p["v_head_dim"],
        page_size=p["page_size"],
        dtype=dtype,
        device=device,
        generator=generator,
        spare_tokens=tokens,
    )
    loc = pool.free_slots[:tokens].clone()
    k = query_tensor(
        tokens, kv_heads, kv_heads, p["head_dim"], dtype, device, generator, strided=p["strided"]
    )
    v = query_tensor(
        tokens,
        kv_heads,
        kv_heads,
        p["v_head_dim"],
        dtype,
        device,
        generator,
        strided=p["strided"],
    )
    return OpInputs(
        obj=layer(),
        args=(pool.k_cache, pool.v_cache, loc, k, v),
        preserved=("loc", "k", "v"),
        written_in_place={0: "k_cache", 1: "v_cache"},
    )


STORE_KV_CACHE = OpContract(
    name="store_kv_cache",
    sglang_layer="RadixAttention",
    summary="write new keys/values into one layer's KV pool buffers at their slots (in place)",
    signature=inspect.signature(_signature),
    details=inspect.getdoc(_signature) or "",
    reference=reference,
    dtypes=tuple(EXACT_TOLERANCES),
    tolerances=EXACT_TOLERANCES,
    cases=CASES,
    make_inputs=_make_inputs,
    reference_traceable=True,
)
