"""``rotary_embedding`` on ``sgl_kernel.rotary_embedding`` (in place, neox or GPT-J style).

The kernel rotates, for each token ``t`` and head ``h``, the first ``rot_dim`` values at
``query[t, h]`` (token stride ``query.stride(0)``, head stride ``query.stride(-2)``, the same
head stride for ``key``), reading ``cos_sin_cache[positions[t]]`` (``[max_pos, rot_dim]``, cos
then sin, in the query's dtype). Partial-rotary views of wider heads, and q/k cut from one
packed qkv tensor, are therefore rotated where they lie, without a copy.

SGLang 0.5.23's own ``RotaryEmbedding.forward_cuda`` no longer calls ``sgl_kernel`` here: it
runs SGLang's JIT kernels (``sglang.kernels.ops.attention.rope``: FlashInfer-style
``apply_rope_with_cos_sin_cache_inplace`` with a float32 cache for head sizes 64/128/256/512,
else ``rotary_embedding``, the same algorithm as this kernel). Those ship inside SGLang and
compile at first use; this backend depends on neither, so it calls the kernel that
``sglang-kernel`` 0.4.x still exports, with the cache in the query's dtype.

Constraints of the kernel and how they are met: int64 positions (converted), ``num_heads``
divisible by ``num_kv_heads`` (else ``Unsupported``), a unit last stride and one head stride
for q and k (else rotated on packed copies and written back), at least one token (an empty
batch is returned without a launch: the kernel would divide by zero).
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.ops.rotary.rotary_embedding import joined_cos_sin_cache
from sglang_fl.types import Unsupported

from ..backend import SGL_KERNEL


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
    if query.shape[-2] % key.shape[-2]:
        raise Unsupported(
            f"sgl_kernel.rotary_embedding needs num_heads divisible by num_kv_heads; got "
            f"{query.shape[-2]} and {key.shape[-2]}"
        )
    if position_ids.numel() == 0:
        return (query, key) if inplace else (query.clone(), key.clone())
    sgl_kernel = SGL_KERNEL.require()
    cache = joined_cos_sin_cache(obj, cos, sin)
    if position_ids.dtype != torch.int64:
        position_ids = position_ids.long()  # the kernel reads int64 positions
    if inplace and _writable_in_place(query, key):
        q, k = query, key
    else:
        q = query.clone(memory_format=torch.contiguous_format)
        k = key.clone(memory_format=torch.contiguous_format)
    sgl_kernel.rotary_embedding(
        position_ids.contiguous(), q, k, q.shape[-1], cache, not rotary_interleaved
    )
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
