"""Gathers: ``all_gather`` (along a dim), ``all_gather_into_tensor``, ``all_gatherv`` (uneven)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..contract import Collective, OpCase, OpContract, OpInputs, axis, case_grid
from . import _common as c
from .arguments import (
    check_dim,
    check_output_shape,
    check_rank,
    gatherv_counts,
    gatherv_inputs,
)
from .group import CollectiveGroup

# -- all_gather -----------------------------------------------------------------------------------


def _all_gather_signature(
    group: CollectiveGroup, input_: torch.Tensor, dim: int = -1
) -> torch.Tensor:
    """Every rank gets the ranks' ``input_`` (same shape on every rank) concatenated along
    ``dim``, in group order: ``GroupCoordinator.all_gather`` without ``output_tensor_list``
    (the vocabulary-parallel logits, column-parallel outputs). ``input_`` is unchanged."""
    raise NotImplementedError


def _concat_layout(gathered: torch.Tensor, shape: torch.Size, dim: int, n: int) -> torch.Tensor:
    """``[n * d0, ...]`` rank-major -> concatenated along ``dim`` (SGLang's reshape)."""
    dim = dim + len(shape) if dim < 0 else dim
    out = gathered.reshape((n, *shape)).movedim(0, dim)
    return out.reshape((*shape[:dim], n * shape[dim], *shape[dim + 1 :]))


def all_gather_reference(
    group: CollectiveGroup, input_: torch.Tensor, dim: int = -1
) -> torch.Tensor:
    """SGLang's CPU path: ``all_gather_single`` into ``[n * d0, ...]``, then its reshape."""
    check_dim("all_gather", input_, dim)
    n = group.world_size
    out = torch.empty(
        (n * input_.shape[0], *input_.shape[1:]), dtype=input_.dtype, device=input_.device
    )
    c.all_gather_single(out, input_.contiguous(), group=group.device_group)
    return _concat_layout(out, input_.shape, dim, n)


def _all_gather_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, rank: int, world_size: int
) -> OpInputs:
    p = case.params
    x = c.normal((p["rows"], p["hidden"]), dtype, device, c.seeded(case, rank))
    return OpInputs(
        obj=c.group_stand_in(rank, world_size),
        args=(x,),
        kwargs={"dim": p["dim"]},
        preserved=("input_",),
    )


def _all_gather_expected(case: OpCase, ranks: Sequence[OpInputs], rank: int) -> torch.Tensor:
    return torch.cat([inputs.args[0] for inputs in ranks], dim=case.params["dim"])


def _gather_name(p: Mapping[str, Any]) -> str:
    return f"{c.rank_name(p)},dim={p['dim']}"


ALL_GATHER = OpContract(
    name="all_gather",
    sglang_layer="GroupCoordinator.all_gather",
    summary="the ranks' tensors concatenated along a dim, in group order, on every rank",
    signature=inspect.signature(_all_gather_signature),
    reference=all_gather_reference,
    dtypes=c.DTYPES,
    tolerances=c.EXACT,
    cases=case_grid(
        _gather_name, axis("rows", c.ROWS), axis("hidden", (16,)), axis("dim", (-1, 0))
    ),
    make_inputs=c.inputs_of(_all_gather_inputs),
    collective=Collective(
        c.WORLD_SIZES, _all_gather_inputs, _all_gather_expected, c.call_own_op("all_gather")
    ),
)


# -- all_gather_into_tensor -----------------------------------------------------------------------


def _into_tensor_signature(
    group: CollectiveGroup, output: torch.Tensor, input: torch.Tensor
) -> None:
    """Write the ranks' ``input`` ``[rows, ...]`` into ``output`` ``[world_size * rows, ...]``,
    rank ``r`` at rows ``r * rows`` on: ``GroupCoordinator.all_gather_into_tensor`` (DP
    attention, MoE dispatch). Both contiguous, same dtype; returns nothing."""
    raise NotImplementedError


def all_gather_into_tensor_reference(
    group: CollectiveGroup, output: torch.Tensor, input: torch.Tensor
) -> None:
    """SGLang's CPU path: ``all_gather_single`` on the device group."""
    c.all_gather_single(output, input, group=group.device_group)


