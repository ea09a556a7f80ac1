"""``causal_conv1d_fn`` and ``causal_conv1d_update`` on sgl_kernel's compiled causal convs.

sglang-kernel 0.4.10 exports ``causal_conv1d_fwd`` and ``causal_conv1d_update``
(``sgl_kernel/mamba.py``; ``sgl-kernel/csrc/mamba/causal_conv1d.cu``, Tri Dao's causal-conv1d
kernels), which SGLang's CUDA GDN path ran until 0.5.23 compiled the same source just in time
instead (``sglang/kernels/jit/csrc/mamba/causal_conv1d.cuh``: "In-place, like the AOT ops they
replace"). The adapters call them as SGLang's CUDA wrapper does
(``srt/layers/attention/mamba/causal_conv1d.py``): ``x`` with a unit last stride, int32 indices,
SiLU as a flag.

Both kernels write their output over ``x`` (``out = x``); the contracts leave ``x`` unchanged and
return a new tensor, so each adapter hands the kernel a contiguous copy of ``x`` and returns it.
A row whose state index is the padding value is skipped by the kernels (the copy still holds
``x`` there): the contract's zeros are written into it on the device, no host read. What the
kernels cannot serve is declined before anything is written: other dtypes or widths than theirs,
a conv state wider than ``width - 1`` (the prefill kernel writes positions ``0..width - 2``,
the decode kernel reads the last ``width - 1``), a prefill pool whose last dim is strided (the
prefill kernel ignores that stride), a prefill sequence of no token (its final-state store reads
before its buffer), an index outside the pool (:func:`~sglang_fl.ops.linear_attention.
check_state_indices`: one device reduction).

Inside SGLang (``integrations/sglang/linear_attention.py``) the routed functions are the Triton
ones: on CUDA SGLang 0.5.23 runs its JIT prefill conv directly (not routed) and calls the Triton
``causal_conv1d_fn`` only for a strided ``x``; its decode conv is the Triton
``causal_conv1d_update``. With these adapters those two calls reach sgl_kernel's compiled kernels.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

import torch

from sglang_fl.ops.linear_attention import PAD_SLOT_ID, check_state_indices
from sglang_fl.types import Unsupported

from ..backend import SGL_KERNEL_MAMBA

__all__ = ["ADAPTERS", "causal_conv1d_fn", "causal_conv1d_update"]

KERNEL_SOURCE = "sgl-kernel csrc/mamba/causal_conv1d.cu (sglang-kernel 0.4.10)"
JIT_PORT = "SGLang 0.5.23 kernels/jit/csrc/mamba/causal_conv1d.cuh"
DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})
WIDTHS = range(2, 5)  # causal_conv1d_fwd_cuda / _update_cuda launch widths 2, 3 and 4 only
_SILU = {None: False, False: False, True: True, "silu": True, "swish": True}
_PAST_THE_POOL = "sgl_kernel's conv kernels do not check the bound and would write past the pool"


def _silu(op: str, activation: str | bool | None) -> bool:
    """The kernels' ``silu_activation`` flag; SGLang's wrapper allows None, silu and swish."""
    try:
        return _SILU[activation]
    except (KeyError, TypeError):
        raise Unsupported(
            f"{op}: activation {activation!r}: the kernel applies SiLU or nothing "
            "(srt/layers/attention/mamba/causal_conv1d.py: 'activation must be None, silu, or "
            "swish')"
        ) from None


def _check_operands(
    op: str,
    x: torch.Tensor,
    dim: int,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    states: torch.Tensor,
) -> None:
    """What both kernels require of their dtypes, shapes and widths (``dim``: x's channels)."""
    if x.dtype not in DTYPES:
        raise Unsupported(f"{op}: the kernel takes float32/float16/bfloat16, not {x.dtype}")
    others = {
        "weight": weight,
        "conv state": states,
        **({"bias": bias} if bias is not None else {}),
    }
    for name, tensor in others.items():
        if tensor.dtype != x.dtype:
            raise Unsupported(
                f"{op}: the {name} is {tensor.dtype}, x {x.dtype}: the kernel reads every "
                f"operand as x's type ({KERNEL_SOURCE}: DISPATCH_WTYPE_ITYPE on x's type, "
                "'weight type must equal to input type')"
            )
    width = weight.shape[-1]
    shapes = (weight.shape, states.shape[1], None if bias is None else bias.shape)
    if shapes != ((dim, width), dim, None if bias is None else (dim,)):
        raise Unsupported(
            f"{op}: weight [dim, width], conv state [slots, dim, width - 1] and bias [dim] for "
            f"dim = {dim}; got {list(weight.shape)}, {list(states.shape)}, "
            f"{None if bias is None else list(bias.shape)} ({KERNEL_SOURCE}: CHECK_SHAPE)"
        )
    if width not in WIDTHS:
        raise Unsupported(
            f"{op}: width {width}: the kernel is built for widths 2 to 4 ({KERNEL_SOURCE}; "
            f"{JIT_PORT}: 'causal_conv1d only supports width between 2 and 4')"
        )
    if states.shape[-1] != width - 1:
        raise Unsupported(
            f"{op}: a conv state of {states.shape[-1]} positions; the contract's is width - 1 "
            f"= {width - 1}"
        )


def _require_slots(
    op: str, indices: torch.Tensor | None, batch: int, slots: int, pad_slot_id: int
) -> None:
    """One state index per row, each a slot of the pool or padding (row ``i`` without any):
    the kernels follow them unchecked."""
    if indices is None:
        check_state_indices(op, torch.arange(batch), slots, pad_slot_id=None, error=Unsupported)
        return
    if indices.numel() != batch:
        raise Unsupported(f"{op}: {indices.numel()} state indices for {batch} rows")
    check_state_indices(
        op, indices, slots, pad_slot_id=pad_slot_id, error=Unsupported, why=_PAST_THE_POOL
    )


def _kernels() -> ModuleType:
    """``sgl_kernel.mamba``, or ``Unsupported`` where this wheel has no compiled convs (the
    probe keeps the adapters unbound there; the hardware script runs them anyway)."""
    try:
        return SGL_KERNEL_MAMBA.require()
    except ImportError as exc:
        raise Unsupported(f"sgl_kernel has no compiled causal convs here: {exc}") from exc


def _output(x: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``x`` for the kernel to overwrite (``x`` itself stays unchanged)."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    return out.copy_(x)


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
    """Prefill on ``sgl_kernel.causal_conv1d_fwd`` (varlen ``x`` ``[dim, T]``)."""
    op = "causal_conv1d_fn"
    silu = _silu(op, activation)
    _check_operands(op, x, x.shape[0], weight, bias, conv_states)
    if conv_states.stride(-1) != 1:
        raise Unsupported(
            f"{op}: the conv state pool's last dim must be contiguous: the prefill kernel reads "
            f"and writes conv_states[w], not its stride ({JIT_PORT}:220, 316-370)"
        )
    lengths = [int(n) for n in seq_lens_cpu]
    if 0 in lengths:
        raise Unsupported(
            f"{op}: a sequence of no token (lengths {lengths}): the kernel's final-state store "
            f"reads before its buffer for it ({JIT_PORT}:334-372, last_thread of seqlen 0)"
        )
    batch = len(lengths)
    if has_initial_state is not None and has_initial_state.numel() != batch:
        raise Unsupported(f"{op}: {has_initial_state.numel()} has_initial_state for {batch} rows")
    _require_slots(op, cache_indices, batch, conv_states.shape[0], pad_slot_id)
    if batch == 0:  # a grid of 0 blocks is an invalid launch
        return _output(x), conv_states
    mamba = _kernels()
    out = _output(x)
    indices = None if cache_indices is None else cache_indices.to(torch.int32).contiguous()
    initial = None if has_initial_state is None else has_initial_state.to(torch.bool).contiguous()
    mamba.causal_conv1d_fwd(
        out,
        weight,
        None if bias is None else bias.contiguous(),
        conv_states,
        query_start_loc.to(torch.int32).contiguous(),
        indices,
        initial,
        silu,
        pad_slot_id,
    )
    if indices is not None:  # padded sequences: the kernel left x there; the contract's zeros
        repeats = torch.tensor(lengths, device=out.device)
        padded = torch.repeat_interleave(indices == pad_slot_id, repeats, output_size=out.shape[1])
        out.masked_fill_(padded, 0)
    return out, conv_states


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
    """Decode on ``sgl_kernel.causal_conv1d_update`` (``x`` ``[B, dim]`` or ``[B, dim, L]``)."""
    op = "causal_conv1d_update"
    silu = _silu(op, activation)
    _check_operands(op, x, x.shape[1], weight, bias, conv_state)
    batch = x.shape[0]
    _require_slots(op, conv_state_indices, batch, conv_state.shape[0], pad_slot_id)
    mamba = _kernels() if batch > 0 else None  # a grid of 0 blocks is an invalid launch
    out = _output(x.unsqueeze(-1) if x.dim() == 2 else x)
    if mamba is not None:
        # Without indices the kernel needs a pool of exactly `batch` rows; the contract's
        # larger pool is addressed through the identity indices instead.
        indices = (
            torch.arange(batch, dtype=torch.int32, device=x.device)
            if conv_state_indices is None
            else conv_state_indices.to(torch.int32).contiguous()
        )
        mamba.causal_conv1d_update(
            out,
            conv_state,
            weight,
            None if bias is None else bias.contiguous(),
            silu,
            None,
            indices,
            pad_slot_id,
        )
        if conv_state_indices is not None:  # padded rows: the kernel left x there; zeros
            out.masked_fill_((indices == pad_slot_id)[:, None, None], 0)
    return (out.squeeze(-1) if x.dim() == 2 else out), conv_state


ADAPTERS: Mapping[str, Callable[..., Any]] = {
    "causal_conv1d_fn": causal_conv1d_fn,
    "causal_conv1d_update": causal_conv1d_update,
}
