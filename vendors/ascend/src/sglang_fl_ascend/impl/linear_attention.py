"""The gated-delta-rule (GDN) family on Ascend: sgl_kernel_npu's functions, as SGLang's NPU path
calls them, each behind a signature probe (``kernels.py``).

torch_npu has no GDN operators. SGLang 0.5.23's NPU path imports sgl_kernel_npu's (read in the
SGLang wheel: ``models/qwen3_next.py`` binds ``fla.utils.fused_qkvzba_split_reshape_cat``,
``models/qwen3_5.py`` ``..._contiguous``; ``layers/attention/linear/gdn_backend.py`` binds
``fla.fused_gdn_gating.fused_gdn_gating_npu`` and ``mamba.causal_conv1d.causal_conv1d_fn_npu``
/ ``causal_conv1d_update_npu``; ``kernels/ops/attention/fla/layernorm_gated.py`` calls
``fla.layernorm_gated.layer_norm_fwd_npu``; ``linear/kernels/gdn_triton.py`` binds
``fla.chunk.chunk_gated_delta_rule_npu`` and ``fla.fused_sigmoid_gating_recurrent_decode_
optimized``; ``hardware_backend/npu/attention/ascend_gdn_backend.py`` calls
``torch.ops.npu.chunk_gated_delta_rule``). No SGLang release pins an sgl_kernel_npu
version, so every adapter names the forms it knows (file and line of the release, here
``main`` at f425bdf1 unless said) and declines a release that matches none.

What each function takes, read in its source, and how the adapters meet it:

- ``fused_gdn_gating_npu``: ``(A_log, a, b, dt_bias, beta, threshold) -> (g, sigmoid(b))``, or
  in another release ``(A_log, a, dt_bias, beta, threshold) -> g`` (sigmoid(b) then computed
  here in float32); ``a``/``b`` addressed densely (``off = row * NUM_HEADS + head``: strided
  rows are packed); ``g`` ``[1, T, HV]`` or ``[T, HV]`` (sgl-kernel-npu #747): reshaped to the
  contract's float32 ``[1, T, HV]``.
- ``fused_qkvzba_split_reshape_cat(_contiguous)``: row strides computed from the head counts
  (inputs packed here), Triton ranges over ``head_qk``, ``r * head_v`` and ``r`` (interleaved)
  or ``num_heads_v`` (contiguous) that must be powers of two; an empty batch is not launched.
- ``layer_norm_fwd_npu``: the gate's activation is SiLU only (SGLang: "NPU only supports swish
  activation"); unit-stride rows, the group size at most 64 KiB of the dtype.
- ``causal_conv1d_update_npu``: without speculative arguments a torch path that takes one
  token per request, ignores ``bias`` and indexes the pool with every index (a pad index -1
  would write the last slot): one token and no bias only, pad rows are left out of the call.
- ``causal_conv1d_fn_npu``: reads and writes the pool slot of every sequence it is given
  (``index_select``/``index_copy_``, no pad handling; an empty sequence's slot is rewritten):
  pad and empty sequences are left out of the call, the rest repacked.
- the delta rule (``fla.fused_sigmoid_gating_recurrent(_decode_optimized)``, ``fla.chunk`` /
  ``fla.chunk_gated_delta_rule_npu``): the state order changed with sgl-kernel-npu #747 (K-major
  before, V-major after) under the same signatures; it is read from the module #747 added, and
  live states are gathered in the kernel's order and written back where it is not the pool's.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from sglang_fl.types import Unsupported

from ..backend import AscendSoc, platform
from ..kernels import REPO, CallForm, SdkFunction, has_module

__all__ = ["ADAPTERS", "NO_KERNEL"]

_MAIN = "main at f425bdf1"
_SGLANG = "torch_npu has no operator; SGLang's NPU path calls sgl_kernel_npu's"
_NONE = "torch_npu has no operator and sgl_kernel_npu none that SGLang 0.5.23 uses"
NO_KERNEL = {
    "fused_sigmoid_mul": f"{_SGLANG} activation.fused_sigmoid_mul (Qwen3.5's attention output "
    "gate, on a contiguous gate), which no sgl_kernel_npu release on main has yet",
    "fused_recurrent_gated_delta_rule": _NONE,
    "fused_recurrent_gated_delta_rule_packed_decode": f"{_NONE} (packed decode is off on NPU)",
    "track_mamba_states": _NONE,
}


def _dense(x: torch.Tensor) -> torch.Tensor:
    return x if x.is_contiguous() else x.contiguous()


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


# -- fused_gdn_gating -----------------------------------------------------------------------------

GATING = SdkFunction(
    "fused_gdn_gating",
    (
        CallForm(
            "with-sigmoid",
            "fla.fused_gdn_gating",
            "fused_gdn_gating_npu",
            ("A_log", "a", "b", "dt_bias", "beta", "threshold"),
            f"{REPO}/fla/fused_gdn_gating.py:80-137 ({_MAIN}): returns (g, beta_output)",
        ),
        CallForm(
            "g-only",
            "fla.fused_gdn_gating",
            "fused_gdn_gating_npu",
            ("A_log", "a", "dt_bias", "beta", "threshold"),
            f"{REPO}/fla/fused_gdn_gating.py:45-75 (5c3d28b7): returns g only",
        ),
    ),
)


def fused_gdn_gating(
    obj: Any,
    A_log: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dt_bias: torch.Tensor,
    beta: float = 1.0,
    threshold: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill gates on ``sgl_kernel_npu``'s ``fused_gdn_gating_npu``; float32 ``[1, T, HV]``."""
    if a.dim() != 2 or b.shape != a.shape or A_log.shape != (a.shape[1],):
        raise Unsupported(
            "fused_gdn_gating: a and b must be [T, HV] and A_log [HV] (sgl_kernel_npu "
            "fused_gdn_gating_npu: `batch, num_heads = a.shape`)"
        )
    form, kernel = GATING.resolve()
    tokens, heads = a.shape
    shape = (1, tokens, heads)
    if tokens == 0:  # its launch grid is one program per row: none for an empty batch
        empty = torch.empty(shape, dtype=torch.float32, device=a.device)
        return empty, empty.clone()
    packed = (_dense(A_log), _dense(a))
    if form.name == "g-only":
        g = kernel(*packed, _dense(dt_bias), beta, threshold)
        beta_out = torch.sigmoid(b.float())
    else:
        g, beta_out = kernel(*packed, _dense(b), _dense(dt_bias), beta, threshold)
    return g.reshape(shape).float(), beta_out.reshape(shape).float()