def _into_tensor_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, rank: int, world_size: int
) -> OpInputs:
    p = case.params
    x = c.normal((p["rows"], p["hidden"]), dtype, device, c.seeded(case, rank))
    output = torch.full(
        (p["rows"] * world_size, p["hidden"]), float("nan"), dtype=dtype, device=device
    )
    return OpInputs(obj=c.group_stand_in(rank, world_size), args=(output, x), preserved=("input",))


def _into_tensor_expected(case: OpCase, ranks: Sequence[OpInputs], rank: int) -> torch.Tensor:
    return torch.cat([inputs.args[1] for inputs in ranks])


ALL_GATHER_INTO_TENSOR = OpContract(
    name="all_gather_into_tensor",
    sglang_layer="GroupCoordinator.all_gather_into_tensor",
    summary="the ranks' rows stacked rank-major into a preallocated output",
    signature=inspect.signature(_into_tensor_signature),
    reference=all_gather_into_tensor_reference,
    dtypes=c.DTYPES,
    tolerances=c.EXACT,
    cases=case_grid(c.rank_name, axis("rows", c.ROWS), axis("hidden", (16,))),
    make_inputs=c.inputs_of(_into_tensor_inputs),
    collective=Collective(
        c.WORLD_SIZES,
        _into_tensor_inputs,
        _into_tensor_expected,
        c.call_into("all_gather_into_tensor"),
    ),
)


# -- all_gatherv ----------------------------------------------------------------------------------


