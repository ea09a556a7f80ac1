"""Point to point: ``send`` and ``recv`` (pipeline parallelism's activations between stages).

Checked as a pair: a case runs one vendor's ``send`` on the sending ranks and the same
vendor's ``recv`` on the receiving ones, since a library's send only meets its own receive.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..contract import Collective, OpCase, OpContract, OpInputs, axis, case_grid
from . import _common as c
from .group import CollectiveGroup


def _send_signature(group: CollectiveGroup, tensor: torch.Tensor, dst: int | None = None) -> None:
    """Send ``tensor`` (contiguous) to rank ``dst`` of the group (``None``: the next rank,
    ``(rank + 1) % world_size``); returns when ``tensor`` may be reused. The receiver calls
    ``recv`` with the same shape and dtype (``GroupCoordinator.send``)."""
    raise NotImplementedError


def _recv_signature(
    group: CollectiveGroup, size: torch.Size, dtype: torch.dtype, src: int | None = None
) -> torch.Tensor:
    """Receive a tensor of ``size`` and ``dtype`` from rank ``src`` of the group (``None``: the
    previous rank), allocated on the group's device (``GroupCoordinator.recv``)."""
    raise NotImplementedError


def send_reference(group: CollectiveGroup, tensor: torch.Tensor, dst: int | None = None) -> None:
    """SGLang's path without pynccl: ``torch.distributed.send`` to the global rank."""
    if dst is None:
        dst = (group.rank_in_group + 1) % group.world_size
    dist.send(tensor, group.ranks[dst], group.device_group)


def recv_reference(
    group: CollectiveGroup, size: torch.Size, dtype: torch.dtype, src: int | None = None
) -> torch.Tensor:
    """SGLang's path without pynccl: ``torch.distributed.recv`` into a new tensor."""
    if src is None:
        src = (group.rank_in_group - 1) % group.world_size
    tensor = torch.empty(size, dtype=dtype, device=group.device)
    dist.recv(tensor, group.ranks[src], group.device_group)
    return tensor


def _inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, rank: int, world_size: int
) -> OpInputs:
    p = case.params
    x = c.normal((p["rows"], p["hidden"]), dtype, device, c.seeded(case, rank))
    return OpInputs(obj=c.group_stand_in(rank, world_size), args=(x,), preserved=("tensor",))


def _expected(case: OpCase, ranks: Sequence[OpInputs], rank: int) -> torch.Tensor | None:
    n = len(ranks)
    sent: list[torch.Tensor] = [inputs.args[0] for inputs in ranks]
    if case.params["pattern"] == "ring":
        return sent[(rank - 1) % n]
    return sent[0] if rank == n - 1 else None


def _run(fns: Mapping[str, Any], group: Any, case: OpCase, inputs: OpInputs) -> Any:
    """``first-to-last``: rank 0 sends to the last rank (explicit ``dst``/``src``). ``ring``:
    every rank sends to the next and receives from the previous (default peers), even ranks
    sending first so that blocking sends cannot deadlock."""
    (tensor,) = inputs.args
    rank, n = group.rank_in_group, group.world_size
    if case.params["pattern"] == "first-to-last":
        if rank == 0:
            fns["send"](group, tensor, n - 1)
        elif rank == n - 1:
            return fns["recv"](group, tensor.shape, tensor.dtype, 0)
        return None
    if rank % 2 == 0:
        fns["send"](group, tensor)
        return fns["recv"](group, tensor.shape, tensor.dtype)
    received = fns["recv"](group, tensor.shape, tensor.dtype)
    fns["send"](group, tensor)
    return received


def _name(p: Mapping[str, Any]) -> str:
    return f"{c.rank_name(p)},{p['pattern']}"


_CASES = case_grid(
    _name, axis("rows", c.ROWS), axis("hidden", (16,)), axis("pattern", ("ring", "first-to-last"))
)

SEND = OpContract(
    name="send",
    sglang_layer="GroupCoordinator.send",
    summary="a tensor to one rank of the group (paired with that rank's recv)",
    signature=inspect.signature(_send_signature),
    details=inspect.getdoc(_send_signature) or "",
    reference=send_reference,
    dtypes=c.DTYPES,
    tolerances=c.EXACT,
    cases=_CASES,
    make_inputs=c.inputs_of(_inputs),
    collective=Collective(c.WORLD_SIZES, _inputs, _expected, _run, peers=("recv",)),
)

RECV = OpContract(
    name="recv",
    sglang_layer="GroupCoordinator.recv",
    summary="a new tensor of a given shape and dtype from one rank of the group",
    signature=inspect.signature(_recv_signature),
    details=inspect.getdoc(_recv_signature) or "",
    reference=recv_reference,
    dtypes=c.DTYPES,
    tolerances=c.EXACT,
    cases=_CASES,
    make_inputs=c.inputs_of(_inputs),
    collective=Collective(c.WORLD_SIZES, _inputs, _expected, _run, peers=("send",)),
)
