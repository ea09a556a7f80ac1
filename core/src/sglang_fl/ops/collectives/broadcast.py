"""``broadcast``: one rank's tensor, in place, on every rank."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..contract import Collective, OpCase, OpContract, OpInputs, axis, case_grid
from . import _common as c
from .arguments import check_rank
from .group import CollectiveGroup


def _signature(group: CollectiveGroup, input_: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Every rank's ``input_`` (same shape and dtype everywhere) gets rank ``src``'s values,
    in place; returns ``input_``. ``src`` is a rank in the group (``GroupCoordinator.broadcast``:
    pipeline and speculative-decoding state)."""
    raise NotImplementedError


def reference(group: CollectiveGroup, input_: torch.Tensor, src: int = 0) -> torch.Tensor:
    """SGLang's path without pynccl: ``torch.distributed.broadcast`` from the global rank."""
    check_rank("broadcast", "src", src, group)
    dist.broadcast(input_, src=group.ranks[src], group=group.device_group)
    return input_


def _inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, rank: int, world_size: int
) -> OpInputs:
    p = case.params
    x = c.normal((p["rows"], p["hidden"]), dtype, device, c.seeded(case, rank))
    src = 0 if p["src"] == "first" else world_size - 1
    return OpInputs(obj=c.group_stand_in(rank, world_size), args=(x,), kwargs={"src": src})


def _expected(case: OpCase, ranks: Sequence[OpInputs], rank: int) -> torch.Tensor:
    src: int = ranks[0].kwargs["src"]
    sent: torch.Tensor = ranks[src].args[0]
    return sent


def _run(fns: Mapping[str, Any], group: Any, case: OpCase, inputs: OpInputs) -> Any:
    result = fns["broadcast"](group, *inputs.args, **inputs.kwargs)
    if result is not inputs.args[0]:
        raise AssertionError("broadcast must work in place and return input_")
    return result


def _name(p: Mapping[str, Any]) -> str:
    return f"{c.rank_name(p)},src={p['src']}"


BROADCAST = OpContract(
    name="broadcast",
    sglang_layer="GroupCoordinator.broadcast",
    summary="rank src's tensor copied in place into every rank's tensor",
    signature=inspect.signature(_signature),
    reference=reference,
    dtypes=c.DTYPES,
    tolerances=c.EXACT,
    cases=case_grid(
        _name, axis("rows", c.ROWS), axis("hidden", (16,)), axis("src", ("first", "last"))
    ),
    make_inputs=c.inputs_of(_inputs),
    collective=Collective(c.WORLD_SIZES, _inputs, _expected, _run),
)