def _all_gatherv_signature(
    group: CollectiveGroup,
    input_: torch.Tensor | list[torch.Tensor],
    sizes: list[int] | None = None,
    output: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Gather rows of uneven count: rank ``r`` contributes ``sizes[r]`` rows (its ``input_``
    ``[sizes[r], ...]``), every rank gets ``[sum(sizes), ...]`` rank-major.

    ``GroupCoordinator.all_gatherv`` (DP attention): ``input_`` is one tensor or a list (each
    gathered alike); ``sizes=None`` means equal counts; ``output`` (single tensor only) is
    written in place. Returns the list of gathered tensors, one per input, as SGLang does.
    """
    raise NotImplementedError


def all_gatherv_reference(
    group: CollectiveGroup,
    input_: torch.Tensor | list[torch.Tensor],
    sizes: list[int] | None = None,
    output: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Uneven counts over torch.distributed (gloo has no uneven gather; SGLang itself needs
    pynccl for this op): each rank pads its rows to the largest count, one ``all_gather_single``,
    then the padding is cut away."""
    n = group.world_size
    tensors = gatherv_inputs(input_, output)
    results = []
    for tensor in tensors:
        counts = gatherv_counts(group, tensor, sizes)
        if output is not None:
            check_output_shape("all_gatherv", output, (sum(counts), *tensor.shape[1:]))
        widest = max(counts)
        padded = tensor.new_zeros((widest, *tensor.shape[1:]))
        padded[: tensor.shape[0]] = tensor
        everyone = tensor.new_empty((n * widest, *tensor.shape[1:]))
        c.all_gather_single(everyone, padded, group=group.device_group)
        gathered = torch.cat([everyone[r * widest : r * widest + k] for r, k in enumerate(counts)])
        if output is not None:
            output.copy_(gathered)
            gathered = output
        results.append(gathered)
    return results


def _gatherv_name(p: Mapping[str, Any]) -> str:
    return f"{c.rank_name(p)},{p['form']}"


def _counts(case: OpCase, world_size: int) -> list[int] | None:
    rows = case.params["rows"]
    if case.params["form"] == "even":
        return None
    return [rows + (r % 2) * -rows + (r // 2) for r in range(world_size)]


def _all_gatherv_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, rank: int, world_size: int
) -> OpInputs:
    p = case.params
    sizes = _counts(case, world_size)
    mine = sizes[rank] if sizes is not None else p["rows"]
    g = c.seeded(case, rank)
    x = c.normal((mine, p["hidden"]), dtype, device, g)
    total = sum(sizes) if sizes is not None else p["rows"] * world_size
    kwargs: dict[str, Any] = {"sizes": sizes, "output": None}
    if p["form"] == "list":
        return OpInputs(
            obj=c.group_stand_in(rank, world_size),
            args=([x, c.normal((mine, 3), dtype, device, g)],),
            kwargs=kwargs,
        )
    if p["form"] == "into-output":
        kwargs["output"] = torch.full(
            (total, p["hidden"]), float("nan"), dtype=dtype, device=device
        )
    return OpInputs(
        obj=c.group_stand_in(rank, world_size), args=(x,), kwargs=kwargs, preserved=("input_",)
    )


def _all_gatherv_expected(case: OpCase, ranks: Sequence[OpInputs], rank: int) -> list[torch.Tensor]:
    first = ranks[0].args[0]
    if isinstance(first, torch.Tensor):
        return [torch.cat([inputs.args[0] for inputs in ranks])]
    return [torch.cat([inputs.args[0][i] for inputs in ranks]) for i in range(len(first))]


def _run_all_gatherv(fns: Mapping[str, Any], group: Any, case: OpCase, inputs: OpInputs) -> Any:
    result = fns["all_gatherv"](group, *inputs.args, **inputs.kwargs)
    output = inputs.kwargs["output"]
    if output is not None and result[0] is not output:
        raise AssertionError("all_gatherv was given output= but returned another tensor")
    return list(result)


ALL_GATHERV = OpContract(
    name="all_gatherv",
    sglang_layer="GroupCoordinator.all_gatherv",
    summary="the ranks' rows of uneven count stacked rank-major (one tensor or a list)",
    signature=inspect.signature(_all_gatherv_signature),
    reference=all_gatherv_reference,
    dtypes=c.DTYPES,
    tolerances=c.EXACT,
    cases=case_grid(
        _gatherv_name,
        axis("rows", (1, 7)),
        axis("hidden", (16,)),
        axis("form", ("even", "uneven", "list", "into-output")),
    ),
    make_inputs=c.inputs_of(_all_gatherv_inputs),
    collective=Collective(
        c.WORLD_SIZES, _all_gatherv_inputs, _all_gatherv_expected, _run_all_gatherv
    ),
)


# -- gather ---------------------------------------------------------------------------------------


def _gather_signature(
    group: CollectiveGroup, input_: torch.Tensor, dst: int = 0, dim: int = -1
) -> torch.Tensor | None:
    """Rank ``dst`` of the group gets the ranks' ``input_`` (same shape on every rank)
    concatenated along ``dim`` in group order; every other rank gets ``None``
    (``GroupCoordinator.gather``: ``tensor_model_parallel_gather``, logits on one rank).
    ``input_`` is contiguous and unchanged."""
    raise NotImplementedError


def gather_reference(
    group: CollectiveGroup, input_: torch.Tensor, dst: int = 0, dim: int = -1
) -> torch.Tensor | None:
    """SGLang's path: ``torch.distributed.gather`` to the global rank, then a concatenation."""
    n = group.world_size
    check_rank("gather", "dst", dst, group)
    check_dim("gather", input_, dim)
    mine = group.rank_in_group == dst
    parts = [torch.empty_like(input_) for _ in range(n)] if mine else None
    dist.gather(input_, parts, dst=group.ranks[dst], group=group.device_group)
    return torch.cat(parts, dim=dim) if parts is not None else None


def _gather_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, rank: int, world_size: int
) -> OpInputs:
    p = case.params
    x = c.normal((p["rows"], p["hidden"]), dtype, device, c.seeded(case, rank))
    dst = 0 if p["dst"] == "first" else world_size - 1
    return OpInputs(
        obj=c.group_stand_in(rank, world_size),
        args=(x,),
        kwargs={"dst": dst, "dim": p["dim"]},
        preserved=("input_",),
    )


def _gather_expected(case: OpCase, ranks: Sequence[OpInputs], rank: int) -> torch.Tensor | None:
    if rank != ranks[0].kwargs["dst"]:
        return None
    return torch.cat([inputs.args[0] for inputs in ranks], dim=case.params["dim"])


def _to_dst_name(p: Mapping[str, Any]) -> str:
    return f"{_gather_name(p)},dst={p['dst']}"


GATHER = OpContract(
    name="gather",
    sglang_layer="GroupCoordinator.gather",
    summary="the ranks' tensors concatenated along a dim, in group order, on rank dst only",
    signature=inspect.signature(_gather_signature),
    reference=gather_reference,
    dtypes=c.DTYPES,
    tolerances=c.EXACT,
    cases=case_grid(
        _to_dst_name,
        axis("rows", c.ROWS),
        axis("hidden", (16,)),
        axis("dim", (-1, 0)),
        axis("dst", ("first", "last")),
    ),
    make_inputs=c.inputs_of(_gather_inputs),
    collective=Collective(c.WORLD_SIZES, _gather_inputs, _gather_expected, c.call_own_op("gather")),
)
