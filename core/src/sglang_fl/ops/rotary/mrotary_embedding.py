"""``mrotary_embedding``: SGLang's ``MRotaryEmbedding`` (multimodal rope of Qwen-VL and kin).

Name and signature are those of the FlagOS SGLang plugin, so its vendor kernels register as is.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..contract import (
    STANDARD_DTYPES,
    STANDARD_TOLERANCES,
    OpCase,
    OpContract,
    OpInputs,
    axis,
    case_grid,
    layer,
    random_tensor,
)
from .rotary_embedding import rotate

MAX_POSITIONS = 64
# The three position axes of a [3, num_tokens] positions tensor: temporal, height, width.
AXES = 3


def _signature(
    obj: Any, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``query`` ``[num_tokens, q_heads * head_size]`` and ``key`` (kv heads), SGLang's
    flattened layout, at ``positions``; returns ``(query, key)`` with the same shapes.

    ``positions`` is ``[num_tokens]`` (text: plain rope) or ``[3, num_tokens]`` (temporal,
    height and width positions). With 3-D positions, each of the ``rotary_dim // 2`` frequency
    lanes takes its cos/sin from one axis: ``obj.mrope_section`` ``[t, h, w]`` (summing to
    ``rotary_dim // 2``) gives consecutive runs of lanes to each axis, or, with
    ``obj.mrope_interleaved``, lanes ``1, 4, 7, ...`` (``h`` of them) to height, ``2, 5, ...``
    (``w``) to width and the rest to time. Reads ``obj.cos_sin_cache`` ``[max_positions,
    rotary_dim]`` (cos then sin, any float dtype; cos/sin are converted to the query's dtype),
    ``obj.head_size``, ``obj.rotary_dim`` (the rest of each head passes through) and
    ``obj.is_neox_style`` (rotate halves; else even/odd pairs). An implementation may write the
    results into ``query`` and ``key`` (SGLang's own CUDA and NPU paths do), so callers use the
    returned tensors; ``positions`` stays untouched. ``query``/``key`` may be strided (slices of
    a fused qkv projection) and ``num_tokens`` may be 0.
    """
    raise NotImplementedError


def lane_axes(section: Sequence[int], interleaved: bool) -> list[int]:
    """Which position axis (0 temporal, 1 height, 2 width) owns each frequency lane."""
    lanes = sum(section)
    if not interleaved:
        return [owner for owner, size in enumerate(section) for _ in range(size)]
    axes = [0] * lanes
    for owner in (1, 2):
        for lane in range(owner, min(AXES * section[owner], lanes), AXES):
            axes[lane] = owner
    return axes


def check_section(obj: Any, positions: torch.Tensor) -> list[int]:
    """``obj.mrope_section`` for 3-D positions, or a ``ValueError`` naming what is wrong."""
    section = list(obj.mrope_section or ())
    if len(section) != AXES or sum(section) != obj.rotary_dim // 2:
        raise ValueError(
            f"mrotary_embedding: positions {tuple(positions.shape)} need obj.mrope_section of "
            f"{AXES} lane counts summing to rotary_dim // 2 = {obj.rotary_dim // 2}; got "
            f"{obj.mrope_section!r}"
        )
    return section


