"""``all_to_all_single``: every rank sends an equal slice of rows to every rank."""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
import torch.distributed as dist

from ..contract import Collective, OpCase, OpContract, OpInputs, axis, case_grid
from . import _common as c
from .group import CollectiveGroup


def _signature(group: CollectiveGroup, output: torch.Tensor, input: torch.Tensor) -> None:
    """``input`` ``[world_size * rows, ...]``: slice ``j`` goes to rank ``j``; ``output`` (same
    shape) gets, at slice ``i``, rank ``i``'s slice for this rank
    (``GroupCoordinator.all_to_all_single``: expert-parallel token exchange, DCP attention).
    Both contiguous; ``input`` is unchanged; returns nothing."""
    raise NotImplementedError


def reference(group: CollectiveGroup, output: torch.Tensor, input: torch.Tensor) -> None:
    """SGLang's path without pynccl: ``torch.distributed.all_to_all_single``."""
    dist.all_to_all_single(output, input, group=group.device_group)


def _inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, rank: int, world_size: int
) -> OpInputs:
    p = case.params
    shape = (p["rows"] * world_size, p["hidden"])
    x = c.normal(shape, dtype, device, c.seeded(case, rank))
    output = torch.full(shape, float("nan"), dtype=dtype, device=device)
    return OpInputs(obj=c.group_stand_in(rank, world_size), args=(output, x), preserved=("input",))


def _expected(case: OpCase, ranks: Sequence[OpInputs], rank: int) -> torch.Tensor:
    rows = case.params["rows"]
    return torch.cat([inputs.args[1][rank * rows : (rank + 1) * rows] for inputs in ranks])


ALL_TO_ALL_SINGLE = OpContract(
    name="all_to_all_single",
    sglang_layer="GroupCoordinator.all_to_all_single",
    summary="equal slices of rows exchanged between every pair of ranks",
    signature=inspect.signature(_signature),
    details=inspect.getdoc(_signature) or "",
    reference=reference,
    dtypes=c.DTYPES,
    tolerances=c.EXACT,
    cases=case_grid(c.rank_name, axis("rows", c.ROWS), axis("hidden", (16,))),
    make_inputs=c.inputs_of(_inputs),
    collective=Collective(c.WORLD_SIZES, _inputs, _expected, c.call_into("all_to_all_single")),
)
