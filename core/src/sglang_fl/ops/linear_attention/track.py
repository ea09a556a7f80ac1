"""``track_mamba_states``: the hybrid radix cache's state snapshot at decode.

SGLang 0.5.23's ``sglang.kernels.ops.mamba.mamba_state_scatter_triton``
(``track_mamba_states_if_needed`` per layer, ``track_mamba_states_all_layers`` for all):
for each decode row SGLang marks, copy its live conv and SSM state rows into the snapshot
slot the radix cache keeps for that prefix. A Triton kernel, so it runs nowhere else.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from ..contract import STANDARD_DTYPES, OpCase, OpContract, OpInputs, Tolerance, random_tensor
from .state_indices import HOST_INDICES, check_state_indices

__all__ = ["TRACK_MAMBA_STATES"]


def _signature(
    obj: Any,
    conv_states: torch.Tensor,
    ssm_states: torch.Tensor,
    cache_indices: torch.Tensor,
    mamba_track_mask: torch.Tensor,
    mamba_track_indices: torch.Tensor,
    batch_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy, in every layer, row ``cache_indices[i]`` to row ``mamba_track_indices[i]``.

    ``conv_states`` ``[L, N, ...]`` and ``ssm_states`` ``[L, N, ...]`` are all layers'
    pools (one layer: ``L = 1``); rows ``i < batch_size`` with ``mamba_track_mask[i]`` are
    copied, others untouched. A source or destination outside the pool is an
    ``IndexError`` naming the op. Exact copies; returns the two pools, written in place.
    """
    raise NotImplementedError


def track_mamba_states(
    obj: Any,
    conv_states: torch.Tensor,
    ssm_states: torch.Tensor,
    cache_indices: torch.Tensor,
    mamba_track_mask: torch.Tensor,
    mamba_track_indices: torch.Tensor,
    batch_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Indexed copies with the mask applied on the host."""
    op = "track_mamba_states"
    mask = [bool(m) for m in mamba_track_mask[:batch_size].tolist()]
    rows = [i for i, m in enumerate(mask) if m]
    if rows:
        pool = conv_states.shape[1]
        src, dst = cache_indices[rows], mamba_track_indices[rows]
        check_state_indices(op, src, pool, pad_slot_id=None)
        check_state_indices(op, dst, pool, pad_slot_id=None)
        src_t = src.to(device=conv_states.device, dtype=torch.int64)
        dst_t = dst.to(device=conv_states.device, dtype=torch.int64)
        conv_states[:, dst_t] = conv_states[:, src_t]
        ssm_states[:, dst_t] = ssm_states[:, src_t]
    return conv_states, ssm_states


def _name(p: Mapping[str, Any]) -> str:
    return f"batch={p['batch']},layers={p['layers']},tracked={p['tracked']}" + (
        ",strided" if p.get("strided") else ""
    )


_PARAMS: tuple[dict[str, Any], ...] = (
    {"batch": 0, "layers": 2, "tracked": ()},
    {"batch": 1, "layers": 1, "tracked": (0,)},
    {"batch": 4, "layers": 3, "tracked": (1, 3)},
    {"batch": 3, "layers": 2, "tracked": ()},
    {"batch": 3, "layers": 2, "tracked": (0, 2), "strided": True},
)
CASES = tuple(OpCase(_name(p), p) for p in _PARAMS)


def _make_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    p = case.params
    batch, layers = p["batch"], p["layers"]
    slots = 2 * batch + 2
    conv = random_tensor((layers, slots, 6, 3), dtype, device, generator)
    ssm = random_tensor((layers, slots, 2, 4, 4), torch.float32, device, generator)
    if p.get("strided"):  # one layer's rows out of a wider (all-layer) envelope
        conv = random_tensor((layers * 2, slots, 6, 3), dtype, device, generator)[::2]
    cache = torch.tensor([2 * i + 1 for i in range(batch)], dtype=torch.int32)
    track = torch.tensor([2 * i + 2 for i in range(batch)], dtype=torch.int64)
    mask = torch.tensor([i in p["tracked"] for i in range(batch)], dtype=torch.bool)
    return OpInputs(
        obj=None,
        args=(conv, ssm, cache.to(device), mask.to(device), track.to(device), batch),
        preserved=("cache_indices", "mamba_track_mask", "mamba_track_indices"),
        written_in_place={0: "conv_states", 1: "ssm_states"},
    )


_EXACT = {dtype: Tolerance(atol=1e-6, rtol=1e-6) for dtype in STANDARD_DTYPES}

TRACK_MAMBA_STATES = OpContract(
    name="track_mamba_states",
    sglang_layer="track_mamba_states_if_needed / _all_layers (kernel functions, decode)",
    summary="Snapshot the tracked rows' conv and SSM states into their radix-cache slots",
    signature=inspect.signature(_signature),
    details=inspect.getdoc(_signature) or "",
    reference=track_mamba_states,
    dtypes=STANDARD_DTYPES,
    tolerances=_EXACT,
    cases=CASES,
    make_inputs=_make_inputs,
    reference_graph_problems=HOST_INDICES,
)