def reference(
    obj: Any, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same math as ``MRotaryEmbedding.forward_native``; returns new tensors."""
    if positions.dim() not in (1, 2):
        raise ValueError(
            f"mrotary_embedding: positions must be [num_tokens] or [3, num_tokens]; "
            f"got {tuple(positions.shape)}"
        )
    cos, sin = obj.cos_sin_cache[positions].chunk(2, dim=-1)
    if positions.dim() == 2:
        axes = torch.tensor(
            lane_axes(check_section(obj, positions), bool(obj.mrope_interleaved)),
            device=cos.device,
        )
        lanes = torch.arange(axes.numel(), device=cos.device)
        # [3, tokens, lanes] -> [tokens, lanes]: lane j of token t from axis axes[j].
        cos = cos.permute(1, 0, 2)[:, axes, lanes]
        sin = sin.permute(1, 0, 2)[:, axes, lanes]
    cos = cos.unsqueeze(-2).to(query.dtype)
    sin = sin.unsqueeze(-2).to(query.dtype)
    rotary_dim, head_size, interleaved = obj.rotary_dim, obj.head_size, not obj.is_neox_style
    outputs = []
    for tensor in (query, key):
        heads = tensor.reshape(tensor.shape[0], tensor.shape[-1] // head_size, head_size)
        rotated = rotate(heads[..., :rotary_dim], cos, sin, interleaved)
        outputs.append(torch.cat((rotated, heads[..., rotary_dim:]), dim=-1).reshape(tensor.shape))
    return outputs[0], outputs[1]


def _case_name(p: Mapping[str, Any]) -> str:
    positions = "3d" if p["three_d"] else "1d"
    name = f"tokens={p['tokens']},positions={positions},rotary_dim={p['rotary_dim']}"
    name += f"/{p['head_size']}" if p["rotary_dim"] < p["head_size"] else ""
    name += ",interleaved-sections" if p["interleaved_sections"] else ""
    name += ",neox" if p["neox"] else ",gptj"
    return name + (",qkv-slices" if p["qkv_slices"] else "")


CASES = case_grid(
    _case_name,
    axis("tokens", (0, 1, 17)),
    axis("three_d", (True, False)),
    ({"head_size": 16, "rotary_dim": 16}, {"head_size": 64, "rotary_dim": 32}),
    axis("interleaved_sections", (False, True)),
    axis("neox", (True, False)),
    axis("qkv_slices", (False, True)),
)


# Qwen2-VL-like lane counts for the two rotary sizes of the cases: t, h, w.
_SECTIONS = {16: [2, 3, 3], 32: [4, 6, 6]}
_Q_HEADS, _KV_HEADS = 4, 2


def _make_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    p = case.params
    tokens, head_size, rotary_dim = p["tokens"], p["head_size"], p["rotary_dim"]
    q_size, kv_size = _Q_HEADS * head_size, _KV_HEADS * head_size
    if p["qkv_slices"]:
        # SGLang splits one qkv projection: q and k are column slices with a wider row stride.
        qkv = random_tensor((tokens, q_size + 2 * kv_size), dtype, device, generator)
        query, key = qkv[:, :q_size], qkv[:, q_size : q_size + kv_size]
    else:
        query = random_tensor((tokens, q_size), dtype, device, generator)
        key = random_tensor((tokens, kv_size), dtype, device, generator)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    freqs = torch.outer(torch.arange(MAX_POSITIONS, dtype=torch.float32), inv_freq)
    # On CPU and NPU SGLang keeps the cache in the model dtype, on CUDA in float32: both occur.
    cache_dtype = torch.float32 if p["qkv_slices"] else dtype
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(device, cache_dtype)
    shape = (AXES, tokens) if p["three_d"] else (tokens,)
    positions = torch.randint(0, MAX_POSITIONS, shape, generator=generator).to(device)
    obj = layer(
        head_size=head_size,
        rotary_dim=rotary_dim,
        is_neox_style=p["neox"],
        cos_sin_cache=cache,
        mrope_section=_SECTIONS[rotary_dim],
        mrope_interleaved=p["interleaved_sections"],
    )
    # Implementations may rotate in place: only the positions must stay untouched.
    return OpInputs(obj=obj, args=(positions, query, key), preserved=("positions",))


CONTRACT = OpContract(
    name="mrotary_embedding",
    sglang_layer="MRotaryEmbedding",
    summary="Multimodal rotary embedding of q and k: [3, tokens] positions, mrope sections",
    signature=inspect.signature(_signature),
    details=inspect.getdoc(_signature) or "",
    reference=reference,
    dtypes=STANDARD_DTYPES,
    tolerances=STANDARD_TOLERANCES,
    cases=CASES,
    make_inputs=_make_inputs,
)
