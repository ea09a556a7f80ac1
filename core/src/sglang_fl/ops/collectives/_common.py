"""Shared pieces of the collective contracts: cases, tolerances, the default case runner."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from ..contract import CaseRunner, OpCase, OpInputs, Tolerance, layer

# Collectives move floating-point activations (hidden states, logits, MoE tokens).
DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
# Moving data is exact: gathers, broadcasts, point-to-point and all-to-all change no bit.
EXACT: Mapping[torch.dtype, Tolerance] = {d: Tolerance(atol=0.0, rtol=0.0) for d in DTYPES}
# A sum over ranks may be taken in any order (ring, tree, in fp32 or the input dtype), so each
# rank's result may differ from the in-order sum by a few roundings of the input dtype: the
# bounds cover 4 ranks of unit-normal inputs summed in the input dtype.
REDUCED: Mapping[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(atol=1e-5, rtol=1e-5),
    torch.float16: Tolerance(atol=4e-3, rtol=4e-3),
    torch.bfloat16: Tolerance(atol=3.2e-2, rtol=3.2e-2),
}
# quant_all_reduce may sum per-token int8 quantisations of the inputs (torch_npu's
# npu_dynamic_quant: symmetric, scale = row max |x| / 127, so each rank's element is off by at
# most half a step, max|x| / 254): for 4 ranks of unit-normal rows (max |x| < 4.5 at 96
# elements) that is under 0.071, plus the input dtype's rounding of the sum.
QUANTIZED: Mapping[torch.dtype, Tolerance] = {d: Tolerance(atol=0.08, rtol=0.04) for d in DTYPES}
WORLD_SIZES: tuple[int, ...] = (2, 4)
# Rows per rank: an idle rank (0), a decode step (1) and an odd prefill (7).
ROWS: tuple[int, ...] = (0, 1, 7)

# torch 2.14 renamed the tensor collectives; SGLang's distributed/utils.py picks the same way.
all_gather_single: Callable[..., Any] = getattr(
    dist, "all_gather_single", dist.all_gather_into_tensor
)
reduce_scatter_single: Callable[..., Any] = getattr(
    dist, "reduce_scatter_single", dist.reduce_scatter_tensor
)


def case_seed(case: OpCase, rank: int) -> int:
    """A seed per case and rank, the same in every process (``hash`` is salted per process)."""
    return zlib.crc32(f"{case.name}/rank={rank}".encode())


def seeded(case: OpCase, rank: int) -> torch.Generator:
    return torch.Generator().manual_seed(case_seed(case, rank))


def group_stand_in(rank: int, world_size: int) -> Any:
    """``obj`` of single-process inputs: the group's shape only (the kit passes a real group)."""
    return layer(rank_in_group=rank, world_size=world_size)


def normal(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, g: torch.Generator
) -> torch.Tensor:
    return torch.randn(shape, generator=g, dtype=torch.float32).to(device, dtype)


def call_own_op(name: str) -> CaseRunner:
    """The case runner of an op that is called alike on every rank."""

    def run(
        fns: Mapping[str, Callable[..., Any]], group: Any, case: OpCase, inputs: OpInputs
    ) -> Any:
        return fns[name](group, *inputs.args, **inputs.kwargs)

    run.__qualname__ = f"run_{name}"
    return run


def rank_name(p: Mapping[str, Any]) -> str:
    return f"rows={p['rows']},hidden={p['hidden']}"


def inputs_of(rank_inputs: Any) -> Any:
    """``make_inputs`` of a collective: rank 0's inputs in the smallest world."""

    def make_inputs(
        case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
    ) -> OpInputs:
        inputs: OpInputs = rank_inputs(case, dtype, device, 0, WORLD_SIZES[0])
        return inputs

    return make_inputs


def call_into(name: str) -> Any:
    """The case runner of an op that writes its first argument: the output is that argument."""

    def run(fns: Mapping[str, Any], group: Any, case: OpCase, inputs: OpInputs) -> Any:
        fns[name](group, *inputs.args, **inputs.kwargs)
        return inputs.args[0]

    run.__qualname__ = f"run_{name}"
    return run
