"""GDN's short causal convolution: ``causal_conv1d_fn`` (prefill) and ``causal_conv1d_update``.

SGLang 0.5.23's ``sglang.kernels.ops.mamba.causal_conv1d_triton`` functions, which its GDN
backend calls on every platform without a CUDA/NPU/CPU-kernel build. A depthwise convolution
of width ``W`` over each sequence; the pooled conv state ``[N, dim, W - 1]`` holds the last
``W - 1`` inputs of each request, so a sequence continues where its previous chunk ended.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ..contract import (
    STANDARD_DTYPES,
    STANDARD_TOLERANCES,
    OpCase,
    OpContract,
    OpInputs,
    random_tensor,
)
from ._gdn import scrambled_slots
from .state_indices import HOST_INDICES, PAD_SLOT_ID, check_state_indices

__all__ = ["CAUSAL_CONV1D_FN", "CAUSAL_CONV1D_UPDATE"]

ACTIVATIONS = (None, "silu", "swish")


def _activation(op: str, activation: str | bool | None) -> bool:
    """Whether SiLU follows the convolution (SGLang accepts ``True`` for ``"silu"``)."""
    if isinstance(activation, bool):
        return activation
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"{op}: activation {activation!r} is not one of {', '.join(map(repr, ACTIVATIONS))}"
        )
    return activation is not None


def _state_width(op: str, states: torch.Tensor, weight: torch.Tensor) -> int:
    width = weight.shape[-1]
    if states.shape[-1] != width - 1:
        raise ValueError(
            f"{op}: the conv state holds {states.shape[-1]} positions; this contract covers "
            f"states of exactly width - 1 = {width - 1}"
        )
    return width


def _convolve(
    window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool
) -> torch.Tensor:
    """``window`` ``[dim, W - 1 + L]`` float32 -> ``[dim, L]``: depthwise, then bias, SiLU."""
    out = F.conv1d(window.unsqueeze(0), weight.float().unsqueeze(1), groups=window.shape[0])[0]
    if bias is not None:
        out = out + bias.float()[:, None]
    return F.silu(out) if silu else out


def _fn_signature(
    obj: Any,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens_cpu: Sequence[int],
    cache_indices: torch.Tensor | None = None,
    has_initial_state: torch.Tensor | None = None,
    activation: str | bool | None = "silu",
    pad_slot_id: int = PAD_SLOT_ID,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill: the causal depthwise convolution of each sequence of a varlen batch.

    ``x`` ``[dim, T]`` (SGLang passes the transpose of ``[T, dim]``: a strided view), the
    sequences concatenated as ``query_start_loc`` ``[N + 1]`` says (``seq_lens_cpu`` their
    lengths); ``weight`` ``[dim, W]``, ``bias`` ``[dim]`` or ``None``; ``conv_states``
    ``[N_slots, dim, W - 1]``. Sequence ``i`` is preceded by ``conv_states[cache_indices[i]]``
    where ``has_initial_state[i]`` (else by zeros); afterwards that slot holds the last
    ``W - 1`` inputs (previous state included when the sequence is shorter). A
    ``pad_slot_id`` index skips the sequence (output zeros, no state touched); other indices
    outside the pool are an ``IndexError`` naming the op. Sequences that are not padding have
    distinct indices (SGLang gives each request its own slot; kernels run them concurrently).
    ``activation`` ``"silu"``/``"swish"``/``True`` applies SiLU. Float32 inside; returns
    ``(out, conv_states)``, ``out`` ``[dim, T]`` in ``x``'s dtype, ``conv_states`` the pool,
    written in place.
    """
    raise NotImplementedError


