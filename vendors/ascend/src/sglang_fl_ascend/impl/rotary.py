"""``rotary_embedding`` and ``mrotary_embedding`` on ``torch_npu.npu_mrope``.

``rotary_embedding`` calls it as ``RotaryEmbedding.forward_npu`` does.

``npu_mrope`` takes 2-D ``[num_tokens, heads * head_size]`` query/key and the layer's
``cos_sin_cache`` (``[max_positions, rotary_dim]``, cos then sin; the concatenation of the
``cos``/``sin`` halves the contract passes) and returns new tensors. The ``[tokens, heads,
rotary_dim]`` views are flattened with ``head_size = rotary_dim``, so partial rotary works on
the rotary part alone; with ``inplace`` the results are copied back into the views.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl import Unsupported
from sglang_fl.ops.mrotary_embedding import check_section

from ..ascend import TORCH_NPU

# Plain (not multimodal) rope: no mrope sections.
_NO_MROPE_SECTIONS = [0, 0, 0]
# MRotaryEmbedding.forward_npu (SGLang 0.5.23) leaves wider query rows to forward_native.
_MROPE_MAX_QUERY_WIDTH = 4096


def rotary_embedding_npu(
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
    cache = obj.cos_sin_cache
    if cache.dtype != query.dtype or cache.device != query.device:
        # SGLang keeps the NPU cache in the model dtype; a float32 cache (SGLANG_ROPE_CACHE_FP32)
        # takes SGLang's own non-npu_mrope path, and here the next backend.
        raise Unsupported(
            f"npu_mrope reads cos_sin_cache in the query dtype {query.dtype}; the layer's is "
            f"{cache.dtype} on {cache.device}"
        )
    torch_npu = TORCH_NPU.module or TORCH_NPU.load()
    rotary_dim = query.shape[-1]
    q_out, k_out = torch_npu.npu_mrope(
        position_ids,
        query.reshape(query.shape[0], -1),
        key.reshape(key.shape[0], -1),
        cache,
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


def mrotary_embedding_npu(
    obj: Any, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multimodal rope of SGLang's flattened ``query``/``key`` by ``npu_mrope``; new tensors.

    ``[3, tokens]`` positions take the layer's ``mrope_section`` (CANN's
    ``aclnnRopeWithSinCosCache`` mrope mode: consecutive lane runs per axis); ``[tokens]``
    positions are plain rope (sections ``[0, 0, 0]``, as ``forward_npu`` passes them).
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
    if query.shape[0] == 0:
        return query, key
    section = check_section(obj, positions) if positions.dim() == 2 else _NO_MROPE_SECTIONS
    torch_npu = TORCH_NPU.module or TORCH_NPU.load()
    return torch_npu.npu_mrope(
        positions,
        query,
        key,
        cache,
        obj.head_size,
        mrope_section=section,
        rotary_mode="half" if obj.is_neox_style else "interleave",
    )
