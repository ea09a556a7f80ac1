"""``rotary_embedding`` on ``torch_npu.npu_mrope``, as ``RotaryEmbedding.forward_npu`` calls it.

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

from ..ascend import TORCH_NPU

# Plain (not multimodal) rope: no mrope sections.
_NO_MROPE_SECTIONS = [0, 0, 0]


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
