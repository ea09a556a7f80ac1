"""A TEST DOUBLE of ``sgl_kernel.mamba`` (sglang-kernel 0.4.10): its compiled causal convs.

Not the real SDK. It stands in for ``sgl_kernel.mamba`` in ``sys.modules`` with the two kernels
the causal-conv adapters call, as ``sgl_kernel/mamba.py`` exposes them (op schemas in
``sgl_kernel/sm90/common_ops.abi3.so``: ``causal_conv1d_fwd(Tensor! x, Tensor! weight, Tensor?
bias_, Tensor!? conv_states, Tensor? query_start_loc, Tensor? cache_indices, Tensor?
has_initial_state, bool silu_activation, int pad_slot_id) -> ()`` and ``causal_conv1d_update(
Tensor! x, Tensor! conv_state, Tensor! weight, Tensor? bias_, bool silu_activation, Tensor?
cache_seqlens_, Tensor? conv_state_indices, int pad_slot_id) -> ()``). Both write the output
over ``x``; a padding index skips its row (``x`` keeps its values there). The math is the
kernels' (fp32 accumulation, bias, ``x / (1 + exp(-x))``), in PyTorch on the CPU.

Its constraints are the host checks and the addressing of ``sgl-kernel/csrc/mamba/
causal_conv1d.cu`` (read at sgl-project/sglang 120affb; the same functions as the 0.4.10
binary), and where that file only assumes a rule, the line of the JIT port SGLang 0.5.23 runs
instead (``kernels/jit/csrc/mamba/causal_conv1d.cuh``), which checks it. Each is a
:class:`~sglang_fl.testing.doubles.Constraint`. Not modeled (``NotImplementedError``): the
non-varlen prefill layout, the decode's circular buffer (``cache_seqlens``).
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F
from sgl_kernel_double import EMPTY_GRID

from sglang_fl.testing.doubles import Constraint, SdkDouble

CU = "sgl-kernel csrc/mamba/causal_conv1d.cu"
JIT = "SGLang 0.5.23 kernels/jit/csrc/mamba/causal_conv1d.cuh"
FWD = "causal_conv1d_fwd"
UPDATE = "causal_conv1d_update"
BOTH = f"{FWD}/{UPDATE}"
FLOATS = (torch.float32, torch.float16, torch.bfloat16)


class SglKernelMambaDouble(SdkDouble):
    """``sgl_kernel.mamba`` stand-in: ``causal_conv1d_fwd`` and ``causal_conv1d_update``."""

    DTYPES = Constraint(
        BOTH,
        "float32/float16/bfloat16 x, with weight, bias and the conv state(s) in x's dtype",
        f"{CU}: TORCH_CHECK(input_type == Float || Half || BFloat16), DISPATCH_WTYPE_ITYPE_FLOAT_"
        "AND_HALF_AND_BF16(x.scalar_type()) (weight read as x's type), 'weight type must equal to "
        "input type', TORCH_CHECK(conv_state(s).scalar_type() == input_type), TORCH_CHECK(bias."
        f"scalar_type() == weight_type); {JIT}:576-596, 640, 687-717",
        "raises, or reads the weight's bytes as x's type",
    )
    WIDTH = Constraint(
        BOTH,
        "a width (weight.shape[-1]) of 2, 3 or 4",
        f"{CU}: causal_conv1d_fwd_cuda launches widths 2, 3 and 4 only (another leaves x "
        "unwritten); causal_conv1d_update: 'causal_conv1d only supports width between 2 and 4'; "
        f"{JIT}:593, 712",
        "writes nothing (prefill) or raises (decode)",
    )
    BIAS = Constraint(
        BOTH,
        "bias [dim] with a unit stride",
        f"{CU}: TORCH_CHECK(bias.stride(-1) == 1), CHECK_SHAPE(bias, dim); {JIT}:596, 717",
    )
    FWD_X = Constraint(
        FWD,
        "varlen x [dim, total tokens] with a unit last stride, weight [dim, width]",
        f"{CU}: CHECK_SHAPE(x, dim, seqlen), CHECK_SHAPE(weight, dim, width), and the kernel loads "
        f"each channel's tokens as consecutive elements (BlockLoad from x); {JIT}:573-586 "
        "(with_strides({-1, 1}): 'the Python wrapper makes x unit-stride')",
        "raises, or reads other channels' values as tokens",
    )
    FWD_INDEX_OPERANDS = Constraint(
        FWD,
        "int32 query_start_loc [batch + 1] and cache_indices [batch], bool has_initial_state "
        "[batch], all contiguous",
        f"{CU}: TORCH_CHECK(query_start_loc_.scalar_type() == Int), TORCH_CHECK(cache_indices_."
        "scalar_type() == Int), CHECK_SHAPE(cache_indices_, batch_size), TORCH_CHECK("
        "has_initial_state_.scalar_type() == Bool), CHECK_SHAPE(has_initial_state_, batch_size); "
        f"the kernel indexes their raw pointers; {JIT}:577, 598-610",
    )
    FWD_STATES = Constraint(
        FWD,
        "conv_states [slots, dim, width - 1 or more] with a unit last stride",
        f"{CU}: causal_conv1d_fwd_kernel reads and writes conv_states[w], never "
        f"conv_states_l_stride; {JIT}:220, 316-370",
        "reads and writes the wrong positions of the state",
    )
    FWD_BATCH = Constraint(
        FWD, "at least one sequence", f"{CU}: dim3 grid(params.batch, params.dim); {JIT}:592",
        EMPTY_GRID,
    )  # fmt: skip
    FWD_TOKENS = Constraint(
        FWD,
        "every sequence of at least one token (when conv_states are given)",
        f"{CU}: causal_conv1d_fwd_kernel, the final-state store: for seqlen 0 the thread "
        "last_thread = (0 - (width - 1) + chunk size) / elements is not 0, so the store reads "
        f"x_vals_load[offset + w] at a negative offset; {JIT}:334-372",
        "writes undefined values into the sequence's conv state",
    )
    UPDATE_SHAPES = Constraint(
        UPDATE,
        "x [batch, dim, seqlen] (3-D), weight [dim, width], conv_state [entries, dim, state_len] "
        "with state_len >= width - 1 and, without conv_state_indices, entries == batch",
        f"{CU}: CHECK_SHAPE(x, batch_size, dim, seqlen), CHECK_SHAPE(weight, dim, width), "
        "TORCH_CHECK(conv_state_len >= width - 1), CHECK_SHAPE(conv_state, batch_size, dim, "
        f"conv_state_len) / (conv_state_entries, dim, conv_state_len); {JIT}:687-713",
    )
    UPDATE_INDICES = Constraint(
        UPDATE,
        "int32 conv_state_indices [batch] with a unit stride",
        f"{CU}: TORCH_CHECK(conv_state_indices.scalar_type() == torch::kInt32), TORCH_CHECK("
        f"conv_state_indices.stride(0) == 1), CHECK_SHAPE(conv_state_indices, batch_size); "
        f"{JIT}:695-700",
    )
    UPDATE_BATCH = Constraint(
        UPDATE, "at least one row", f"{CU}: dim3 grid(params.batch, ceil(dim / 64))", EMPTY_GRID
    )
    SLOTS = Constraint(
        BOTH,
        "every state index inside the pool, or pad_slot_id; live rows on distinct slots",
        f"{CU}: the kernels address conv_states + cache_index * batch_stride after only "
        f"comparing the index with pad_slot_id, one CUDA block per row and channel running "
        f"concurrently; {JIT}:204-211, 432-438",
        "reads and writes outside the pool, or two rows race on one slot",
    )

    def __init__(self) -> None:
        super().__init__("sgl_kernel.mamba")

    def causal_conv1d_fwd(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias_: torch.Tensor | None,
        conv_states: torch.Tensor | None,
        query_start_loc: torch.Tensor | None,
        cache_indices: torch.Tensor | None,
        has_initial_state: torch.Tensor | None,
        silu_activation: bool,
        pad_slot_id: int,
    ) -> None:
        self.record(
            FWD, x, weight, bias_, conv_states, query_start_loc, cache_indices, has_initial_state,
            silu_activation, pad_slot_id,
        )  # fmt: skip
        if query_start_loc is None or conv_states is None:
            raise NotImplementedError("the test double models the varlen call with conv states")
        self._common(x, weight, bias_, conv_states)
        dim, width = x.shape[0], weight.shape[-1]
        self.FWD_X.check(
            x.dim() == 2 and x.stride(-1) == 1 and tuple(weight.shape) == (dim, width),
            f"x {tuple(x.shape)} strides {x.stride()}, weight {tuple(weight.shape)}",
        )
        batch = query_start_loc.numel() - 1
        self.FWD_INDEX_OPERANDS.check(
            query_start_loc.dtype == torch.int32
            and query_start_loc.is_contiguous()
            and _index_tensor(cache_indices, torch.int32, batch)
            and _index_tensor(has_initial_state, torch.bool, batch),
            f"query_start_loc {query_start_loc.dtype}, cache_indices "
            f"{_describe(cache_indices)}, has_initial_state {_describe(has_initial_state)}",
        )
        self.FWD_STATES.check(
            conv_states.dim() == 3
            and conv_states.shape[1] == dim
            and conv_states.shape[2] >= width - 1
            and conv_states.stride(-1) == 1,
            f"conv_states {tuple(conv_states.shape)} strides {conv_states.stride()}",
        )
        self.FWD_BATCH.check(batch > 0, f"batch {batch}")
        bounds = query_start_loc.tolist()
        lengths = [end - start for start, end in itertools.pairwise(bounds)]
        slots = list(range(batch)) if cache_indices is None else cache_indices.tolist()
        self.FWD_TOKENS.check(
            all(n > 0 for n, s in zip(lengths, slots, strict=True) if s != pad_slot_id),
            f"sequence lengths {lengths}",
        )
        self._slots(slots, pad_slot_id, conv_states.shape[0])
        initial = [False] * batch if has_initial_state is None else has_initial_state.tolist()
        for b, slot in enumerate(slots):
            if slot == pad_slot_id:
                continue
            start, end = bounds[b], bounds[b + 1]
            state = conv_states[slot, :, : width - 1]
            prev = state.float() if initial[b] else torch.zeros(dim, width - 1)
            window = torch.cat((prev, x[:, start:end].float()), dim=-1)
            x[:, start:end] = _conv(window, weight, bias_, silu_activation).to(x.dtype)
            state.copy_(window[:, -(width - 1) :])

    def causal_conv1d_update(
        self,
        x: torch.Tensor,
        conv_state: torch.Tensor,
        weight: torch.Tensor,
        bias_: torch.Tensor | None,
        silu_activation: bool,
        cache_seqlens: torch.Tensor | None,
        conv_state_indices: torch.Tensor | None,
        pad_slot_id: int,
    ) -> None:
        self.record(
            UPDATE, x, conv_state, weight, bias_, silu_activation, cache_seqlens,
            conv_state_indices, pad_slot_id,
        )  # fmt: skip
        if cache_seqlens is not None:
            raise NotImplementedError("the test double does not model the circular conv state")
        self._common(x, weight, bias_, conv_state)
        width = weight.shape[-1]
        self.UPDATE_SHAPES.check(
            x.dim() == 3
            and tuple(weight.shape) == (x.shape[1], width)
            and conv_state.dim() == 3
            and conv_state.shape[1] == x.shape[1]
            and conv_state.shape[2] >= width - 1
            and (conv_state_indices is not None or conv_state.shape[0] == x.shape[0]),
            f"x {tuple(x.shape)}, weight {tuple(weight.shape)}, conv_state "
            f"{tuple(conv_state.shape)}, indices {_describe(conv_state_indices)}",
        )
        batch = x.shape[0]
        self.UPDATE_INDICES.check(
            conv_state_indices is None
            or (
                conv_state_indices.dtype == torch.int32
                and conv_state_indices.dim() == 1
                and conv_state_indices.stride(0) == 1
                and conv_state_indices.shape[0] == batch
            ),
            _describe(conv_state_indices),
        )
        self.UPDATE_BATCH.check(batch > 0, f"batch {batch}")
        slots = list(range(batch)) if conv_state_indices is None else conv_state_indices.tolist()
        self._slots(slots, pad_slot_id, conv_state.shape[0])
        state_len = conv_state.shape[2]
        for b, slot in enumerate(slots):
            if slot == pad_slot_id:
                continue
            window = torch.cat((conv_state[slot].float(), x[b].float()), dim=-1)
            taps = window[:, state_len - (width - 1) :]
            x[b] = _conv(taps, weight, bias_, silu_activation).to(x.dtype)
            conv_state[slot] = window[:, -state_len:].to(conv_state.dtype)

    def _common(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, state: torch.Tensor
    ) -> None:
        """The rules both kernels share: dtypes, width, bias."""
        self.DTYPES.check(
            x.dtype in FLOATS
            and weight.dtype == x.dtype
            and state.dtype == x.dtype
            and (bias is None or bias.dtype == weight.dtype),
            f"x {x.dtype}, weight {weight.dtype}, state {state.dtype}, bias {_describe(bias)}",
        )
        self.WIDTH.check(2 <= weight.shape[-1] <= 4, f"width {weight.shape[-1]}")
        dim = x.shape[0] if x.dim() == 2 else x.shape[1]
        self.BIAS.check(
            bias is None or (tuple(bias.shape) == (dim,) and bias.stride(-1) == 1),
            _describe(bias),
        )

    def _slots(self, slots: list[Any], pad_slot_id: int, pool: int) -> None:
        live = [s for s in slots if s != pad_slot_id]
        self.SLOTS.check(
            all(0 <= s < pool for s in live) and len(set(live)) == len(live),
            f"{slots}, pool of {pool}",
        )


def _conv(
    window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool
) -> torch.Tensor:
    """``window`` ``[dim, width - 1 + L]`` float32 -> ``[dim, L]``: the kernels' per-channel
    sum of ``width`` taps in float32, plus bias, then ``x / (1 + exp(-x))``."""
    out = F.conv1d(window.unsqueeze(0), weight.float().unsqueeze(1), groups=window.shape[0])[0]
    if bias is not None:
        out = out + bias.float()[:, None]
    return out / (1 + torch.exp(-out)) if silu else out


def _index_tensor(tensor: torch.Tensor | None, dtype: torch.dtype, batch: int) -> bool:
    return tensor is None or (
        tensor.dtype == dtype and tuple(tensor.shape) == (batch,) and tensor.is_contiguous()
    )


def _describe(tensor: torch.Tensor | None) -> str:
    if tensor is None:
        return "None"
    return f"{tensor.dtype} {tuple(tensor.shape)} strides {tensor.stride()}"
