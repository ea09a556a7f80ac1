"""``rotary_embedding`` and ``mrotary_embedding`` on ``torch_npu.npu_mrope``.

``rotary_embedding`` calls it as ``RotaryEmbedding.forward_npu`` does.

``npu_mrope`` takes 2-D ``[num_tokens, heads * head_size]`` query/key and a ``cos_sin_cache``
(``[max_positions, rotary_dim]``, cos then sin) and returns new tensors. The adapter passes the
cache joined from the ``cos``/``sin`` halves it is given (the standard signature's arguments,
not the layer's own ``cos_sin_cache``), and the ``[tokens, heads, rotary_dim]`` views flattened
with ``head_size = rotary_dim``, so partial rotary works on the rotary part alone; with
``inplace`` the results are copied back into the views.

Constraints of the operator (torch_npu API doc of ``npu_mrope``) and how they are met:
``head_size`` and ``rotary_dim`` multiples of 32 for float16/bfloat16 and of 16 for float32
(otherwise ``Unsupported``, before anything is written), the cache in the query's dtype (the
contract's ``cos``/``sin`` are), at least one token (an empty batch is
returned without a call).
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.ops.rotary.mrotary_embedding import check_section
from sglang_fl.ops.rotary.rotary_embedding import joined_cos_sin_cache
from sglang_fl.types import Unsupported

from ..backend import TORCH_NPU

# Plain (not multimodal) rope: no mrope sections.
_NO_MROPE_SECTIONS = [0, 0, 0]
# npu_mrope's alignment of head_size and rotary_dim, in elements, per dtype.
_MROPE_ALIGNMENT = {torch.float16: 32, torch.bfloat16: 32, torch.float32: 16}
# MRotaryEmbedding.forward_npu (SGLang 0.5.23) leaves wider query rows to forward_native.
_MROPE_MAX_QUERY_WIDTH = 4096


def _check_alignment(head_size: int, rotary_dim: int, dtype: torch.dtype) -> None:
    """``Unsupported`` unless npu_mrope's documented alignment holds for both sizes."""
    alignment = _MROPE_ALIGNMENT.get(dtype)
    if alignment is None or head_size % alignment or rotary_dim % alignment:
        allowed = ", ".join(f"{n} for {d}" for d, n in _MROPE_ALIGNMENT.items())
        raise Unsupported(
            f"npu_mrope needs head_size and rotary_dim in multiples of {allowed}; got "
            f"head_size {head_size}, rotary_dim {rotary_dim} in {dtype}"
        )


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
    rotary_dim = query.shape[-1]
    _check_alignment(rotary_dim, rotary_dim, query.dtype)
    if position_ids.numel() == 0:
        return (query, key) if inplace else (query.clone(), key.clone())
    torch_npu = TORCH_NPU.require()
    q_out, k_out = torch_npu.npu_mrope(
        position_ids,
        query.reshape(query.shape[0], -1),
        key.reshape(key.shape[0], -1),
        joined_cos_sin_cache(obj, cos, sin),
        rotary_dim,
        mrope_section=_NO_MROPE_SECTIONS,
        rotary_mode="interleave" if rotary_interleaved else "half",
    )
    q_out, k_out = q_out.view(query.shape), k_out.view(key.shape)
    if not inplace:
        return q_out, k_out
    query.copy_(q_out)
    key.copy_(k_out)
    return query, key


def mrotary_embedding(
    obj: Any, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multimodal rope of SGLang's flattened ``query``/``key`` by ``npu_mrope``; new tensors.

    ``[3, tokens]`` positions take the layer's ``mrope_section`` (CANN's
    ``aclnnRopeWithSinCosCache`` mrope mode: consecutive lane runs per axis); ``[tokens]``
    positions are plain rope (sections ``[0, 0, 0]``, as ``forward_npu`` passes them). The
    layer's ``cos_sin_cache`` and ``head_size`` are passed as they are, so the alignment and
    cache dtype are checked (``Unsupported``) before anything is called.
    """
    if positions.dim() == 2 and obj.mrope_interleaved:
        raise Unsupported(
            "npu_mrope: interleaved mrope sections (Qwen3-VL style) are not its documented "
            "section layout"
        )
    if query.shape[-1] > _MROPE_MAX_QUERY_WIDTH:
        raise Unsupported(
            f"npu_mrope: query rows of {query.shape[-1]} values exceed the "
            f"{_MROPE_MAX_QUERY_WIDTH} SGLang's MRotaryEmbedding.forward_npu sends to it"
        )
    cache = obj.cos_sin_cache
    if cache.dtype != query.dtype or cache.device != query.device:
        raise Unsupported(
            f"npu_mrope reads cos_sin_cache in the query dtype {query.dtype}; the layer's is "
            f"{cache.dtype} on {cache.device}"
        )
    _check_alignment(obj.head_size, cache.shape[-1], query.dtype)
    if query.shape[0] == 0:
        return query, key
    section = check_section(obj, positions) if positions.dim() == 2 else _NO_MROPE_SECTIONS
    rotated: tuple[torch.Tensor, torch.Tensor] = TORCH_NPU.require().npu_mrope(
        positions,
        query,
        key,
        cache,
        obj.head_size,
        mrope_section=section,
        rotary_mode="half" if obj.is_neox_style else "interleave",
    )
    return rotated