def causal_conv1d_fn(
    obj: Any,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens_cpu: Sequence[int],
    cache_indices: torch.Tensor | None = None,
    has_initial_state: torch.Tensor | None = None,
    activation: str | bool | None = "silu",
    pad_slot_id: int = PAD_SLOT_ID,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One ``conv1d`` per sequence over ``[state | tokens]``."""
    op = "causal_conv1d_fn"
    silu = _activation(op, activation)
    width = _state_width(op, conv_states, weight)
    bounds = [int(i) for i in query_start_loc.reshape(-1).tolist()]
    batch = len(bounds) - 1
    if [e - s for s, e in itertools.pairwise(bounds)] != [int(n) for n in seq_lens_cpu]:
        raise ValueError(
            f"{op}: seq_lens_cpu {list(seq_lens_cpu)} disagrees with query_start_loc {bounds}"
        )
    if cache_indices is None:
        slots = list(range(batch))
        check_state_indices(op, torch.arange(batch), conv_states.shape[0], pad_slot_id=None)
    else:
        if cache_indices.numel() != batch:
            raise ValueError(f"{op}: {cache_indices.numel()} cache indices for {batch} sequences")
        check_state_indices(op, cache_indices, conv_states.shape[0], pad_slot_id=pad_slot_id)
        slots = [int(i) for i in cache_indices.reshape(-1).tolist()]
    initial = (
        [bool(i) for i in has_initial_state.reshape(-1).tolist()]
        if has_initial_state is not None
        else [False] * batch
    )
    dim = x.shape[0]
    out = torch.zeros(dim, x.shape[1], dtype=torch.float32, device=x.device)
    finals: list[tuple[int, torch.Tensor]] = []
    for i, slot in enumerate(slots):
        start, end = bounds[i], bounds[i + 1]
        if slot == pad_slot_id or end == start:
            continue
        prev = (
            conv_states[slot].float()
            if initial[i]
            else torch.zeros(dim, width - 1, dtype=torch.float32, device=x.device)
        )
        window = torch.cat((prev, x[:, start:end].float()), dim=-1)
        out[:, start:end] = _convolve(window, weight, bias, silu)
        finals.append((slot, window[:, -(width - 1) :]))
    for slot, final in finals:
        conv_states[slot] = final.to(conv_states.dtype)
    return out.to(x.dtype), conv_states


def _update_signature(
    obj: Any,
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | bool | None = None,
    conv_state_indices: torch.Tensor | None = None,
    pad_slot_id: int = PAD_SLOT_ID,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode: the next ``L`` inputs of each request, continuing its pooled conv state.

    ``x`` ``[B, dim]`` (one token) or ``[B, dim, L]``; ``conv_state`` ``[N_slots, dim, W - 1]``;
    row ``i`` uses and then shifts ``conv_state[conv_state_indices[i]]`` (row ``i`` without
    indices). ``pad_slot_id`` rows are skipped (zeros, no state touched); other out-of-pool
    indices are an ``IndexError`` naming the op; rows that are not padding have distinct
    indices. Returns ``(out, conv_state)``: ``out`` as
    ``x`` (shape and dtype), ``conv_state`` the pool, written in place. (SGLang's speculative
    options, ``cache_seqlens`` and the intermediate windows, are not part of this contract.)
    """
    raise NotImplementedError


def causal_conv1d_update(
    obj: Any,
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | bool | None = None,
    conv_state_indices: torch.Tensor | None = None,
    pad_slot_id: int = PAD_SLOT_ID,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather the rows' windows, one batched grouped ``conv1d``, scatter the new states."""
    op = "causal_conv1d_update"
    silu = _activation(op, activation)
    width = _state_width(op, conv_state, weight)
    squeeze = x.dim() == 2
    x3 = x.unsqueeze(-1) if squeeze else x
    batch, dim, length = x3.shape
    if conv_state_indices is None:
        slots = list(range(batch))
        check_state_indices(op, torch.arange(batch), conv_state.shape[0], pad_slot_id=None)
    else:
        if conv_state_indices.numel() != batch:
            raise ValueError(f"{op}: {conv_state_indices.numel()} state indices for {batch} rows")
        check_state_indices(op, conv_state_indices, conv_state.shape[0], pad_slot_id=pad_slot_id)
        slots = [int(i) for i in conv_state_indices.reshape(-1).tolist()]
    out = torch.zeros(batch, dim, length, dtype=torch.float32, device=x.device)
    live = [i for i, s in enumerate(slots) if s != pad_slot_id]
    if live:
        rows = torch.tensor(live, device=x.device)
        where = torch.tensor([slots[i] for i in live], device=x.device)
        window = torch.cat((conv_state[where].float(), x3[rows].float()), dim=-1)
        n = len(live)
        flat = window.reshape(1, n * dim, width - 1 + length)
        conv = F.conv1d(flat, weight.float().repeat(n, 1).unsqueeze(1), groups=n * dim)
        conv = conv.reshape(n, dim, length)
        if bias is not None:
            conv = conv + bias.float()[None, :, None]
        out[rows] = F.silu(conv) if silu else conv
        conv_state[where] = window[..., -(width - 1) :].to(conv_state.dtype)
    result = out.to(x.dtype)
    return (result.squeeze(-1) if squeeze else result), conv_state


def _name(p: Mapping[str, Any]) -> str:
    lens = p["lens"]
    name = f"batch={len(lens)},lens={'+'.join(map(str, lens)) or '-'}"
    name += f",dim={p['dim']},width={p['width']}"
    name += "" if p.get("activation", "silu") else ",no-activation"
    name += ",bias" if p.get("bias") else ""
    name += ",padding" if p.get("padding") else ""
    return name + (",strided" if p.get("strided") else "")


FN_CASES = tuple(
    OpCase(_name(p), p)
    for p in (
        {"lens": (), "dim": 24, "width": 4, "strided": True},
        {"lens": (1,), "dim": 24, "width": 4, "strided": True},
        {
            "lens": (7, 2, 33),
            "dim": 24,
            "width": 4,
            "strided": True,
            "initial": (True, True, False),
        },
        {"lens": (5, 3), "dim": 16, "width": 4, "strided": True, "bias": True, "activation": None},
        {"lens": (4, 6, 2), "dim": 16, "width": 3, "strided": True, "padding": True},
        {"lens": (9,), "dim": 16, "width": 4, "initial": (True,)},
    )
)


def _pool_and_slots(
    count: int, dim: int, width: int, dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    pool = random_tensor((count + 2, dim, width - 1), dtype, device, gen)
    return pool, scrambled_slots(count, count + 2)


def _fn_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    p = case.params
    lens, dim, width = p["lens"], p["dim"], p["width"]
    total = sum(lens)
    if p.get("strided"):  # [T, dim] transposed, as SGLang passes mixed_qkv.transpose(0, 1)
        x = random_tensor((total, dim), dtype, device, generator).transpose(0, 1)
    else:
        x = random_tensor((dim, total), dtype, device, generator)
    weight = random_tensor((dim, width), dtype, device, generator)
    bias = random_tensor((dim,), dtype, device, generator) if p.get("bias") else None
    pool, slots = _pool_and_slots(len(lens), dim, width, dtype, device, generator)
    if p.get("padding"):
        slots[1] = PAD_SLOT_ID
    initial = p.get("initial", tuple(i % 2 == 0 for i in range(len(lens))))
    qsl = torch.tensor(
        [0, *torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32
    )
    return OpInputs(
        obj=None,
        args=(x, weight, bias, pool, qsl.to(device), list(lens)),
        kwargs={
            "cache_indices": slots.to(device),
            "has_initial_state": torch.tensor(initial, dtype=torch.bool, device=device),
            "activation": p.get("activation", "silu"),
        },
        preserved=("x", "weight", "query_start_loc", "cache_indices", "has_initial_state"),
        written_in_place={1: "conv_states"},
    )


CAUSAL_CONV1D_FN = OpContract(
    name="causal_conv1d_fn",
    sglang_layer="causal_conv1d_fn (kernel function, GDN/Mamba prefill)",
    summary="Varlen causal depthwise conv1d (+bias, SiLU), pooled conv state in place",
    signature=inspect.signature(_fn_signature),
    details=inspect.getdoc(_fn_signature) or "",
    reference=causal_conv1d_fn,
    dtypes=STANDARD_DTYPES,
    tolerances=STANDARD_TOLERANCES,
    cases=FN_CASES,
    make_inputs=_fn_inputs,
)


UPDATE_CASES = tuple(
    OpCase(_name(p), p)
    for p in (
        {"lens": (), "dim": 24, "width": 4},
        {"lens": (1,), "dim": 24, "width": 4},
        {"lens": (1,) * 5, "dim": 24, "width": 4, "bias": True},
        {"lens": (1,) * 4, "dim": 16, "width": 4, "padding": True, "activation": None},
        {"lens": (3, 3), "dim": 16, "width": 3},  # several tokens per row
        {"lens": (1,) * 3, "dim": 16, "width": 4, "strided": True},
    )
)


def _update_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    p = case.params
    lens, dim, width = p["lens"], p["dim"], p["width"]
    batch, length = len(lens), (lens[0] if lens else 1)
    if length == 1:
        x = random_tensor((batch, dim), dtype, device, generator, contiguous=not p.get("strided"))
    else:
        x = random_tensor((batch, dim, length), dtype, device, generator)
    weight = random_tensor((dim, width), dtype, device, generator)
    bias = random_tensor((dim,), dtype, device, generator) if p.get("bias") else None
    pool, slots = _pool_and_slots(batch, dim, width, dtype, device, generator)
    if p.get("padding"):
        slots[2] = PAD_SLOT_ID
    return OpInputs(
        obj=None,
        args=(x, pool, weight, bias, p.get("activation", "silu"), slots.to(device)),
        preserved=("x", "weight", "bias", "conv_state_indices"),
        written_in_place={1: "conv_state"},
    )


CAUSAL_CONV1D_UPDATE = OpContract(
    name="causal_conv1d_update",
    sglang_layer="causal_conv1d_update (kernel function, GDN/Mamba decode)",
    summary="Causal depthwise conv1d of the next tokens, continuing the pooled conv state",
    signature=inspect.signature(_update_signature),
    details=inspect.getdoc(_update_signature) or "",
    reference=causal_conv1d_update,
    dtypes=STANDARD_DTYPES,
    tolerances=STANDARD_TOLERANCES,
    cases=UPDATE_CASES,
    make_inputs=_update_inputs,
    reference_graph_problems=HOST_INDICES,
)
