"""Rotary embeddings on template: plain (neox or interleaved, in place or not) and multimodal."""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.types import Unsupported


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
    # Replace with the chip kernel: query/key [num_tokens, heads, rotary_dim] (maybe strided
    # views), cos/sin [max_positions, rotary_dim // 2] indexed by position_ids. inplace=True:
    # write into query and key and return them; inplace=False: leave both untouched.
    raise Unsupported("template: rotary_embedding is not implemented")


def mrotary_embedding(
    obj: Any, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    # Replace with the chip kernel: query/key [num_tokens, heads * obj.head_size] (maybe qkv
    # slices); positions [num_tokens] (plain rope) or [3, num_tokens] (obj.mrope_section lane
    # runs per axis, or obj.mrope_interleaved); obj.cos_sin_cache [max_pos, obj.rotary_dim].
    # Return (query, key); rotating in place is allowed, positions stay untouched.
    raise Unsupported("template: mrotary_embedding is not implemented")
