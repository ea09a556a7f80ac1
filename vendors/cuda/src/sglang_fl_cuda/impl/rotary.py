"""``rotary_embedding`` on ``sgl_kernel.rotary_embedding`` (in place, neox or GPT-J style).

The kernel rotates, for each token ``t`` and head ``h``, the first ``rot_dim`` values at
``query[t, h]`` (token stride ``query.stride(0)``, head stride ``query.stride(-2)``, the same
head stride for ``key``), reading ``cos_sin_cache[positions[t]]`` (``[max_pos, rot_dim]``, cos
then sin, in the query's dtype). Partial-rotary views of wider heads are therefore rotated
where they lie, without a copy.
"""

from __future__ import annotations

from typing import Any

import torch

from ..backend import SGL_KERNEL

# Layer attribute holding (cos, sin, joined cache) for the last cos/sin pair it was given.
_CACHE_ATTR = "_sglang_fl_cuda_cos_sin_cache"


def rotary_embedding(
    obj: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: torch.Tensor,
    rotary_interleaved: bool = False,
    inplace: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``query``/``key`` ``[num_tokens, heads, rotary_dim]`` at ``position_ids``."""
    sgl_kernel = SGL_KERNEL.module or SGL_KERNEL.load()
    cache = _joined_cache(obj, cos, sin)
    if position_ids.dtype != torch.int64:
        position_ids = position_ids.long()  # the kernel reads int64 positions
    if inplace and _writable_in_place(query, key):
        q, k = query, key
    else:
        q = query.clone(memory_format=torch.contiguous_format)
        k = key.clone(memory_format=torch.contiguous_format)
    sgl_kernel.rotary_embedding(position_ids, q, k, q.shape[-1], cache, not rotary_interleaved)
    if inplace and q is not query:
        query.copy_(q)
        key.copy_(k)
        return query, key
    return q, k


def _writable_in_place(query: torch.Tensor, key: torch.Tensor) -> bool:
    """Whether the kernel's addressing (unit last stride, shared head stride) fits both views."""
    return (
        query.dim() == 3
        and key.dim() == 3
        and query.stride(-1) == 1
        and key.stride(-1) == 1
        and query.stride(-2) == key.stride(-2)
    )


def _joined_cache(obj: Any, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``cat(cos, sin)`` as the kernel reads it, built once per cos/sin pair and kept on the layer.

    Callers pass the same cos/sin tensors on every call (the SGLang bridge converts the layer's
    cache once per dtype), so after the first call this is one attribute read.
    """
    memo = getattr(obj, _CACHE_ATTR, None)
    if memo is None or memo[0] is not cos or memo[1] is not sin:
        memo = (cos, sin, torch.cat((cos, sin), dim=-1))
        setattr(obj, _CACHE_ATTR, memo)
    return memo[2]