# -- fused_qkvzba_split_reshape_cat(_contiguous) --------------------------------------------------

_SPLIT_ARGS = ("mixed_qkvz", "mixed_ba", "num_heads_qk", "num_heads_v", "head_qk", "head_v")
SPLIT = SdkFunction(
    "fused_qkvzba_split_reshape_cat",
    (
        CallForm(
            "interleaved",
            "fla.utils",
            "fused_qkvzba_split_reshape_cat",
            _SPLIT_ARGS,
            f"{REPO}/fla/utils.py:247-462 ({_MAIN})",
        ),
    ),
)
SPLIT_CONTIGUOUS = SdkFunction(
    "fused_qkvzba_split_reshape_cat_contiguous",
    (
        CallForm(
            "contiguous",
            "fla.utils",
            "fused_qkvzba_split_reshape_cat_contiguous",
            _SPLIT_ARGS,
            f"{REPO}/fla/utils.py:477-667 ({_MAIN})",
        ),
    ),
)


def _split(
    kernel: SdkFunction,
    ranges: Callable[[int, int, int, int], Mapping[str, int]],
    mixed_qkvz: torch.Tensor,
    mixed_ba: torch.Tensor,
    num_heads_qk: int,
    num_heads_v: int,
    head_qk: int,
    head_v: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    op = kernel.op
    if num_heads_qk <= 0 or num_heads_v % num_heads_qk:
        raise ValueError(
            f"{op}: num_heads_v ({num_heads_v}) must be a positive multiple of num_heads_qk "
            f"({num_heads_qk})"
        )
    odd = {
        name: n
        for name, n in ranges(num_heads_qk, num_heads_v, head_qk, head_v).items()
        if not _is_power_of_two(n)
    }
    if odd:
        raise Unsupported(
            f"sgl_kernel_npu {op}: its kernel's tl.arange extents must be powers of two, got "
            f"{odd} ({kernel.forms[0].source})"
        )
    _, fn = kernel.resolve()
    tokens = mixed_qkvz.shape[0]
    if tokens == 0:  # no rows: nothing to launch
        qkv = 2 * num_heads_qk * head_qk + num_heads_v * head_v
        return (
            mixed_qkvz.new_empty((0, qkv)),
            mixed_qkvz.new_empty((0, num_heads_v, head_v)),
            mixed_ba.new_empty((0, num_heads_v)),
            mixed_ba.new_empty((0, num_heads_v)),
        )
    mixed_qkv, z, b, a = fn(
        _dense(mixed_qkvz), _dense(mixed_ba), num_heads_qk, num_heads_v, head_qk, head_v
    )
    return mixed_qkv, z, b, a


def _interleaved_ranges(h: int, hv: int, head_qk: int, head_v: int) -> Mapping[str, int]:
    r = hv // h
    return {"head_qk": head_qk, "r * head_v": r * head_v, "r": r}


def fused_qkvzba_split_reshape_cat(
    obj: Any,
    mixed_qkvz: torch.Tensor,
    mixed_ba: torch.Tensor,
    num_heads_qk: int,
    num_heads_v: int,
    head_qk: int,
    head_v: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Qwen3-Next's interleaved split on sgl_kernel_npu's kernel (new tensors)."""
    return _split(
        SPLIT, _interleaved_ranges, mixed_qkvz, mixed_ba, num_heads_qk, num_heads_v, head_qk,
        head_v,
    )  # fmt: skip


def fused_qkvzba_split_reshape_cat_contiguous(
    obj: Any,
    mixed_qkvz: torch.Tensor,
    mixed_ba: torch.Tensor,
    num_heads_qk: int,
    num_heads_v: int,
    head_qk: int,
    head_v: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Qwen3.5's contiguous split on sgl_kernel_npu's kernel (new tensors)."""
    return _split(
        SPLIT_CONTIGUOUS, lambda h, hv, dk, dv: {"num_heads_v": hv}, mixed_qkvz, mixed_ba,
        num_heads_qk, num_heads_v, head_qk, head_v,
    )  # fmt: skip


# -- rms_norm_gated -------------------------------------------------------------------------------

NORM = SdkFunction(
    "rms_norm_gated",
    (
        CallForm(
            "layer-norm-fwd",
            "fla.layernorm_gated",
            "layer_norm_fwd_npu",
            (
                "x",
                "weight",
                "bias",
                "eps",
                "z",
                "out",
                "group_size",
                "norm_before_gate",
                "is_rms_norm",
            ),
            f"{REPO}/fla/layernorm_gated.py:242-314 ({_MAIN}): returns (out, mean, rstd)",
        ),
    ),
)
SILU = ("swish", "silu")  # the gate activations that are SiLU, as the kernel computes
MAX_ROW_BYTES = 65536  # layer_norm_fwd_npu: MAX_FUSED_SIZE = 65536 // element_size


def rms_norm_gated(obj: Any, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``layer_norm_fwd_npu(x, weight, None, eps, z=gate, is_rms_norm=True, ...)`` as SGLang's
    ``rms_norm_gated`` on NPU calls it; the first of its three outputs."""
    if obj.activation not in SILU:
        raise Unsupported(
            f"sgl_kernel_npu layer_norm_fwd_npu gates with SiLU only (x *= z * sigmoid(z), "
            f"{REPO}/fla/layernorm_gated.py:206-208; SGLang's NPU rms_norm_gated: 'NPU only "
            f"supports swish activation'), not {obj.activation!r}"
        )
    hidden = x.shape[-1]
    group = getattr(obj, "group_size", None) or hidden
    if hidden % group or group * x.element_size() > MAX_ROW_BYTES:
        raise Unsupported(
            f"sgl_kernel_npu layer_norm_fwd_npu: groups that divide the row, at most "
            f"{MAX_ROW_BYTES} bytes ('Feature dim too large.', {REPO}/fla/layernorm_gated.py:"
            f"282-285), got {group} of {hidden} in {x.dtype}"
        )
    _, kernel = NORM.resolve()
    if x.shape[0] == 0:  # no rows: no launch
        return torch.empty_like(x)
    rows = x if x.stride(-1) == 1 else x.contiguous()
    gates = gate if gate.stride(-1) == 1 else gate.contiguous()
    out, _, _ = kernel(
        rows,
        _dense(obj.weight),
        None,
        obj.eps,
        z=gates,
        group_size=getattr(obj, "group_size", None),
        norm_before_gate=getattr(obj, "norm_before_gate", True),
        is_rms_norm=True,
    )
    result: torch.Tensor = out
    return result


# -- causal_conv1d_update / causal_conv1d_fn ------------------------------------------------------

_CONV = f"{REPO}/mamba/causal_conv1d.py"
CONV_UPDATE = SdkFunction(
    "causal_conv1d_update",
    (
        CallForm(
            "torch-path",
            "mamba.causal_conv1d",
            "causal_conv1d_update_npu",
            (
                "x",
                "conv_state",
                "weight",
                "bias",
                "activation",
                "cache_seqlens",
                "conv_state_indices",
            ),
            f"{_CONV}:1239-1428 ({_MAIN}): without cache_seqlens/num_accepted_tokens, "
            "torch_causal_conv1d_update_npu",
        ),
    ),
)
CONV_FN = SdkFunction(
    "causal_conv1d_fn",
    (
        CallForm(
            "padded-native",
            "mamba.causal_conv1d",
            "causal_conv1d_fn_npu",
            (
                "x",
                "weight",
                "bias",
                "query_start_loc",
                "cache_indices",
                "has_initial_state",
                "conv_states",
                "activation",
            ),
            f"{_CONV}:651-812 ({_MAIN}): prepare_data, causal_conv1d_fn_native, index_copy_",
        ),
    ),
)


def _silu(op: str, activation: str | bool | None) -> str | None:
    """The contract's activation as sgl_kernel_npu's conv functions spell it."""
    if isinstance(activation, bool):
        return "silu" if activation else None
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"{op}: activation {activation!r} is not None, 'silu' or 'swish'")
    return activation


def _check_state(op: str, states: torch.Tensor, weight: torch.Tensor) -> None:
    if states.shape[-1] != weight.shape[-1] - 1:
        raise Unsupported(
            f"sgl_kernel_npu {op}: conv states of width - 1 = {weight.shape[-1] - 1} positions "
            f"(its torch path shifts by exactly that), got {states.shape[-1]}"
        )


def causal_conv1d_update(
    obj: Any,
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | bool | None = None,
    conv_state_indices: torch.Tensor | None = None,
    pad_slot_id: int = -1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode token per request on ``causal_conv1d_update_npu``'s torch path."""
    op = "causal_conv1d_update"
    silu = _silu(op, activation)
    if x.dim() == 3 and x.shape[-1] != 1:
        raise Unsupported(
            f"sgl_kernel_npu causal_conv1d_update_npu: its torch path (no cache_seqlens) sums "
            f"over one window, so one token per request, got {x.shape[-1]} ({_CONV}:1239-1263)"
        )
    if bias is not None:
        raise Unsupported(
            f"sgl_kernel_npu causal_conv1d_update_npu: its torch path ignores bias "
            f"({_CONV}:1239-1263)"
        )
    _check_state(op, conv_state, weight)
    _, kernel = CONV_UPDATE.resolve()
    rows = x.shape[0]
    slots = (
        conv_state_indices.reshape(-1).long()
        if conv_state_indices is not None
        else torch.arange(rows, device=x.device)
    )
    if slots.numel() != rows:
        raise ValueError(f"{op}: {slots.numel()} state indices for {rows} rows")
    live = (slots != pad_slot_id).nonzero().flatten()
    out = torch.zeros_like(x)
    if live.numel() == 0:
        return out, conv_state
    where = slots[live]
    if bool(((where < 0) | (where >= conv_state.shape[0])).any()):
        raise IndexError(
            f"{op}: state indices {where.tolist()} outside the pool of {len(conv_state)}"
        )
    served = kernel(
        _dense(x[live]),
        conv_state,
        weight,
        bias=None,
        activation=silu,
        conv_state_indices=where.to(torch.int32),
    )
    out[live] = served.to(x.dtype)
    return out, conv_state


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
    pad_slot_id: int = -1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The prefill conv on ``causal_conv1d_fn_npu``: the sequences that have tokens and a slot,
    repacked, in one call for those continuing a state and one for those starting afresh (its
    final-state gather assumes one or the other for the whole call: ``base = seqlens - (width
    - 1) * (~has_initial_state)`` reads the un-prefixed offsets of a fresh sequence in the
    prefixed input of a mixed call, ``mamba/causal_conv1d.py:682-694``); other positions stay
    zero."""
    op = "causal_conv1d_fn"
    silu = _silu(op, activation)
    _check_state(op, conv_states, weight)
    if not (x.dtype == weight.dtype == conv_states.dtype):
        raise Unsupported(
            f"sgl_kernel_npu causal_conv1d_fn_npu: x, weight and conv_states of one dtype "
            f"(index_copy_ into a weight-dtype buffer and into the pool, "
            f"mamba/causal_conv1d.py:731, 800), got {x.dtype}/{weight.dtype}/{conv_states.dtype}"
        )
    _, kernel = CONV_FN.resolve()
    lengths = [int(n) for n in seq_lens_cpu]
    batch = len(lengths)
    slots = (
        [int(i) for i in cache_indices.reshape(-1).tolist()]
        if cache_indices is not None
        else list(range(batch))
    )
    if len(slots) != batch:
        raise ValueError(f"{op}: {len(slots)} cache indices for {batch} sequences")
    live = [i for i in range(batch) if slots[i] != pad_slot_id and lengths[i] > 0]
    if any(not 0 <= slots[i] < conv_states.shape[0] for i in live):
        raise IndexError(f"{op}: cache indices {slots} outside the pool of {len(conv_states)}")
    initial = (
        [bool(v) for v in has_initial_state.reshape(-1).tolist()]
        if has_initial_state is not None
        else [False] * batch
    )
    starts = [int(s) for s in query_start_loc.reshape(-1).tolist()[:-1]]
    out = torch.zeros_like(x)
    for continuing in (True, False):
        group = [i for i in live if initial[i] is continuing]
        if not group:
            continue
        columns = torch.cat([torch.arange(starts[i], starts[i] + lengths[i]) for i in group]).to(
            x.device
        )
        bounds = [0, *torch.tensor([lengths[i] for i in group]).cumsum(0).tolist()]
        served = kernel(
            _dense(x[:, columns]),
            weight,
            bias,
            query_start_loc=torch.tensor(bounds, dtype=torch.int32, device=x.device),
            cache_indices=torch.tensor(
                [slots[i] for i in group], dtype=torch.int32, device=x.device
            ),
            has_initial_state=torch.full((len(group),), continuing, device=x.device),
            conv_states=conv_states,
            activation=silu,
        )
        out[:, columns] = served[:, : columns.numel()].to(x.dtype)
    return out, conv_states


# -- the gated delta rule: pooled states in the order of the installed release ---------------------


class StateOrder(enum.Enum):
    """How sgl_kernel_npu's delta-rule kernels lay out one head's state."""

    V_MAJOR = "[V, K]"  # the contract's and SGLang's pool [N, HV, V, K]; sgl_kernel_npu since #747
    K_MAJOR = "[K, V]"  # sgl_kernel_npu before #747 (issue #640: `o_k[:, None] * V + o_v`)


# The module sgl-kernel-npu #747 added with the state layout it unified to V-major
# (fla/chunk_gated_delta_rule_npu.py: "initial_state: (B, Nv, Dv, Dk)"); SGLang 0.5.23's
# ascend_gdn_backend hands the same pool to it and to the decode kernel.
UNIFIED_LAYOUT = "fla.chunk_gated_delta_rule_npu"


def state_order() -> StateOrder:
    """The installed release's state order: V-major from #747 on, K-major before."""
    return StateOrder.V_MAJOR if has_module(UNIFIED_LAYOUT) else StateOrder.K_MAJOR


def _slots(op: str, indices: torch.Tensor | None, count: int, pool: torch.Tensor) -> torch.Tensor:
    """int64 pool rows of ``count`` sequences (``-1``: padding); another index past the pool
    is an ``IndexError`` naming ``op`` (a kernel would write outside it)."""
    slots = (
        indices.reshape(-1).long()
        if indices is not None
        else torch.arange(count, device=pool.device)
    )
    if slots.numel() != count:
        raise ValueError(f"{op}: {slots.numel()} state indices for {count} sequences")
    bad = ((slots < -1) | (slots >= pool.shape[0])).nonzero().flatten().tolist()
    if bad:
        raise IndexError(
            f"{op}: state index {int(slots[bad[0]])} at position {bad[0]} is outside the state "
            f"pool of {pool.shape[0]} slots (allowed: 0..{pool.shape[0] - 1}, or -1 for padding)"
        )
    return slots


def _in_order(states: torch.Tensor, order: StateOrder) -> torch.Tensor:
    """``[n, HV, V, K]`` pool rows as the kernel lays them out, contiguous (a copy)."""
    return (states.transpose(-1, -2) if order is StateOrder.K_MAJOR else states).contiguous()


def _from_order(states: torch.Tensor, order: StateOrder) -> torch.Tensor:
    """The kernel's ``[n, HV, ?, ?]`` states back in the contract's ``[n, HV, V, K]``."""
    return states.transpose(-1, -2) if order is StateOrder.K_MAJOR else states


def _lengths(op: str, cu_seqlens: torch.Tensor | None, batch: int, tokens: int) -> list[int]:
    """Tokens per sequence: ``cu_seqlens``'s (batch 1) or one sequence per batch row."""
    if cu_seqlens is None:
        return [tokens] * batch
    if batch != 1:
        raise ValueError(f"{op}: with cu_seqlens the batch dim is 1, got {batch}")
    bounds = [int(i) for i in cu_seqlens.reshape(-1).tolist()]
    if not bounds or bounds[0] != 0 or bounds[-1] != tokens or sorted(bounds) != bounds:
        raise ValueError(f"{op}: cu_seqlens {bounds} must rise from 0 to {tokens}")
    return [end - start for start, end in itertools.pairwise(bounds)]


_DECODE_ARGS = (
    "A_log",
    "a",
    "dt_bias",
    "softplus_beta",
    "softplus_threshold",
    "q",
    "k",
    "v",
    "b",
    "initial_state_source",
    "initial_state_indices",
    "scale",
    "use_qk_l2norm_in_kernel",
    "cu_seqlens",
)
_RECURRENT = f"{REPO}/fla/fused_sigmoid_gating_recurrent"
DECODE_ONE_TOKEN = SdkFunction(
    "fused_sigmoid_gating_delta_rule_update",
    (
        CallForm(
            "one-token",
            "fla.fused_sigmoid_gating_recurrent_decode_optimized",
            "fused_sigmoid_gating_delta_rule_update_decode_npu",
            _DECODE_ARGS,
            f"{_RECURRENT}_decode_optimized.py:174-284 (5300df95, sgl-kernel-npu #740; what "
            "SGLang 0.5.23's gdn_triton.py binds): one token per sequence, o [N, HV, V]",
        ),
    ),
)
DECODE = SdkFunction(
    "fused_sigmoid_gating_delta_rule_update",
    (
        CallForm(
            "two-heads-per-program",
            "fla.fused_sigmoid_gating_recurrent",
            "fused_sigmoid_gating_delta_rule_update_npu",
            _DECODE_ARGS,
            f"{_RECURRENT}.py:170-242 ({_MAIN}): BHV = 2, NHV = HV // 2, o [B, T, HV, V]",
        ),
    ),
)


def fused_sigmoid_gating_delta_rule_update(
    obj: Any,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    softplus_beta: float,
    softplus_threshold: float,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    b: torch.Tensor,
    initial_state_source: torch.Tensor,
    initial_state_indices: torch.Tensor,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDN decode on sgl_kernel_npu's recurrent kernel: the decode-optimised one when every
    sequence has one token, else the general one (which takes an even number of value heads:
    two per program). The pool is handed over as is where the kernel's state order is the
    pool's, else the live rows are gathered in the kernel's order and written back."""
    op = "fused_sigmoid_gating_delta_rule_update"
    batch, tokens, _, _ = k.shape
    heads_v, dv = v.shape[-2], v.shape[-1]
    lengths = _lengths(op, cu_seqlens, batch, tokens)
    slots = _slots(op, initial_state_indices, len(lengths), initial_state_source)
    one_token = all(n == 1 for n in lengths)
    kernel = DECODE_ONE_TOKEN if one_token and _resolves(DECODE_ONE_TOKEN) else DECODE
    if kernel is DECODE and heads_v % 2:
        raise Unsupported(
            f"sgl_kernel_npu fused_sigmoid_gating_delta_rule_update_npu runs two value heads per "
            f"program (BHV = 2, NHV = HV // 2: the last of {heads_v} would be skipped; "
            f"{_RECURRENT}.py:207-209)"
            + ("" if one_token else "; its decode-optimised form takes one token per sequence")
        )
    if scale is not None and scale <= 0:
        raise Unsupported(f"sgl_kernel_npu's recurrent kernels assert scale > 0, got {scale}")
    _, fn = kernel.resolve()
    pool = initial_state_source
    if not lengths or tokens == 0:  # no program to launch
        return q.new_zeros((batch, tokens, heads_v, dv)), pool
    order = state_order()
    live = slots >= 0
    direct = order is StateOrder.V_MAJOR and pool.is_contiguous()
    states, local = pool, slots.to(torch.int32)
    if not direct:
        states = _in_order(pool[slots[live]], order)
        local = torch.full_like(slots, -1, dtype=torch.int32)
        local[live] = torch.arange(int(live.sum()), device=pool.device, dtype=torch.int32)
    o = fn(
        A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b, states, local,
        scale=scale, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    if not direct:
        pool[slots[live]] = _from_order(states, order).to(pool.dtype)
    out: torch.Tensor = o.reshape(batch, tokens, heads_v, dv)
    return out, pool


def _resolves(kernel: SdkFunction) -> bool:
    try:
        kernel.resolve()
    except Unsupported:
        return False
    return True


_CHUNK = 64  # the chunked kernels' chunk size (chunk states are taken before each)
FUSED_CHUNK = SdkFunction(
    "chunk_gated_delta_rule",
    (
        CallForm(
            "fused-op",
            "fla.chunk_gated_delta_rule_npu",
            "chunk_gated_delta_rule_npu",
            (
                "query",
                "key",
                "value",
                "beta",
                "initial_state",
                "actual_seq_lengths",
                "scale",
                "g",
                "chunk_state",
            ),
            f"{REPO}/fla/chunk_gated_delta_rule_npu.py:5-48 (e26fe891, sgl-kernel-npu #747): "
            "torch.ops.npu.chunk_gated_delta_rule, what SGLang 0.5.23's ascend_gdn_backend calls",
        ),
    ),
)
TRITON_CHUNK = SdkFunction(
    "chunk_gated_delta_rule",
    (
        CallForm(
            "triton",
            "fla.chunk",
            "chunk_gated_delta_rule_npu",
            (
                "q",
                "k",
                "v",
                "g",
                "beta",
                "scale",
                "initial_state",
                "output_final_state",
                "cu_seqlens",
                "head_first",
                "use_qk_l2norm_in_kernel",
            ),
            f"{REPO}/fla/chunk.py:264-388 ({_MAIN}): returns (o, final_state, h), K-major",
        ),
    ),
)


def chunk_gated_delta_rule(
    obj: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    initial_state_indices: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    inplace_update: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GDN prefill on the installed release's chunked kernel, on the gathered states of the
    sequences that have tokens (as SGLang's NPU path gathers ``ssm_states[cache_indices]``),
    the final states written back into their slots: the fused operator of #747 (V-major,
    bfloat16) where the release has it, else the Triton kernel (K-major)."""
    op = "chunk_gated_delta_rule"
    if initial_state is None:
        raise Unsupported(f"{op}: this adapter serves pooled states (initial_state given)")
    batch, tokens, _, dk = k.shape
    lengths = _lengths(op, cu_seqlens, batch, tokens)
    slots = _slots(op, initial_state_indices, len(lengths), initial_state)
    if bool((slots < 0).any()):
        raise IndexError(f"{op}: state indices {slots.tolist()} include padding (-1)")
    fused = has_module(UNIFIED_LAYOUT)
    why = _fused_chunk_declines(q, initial_state, use_qk_l2norm_in_kernel) if fused else None
    why = why or (None if fused else _triton_chunk_declines(q, k, v, dk))
    if why is not None:
        raise Unsupported(why)
    kernel = FUSED_CHUNK if fused else TRITON_CHUNK
    _, fn = kernel.resolve()
    heads_v, dv = v.shape[-2], v.shape[-1]
    live = [i for i, n in enumerate(lengths) if n > 0]
    if not live:
        o = q.new_zeros((batch, tokens, heads_v, dv))
        return o, k.new_zeros((1, 0, heads_v, dv, dk)), initial_state
    rows = slots[torch.tensor(live, device=slots.device)]
    live_lengths = [lengths[i] for i in live]
    scale = dk**-0.5 if scale is None else scale
    if fused:
        o, final, h = _fused_chunk(fn, q, k, v, g, beta, initial_state[rows], live_lengths, scale)
    else:
        o, final, h = _triton_chunk(
            fn, q, k, v, g, beta, initial_state[rows], live_lengths, scale,
            use_qk_l2norm_in_kernel,
        )  # fmt: skip
    if inplace_update:
        initial_state[rows] = final.to(initial_state.dtype)
    return (
        o.reshape(batch, tokens, heads_v, dv).to(q.dtype),
        h.unsqueeze(0).to(k.dtype),
        initial_state,
    )


def _fused_chunk_declines(
    q: torch.Tensor, pool: torch.Tensor, use_qk_l2norm_in_kernel: bool
) -> str | None:
    source = FUSED_CHUNK.forms[0].source
    if q.dtype != torch.bfloat16:
        return f"sgl_kernel_npu chunk_gated_delta_rule_npu takes bfloat16 q/k/v ({source})"
    state_dtypes = (
        (torch.bfloat16, torch.float32) if platform().soc is AscendSoc.A5 else (torch.bfloat16,)
    )
    if pool.dtype not in state_dtypes:
        return (
            f"sgl_kernel_npu chunk_gated_delta_rule_npu takes a bfloat16 state (float32 on "
            f"Ascend 950), not {pool.dtype} on {platform().describe()} ({source})"
        )
    if not use_qk_l2norm_in_kernel:
        return f"sgl_kernel_npu chunk_gated_delta_rule_npu takes L2-normalised q/k ({source})"
    return None


def _triton_chunk_declines(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dk: int
) -> str | None:
    source = TRITON_CHUNK.forms[0].source
    if not (q.dtype == k.dtype == v.dtype) or q.dtype == torch.float32:
        return (
            f"sgl_kernel_npu chunk_gated_delta_rule_npu asserts one q/k/v dtype, not float32 "
            f"(chunk.py:341-344; {source})"
        )
    if dk > 256:
        return (
            f"sgl_kernel_npu chunk_gated_delta_rule_fwd_h_npu: head dimension <= 256, got {dk} "
            "(chunk_delta_h.py:240)"
        )
    return None


def _fused_chunk(
    fn: Callable[..., Any],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    states: torch.Tensor,
    lengths: list[int],
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The #747 operator on ``(T, N, D)`` rows, q/k L2-normalised here (as SGLang's
    ``chunk_gdn`` does with ``l2norm_fwd``), the chunk states allocated for it."""
    heads_v, dv, dk = v.shape[-2], v.shape[-1], k.shape[-1]
    flat = (q.reshape(-1, *q.shape[-2:]), k.reshape(-1, *k.shape[-2:]))
    query, key = (_l2norm(x).to(torch.bfloat16).contiguous() for x in flat)
    chunks = sum(-(-n // _CHUNK) for n in lengths)
    chunk_state = states.new_empty((chunks, heads_v, dv, dk))
    out, final = fn(
        query,
        key,
        v.reshape(-1, heads_v, dv).contiguous(),
        beta=beta.reshape(-1, heads_v).to(torch.bfloat16).contiguous(),
        initial_state=states.contiguous(),
        actual_seq_lengths=torch.tensor(lengths, dtype=torch.int32, device=q.device),
        scale=scale,
        g=g.reshape(-1, heads_v).float().contiguous(),
        chunk_state=chunk_state,
    )
    return out, final, chunk_state


def _triton_chunk(
    fn: Callable[..., Any],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    states: torch.Tensor,
    lengths: list[int],
    scale: float,
    use_qk_l2norm_in_kernel: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Triton kernel on one varlen row (``cu_seqlens`` of the live sequences), its
    K-major states transposed in and out."""
    width = (1, -1)
    bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=q.device)
    o, final, h = fn(
        q.reshape(*width, *q.shape[-2:]),
        k.reshape(*width, *k.shape[-2:]),
        v.reshape(*width, *v.shape[-2:]),
        g.reshape(*width, g.shape[-1]),
        beta.reshape(*width, beta.shape[-1]),
        scale=scale,
        initial_state=_in_order(states, StateOrder.K_MAJOR),
        output_final_state=True,
        cu_seqlens=bounds,
        head_first=False,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
    )
    order = StateOrder.K_MAJOR
    return o, _from_order(final, order), _from_order(h[0], order)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + 1e-6)`` in float32, as sgl_kernel_npu's ``l2norm_fwd``."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


ADAPTERS: Mapping[str, Callable[..., Any]] = {
    "fused_gdn_gating": fused_gdn_gating,
    "fused_qkvzba_split_reshape_cat": fused_qkvzba_split_reshape_cat,
    "fused_qkvzba_split_reshape_cat_contiguous": fused_qkvzba_split_reshape_cat_contiguous,
    "rms_norm_gated": rms_norm_gated,
    "causal_conv1d_update": causal_conv1d_update,
    "causal_conv1d_fn": causal_conv1d_fn,
    "fused_sigmoid_gating_delta_rule_update": fused_sigmoid_gating_delta_rule_update,
    "chunk_gated_delta_rule": chunk_gated_delta_rule,
}
