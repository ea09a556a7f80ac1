"""Sums over a group's ranks: ``all_reduce``, ``reduce_scatter_tensor``, ``reduce_scatterv``."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..contract import Collective, OpCase, OpContract, OpInputs, axis, case_grid
from . import _common as c
from .arguments import check_one_per_rank, check_output_shape, scatterv_counts
from .group import CollectiveGroup


def _sum(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The in-order sum in float32, in the inputs' dtype: what the tolerance is measured from."""
    total = torch.zeros_like(tensors[0], dtype=torch.float32)
    for tensor in tensors:
        total += tensor.to(torch.float32)
    return total.to(tensors[0].dtype)


# -- all_reduce -----------------------------------------------------------------------------------


def _all_reduce_signature(group: CollectiveGroup, input_: torch.Tensor) -> torch.Tensor:
    """Every rank gets the element-wise sum over the group of ``input_`` (any shape, contiguous).

    ``GroupCoordinator.all_reduce``: an implementation may reduce in place and return
    ``input_`` (torch.distributed, NCCL) or return a new tensor (out-of-place kernels); callers
    use the returned tensor. Shape and dtype are kept; the order of the sum is open.
    """
    raise NotImplementedError


def all_reduce_reference(group: CollectiveGroup, input_: torch.Tensor) -> torch.Tensor:
    """SGLang's CPU and fallback path: ``torch.distributed.all_reduce`` on the device group."""
    dist.all_reduce(input_, group=group.device_group)
    return input_


def _all_reduce_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, rank: int, world_size: int
) -> OpInputs:
    p = case.params
    x = c.normal((p["rows"], p["hidden"]), dtype, device, c.seeded(case, rank))
    return OpInputs(obj=c.group_stand_in(rank, world_size), args=(x,))


def _all_reduce_expected(case: OpCase, ranks: Sequence[OpInputs], rank: int) -> torch.Tensor:
    return _sum([inputs.args[0] for inputs in ranks])


_CASES = case_grid(c.rank_name, axis("rows", c.ROWS), axis("hidden", (16, 96)))


ALL_REDUCE = OpContract(
    name="all_reduce",
    sglang_layer="GroupCoordinator.all_reduce",
    summary="element-wise sum over the group's ranks; may reduce in place (use the result)",
    signature=inspect.signature(_all_reduce_signature),
    reference=all_reduce_reference,
    dtypes=c.DTYPES,
    tolerances=c.REDUCED,
    cases=_CASES,
    make_inputs=c.inputs_of(_all_reduce_inputs),
    collective=Collective(
        c.WORLD_SIZES, _all_reduce_inputs, _all_reduce_expected, c.call_own_op("all_reduce")
    ),
)


# -- quant_all_reduce -----------------------------------------------------------------------------


def _quant_all_reduce_signature(group: CollectiveGroup, input_: torch.Tensor) -> torch.Tensor:
    """``all_reduce`` that may move the inputs quantised: ``GroupCoordinator.quant_all_reduce``
    (``--enable-quant-communications``; on NPU an int8 per-token all-gather, dequantised and
    summed in the input dtype). ``input_`` ``[rows, hidden]``; the result is within
    ``QUANTIZED`` of the exact sum; may work in place (use the returned tensor)."""
    raise NotImplementedError


def quant_all_reduce_reference(group: CollectiveGroup, input_: torch.Tensor) -> torch.Tensor:
    """SGLang's path without torch_npu: the exact in-place ``all_reduce``."""
    dist.all_reduce(input_, group=group.device_group)
    return input_


QUANT_ALL_REDUCE = OpContract(
    name="quant_all_reduce",
    sglang_layer="GroupCoordinator.quant_all_reduce",
    summary="sum over the group's ranks that may move int8 per-token quantised inputs",
    signature=inspect.signature(_quant_all_reduce_signature),
    reference=quant_all_reduce_reference,
    dtypes=c.DTYPES,
    tolerances=c.QUANTIZED,
    cases=_CASES,
    make_inputs=c.inputs_of(_all_reduce_inputs),
    collective=Collective(
        c.WORLD_SIZES,
        _all_reduce_inputs,
        _all_reduce_expected,
        c.call_own_op("quant_all_reduce"),
    ),
)


# -- reduce_scatter_tensor ------------------------------------------------------------------------


def _reduce_scatter_signature(
    group: CollectiveGroup, output: torch.Tensor, input: torch.Tensor
) -> None:
    """Sum ``input`` ``[world_size * rows, ...]`` over the group; rank ``r`` writes rows
    ``r * rows`` to ``(r + 1) * rows`` of the sum into ``output`` ``[rows, ...]``.

    ``GroupCoordinator.reduce_scatter_tensor`` (DP attention, MoE): both contiguous, same
    dtype; ``input`` is left unchanged; returns nothing.
    """
    raise NotImplementedError


def reduce_scatter_reference(
    group: CollectiveGroup, output: torch.Tensor, input: torch.Tensor
) -> None:
    """SGLang's CPU path: ``reduce_scatter_single`` (``reduce_scatter_tensor``) on the device
    group."""
    c.reduce_scatter_single(output, input, group=group.device_group)


def _reduce_scatter_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, rank: int, world_size: int
) -> OpInputs:
    p = case.params
    full = c.normal((p["rows"] * world_size, p["hidden"]), dtype, device, c.seeded(case, rank))
    output = torch.full((p["rows"], p["hidden"]), float("nan"), dtype=dtype, device=device)
    return OpInputs(
        obj=c.group_stand_in(rank, world_size), args=(output, full), preserved=("input",)
    )


def _reduce_scatter_expected(case: OpCase, ranks: Sequence[OpInputs], rank: int) -> torch.Tensor:
    rows = case.params["rows"]
    return _sum([inputs.args[1] for inputs in ranks])[rank * rows : (rank + 1) * rows]


REDUCE_SCATTER_TENSOR = OpContract(
    name="reduce_scatter_tensor",
    sglang_layer="GroupCoordinator.reduce_scatter_tensor",
    summary="sum over the ranks, each rank keeping its equal slice of rows (written to output)",
    signature=inspect.signature(_reduce_scatter_signature),
    reference=reduce_scatter_reference,
    dtypes=c.DTYPES,
    tolerances=c.REDUCED,
    cases=_CASES,
    make_inputs=c.inputs_of(_reduce_scatter_inputs),
    collective=Collective(
        c.WORLD_SIZES,
        _reduce_scatter_inputs,
        _reduce_scatter_expected,
        c.call_into("reduce_scatter_tensor"),
    ),
)


# -- reduce_scatterv ------------------------------------------------------------------------------


def _reduce_scatterv_signature(
    group: CollectiveGroup,
    input_: torch.Tensor,
    output: torch.Tensor | None = None,
    sizes: list[int] | None = None,
) -> torch.Tensor:
    """Like ``reduce_scatter_tensor`` with uneven slices: rank ``r`` keeps ``sizes[r]`` rows.

    ``GroupCoordinator.reduce_scatterv`` (DP attention with uneven token counts): ``input_``
    ``[sum(sizes), ...]`` (``sizes=None``: ``world_size`` equal slices); ``sizes`` has one
    entry per rank, the same list on every rank, entries may be 0. Writes into ``output`` when
    given (shape ``[sizes[r], ...]``), else allocates; returns the slice; ``input_`` unchanged.
    """
    raise NotImplementedError


def _slice_of(sizes: Sequence[int] | None, rows: int, world_size: int, rank: int) -> slice:
    if sizes is None:
        chunk = rows // world_size
        return slice(rank * chunk, (rank + 1) * chunk)
    start = sum(sizes[:rank])
    return slice(start, start + sizes[rank])


def reduce_scatterv_reference(
    group: CollectiveGroup,
    input_: torch.Tensor,
    output: torch.Tensor | None = None,
    sizes: list[int] | None = None,
) -> torch.Tensor:
    """torch.distributed has no uneven reduce-scatter (SGLang needs pynccl for it): an
    ``all_reduce`` of a copy, then this rank's rows; the order of the sum is the backend's."""
    counts = scatterv_counts(group, input_, sizes)
    start, mine = sum(counts[: group.rank_in_group]), counts[group.rank_in_group]
    if output is not None:
        check_output_shape("reduce_scatterv", output, (mine, *input_.shape[1:]))
    reduced = input_.clone()
    dist.all_reduce(reduced, group=group.device_group)
    part = reduced[start : start + mine]
    if output is None:
        return part.contiguous()
    output.copy_(part)
    return output


def _uneven(world_size: int, rows: int) -> list[int]:
    """Uneven slices with an idle rank: ``[rows, 0, rows + 1, ...]``."""
    return [rows + (r % 2) * -rows + (r // 2) for r in range(world_size)]


def _scatterv_name(p: Mapping[str, Any]) -> str:
    return f"{c.rank_name(p)},{p['sizes']}" + (",into-output" if p["into_output"] else "")


_V_CASES = case_grid(
    _scatterv_name,
    axis("rows", (1, 7)),
    axis("hidden", (16,)),
    axis("sizes", ("even", "uneven")),
    axis("into_output", (False, True)),
)


def _reduce_scatterv_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, rank: int, world_size: int
) -> OpInputs:
    p = case.params
    sizes = _uneven(world_size, p["rows"]) if p["sizes"] == "uneven" else None
    total = sum(sizes) if sizes is not None else p["rows"] * world_size
    full = c.normal((total, p["hidden"]), dtype, device, c.seeded(case, rank))
    mine = sizes[rank] if sizes is not None else p["rows"]
    output = None
    if p["into_output"]:
        output = torch.full((mine, p["hidden"]), float("nan"), dtype=dtype, device=device)
    return OpInputs(
        obj=c.group_stand_in(rank, world_size),
        args=(full,),
        kwargs={"output": output, "sizes": sizes},
        preserved=("input_",),
    )


def _reduce_scatterv_expected(case: OpCase, ranks: Sequence[OpInputs], rank: int) -> torch.Tensor:
    first = ranks[0]
    full = _sum([inputs.args[0] for inputs in ranks])
    return full[_slice_of(first.kwargs["sizes"], full.shape[0], len(ranks), rank)]


def _run_reduce_scatterv(fns: Mapping[str, Any], group: Any, case: OpCase, inputs: OpInputs) -> Any:
    result = fns["reduce_scatterv"](group, *inputs.args, **inputs.kwargs)
    output = inputs.kwargs["output"]
    if output is not None and result is not output:
        raise AssertionError("reduce_scatterv was given output= but returned another tensor")
    return result


REDUCE_SCATTERV = OpContract(
    name="reduce_scatterv",
    sglang_layer="GroupCoordinator.reduce_scatterv",
    summary="sum over the ranks, each rank keeping its own (uneven) number of rows",
    signature=inspect.signature(_reduce_scatterv_signature),
    reference=reduce_scatterv_reference,
    dtypes=c.DTYPES,
    tolerances=c.REDUCED,
    cases=_V_CASES,
    make_inputs=c.inputs_of(_reduce_scatterv_inputs),
    collective=Collective(
        c.WORLD_SIZES, _reduce_scatterv_inputs, _reduce_scatterv_expected, _run_reduce_scatterv
    ),
)


# -- reduce_scatter (list form) -------------------------------------------------------------------


def _reduce_scatter_list_signature(
    group: CollectiveGroup, output: torch.Tensor, input_list: list[torch.Tensor]
) -> torch.Tensor:
    """Rank ``r``'s ``output`` gets the sum over the group of each rank's ``input_list[r]``.

    ``GroupCoordinator.reduce_scatter``: ``input_list`` has one contiguous tensor per rank,
    each shaped and typed like ``output``; the list is left unchanged; returns ``output``.
    """
    raise NotImplementedError


def reduce_scatter_list_reference(
    group: CollectiveGroup, output: torch.Tensor, input_list: list[torch.Tensor]
) -> torch.Tensor:
    """SGLang's call: ``torch.distributed.reduce_scatter`` on the device group."""
    check_one_per_rank("reduce_scatter", "input_list", input_list, group)
    dist.reduce_scatter(output, list(input_list), group=group.device_group)
    return output


def _reduce_scatter_list_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, rank: int, world_size: int
) -> OpInputs:
    p = case.params
    g = c.seeded(case, rank)
    parts = [c.normal((p["rows"], p["hidden"]), dtype, device, g) for _ in range(world_size)]
    output = torch.full((p["rows"], p["hidden"]), float("nan"), dtype=dtype, device=device)
    return OpInputs(obj=c.group_stand_in(rank, world_size), args=(output, parts))


def _reduce_scatter_list_expected(
    case: OpCase, ranks: Sequence[OpInputs], rank: int
) -> torch.Tensor:
    return _sum([inputs.args[1][rank] for inputs in ranks])


def _run_reduce_scatter_list(
    fns: Mapping[str, Any], group: Any, case: OpCase, inputs: OpInputs
) -> Any:
    result = fns["reduce_scatter"](group, *inputs.args, **inputs.kwargs)
    if result is not inputs.args[0]:
        raise AssertionError("reduce_scatter must write into output and return it")
    return result


REDUCE_SCATTER = OpContract(
    name="reduce_scatter",
    sglang_layer="GroupCoordinator.reduce_scatter",
    summary="sum over the ranks of a list of per-rank tensors, rank r keeping entry r",
    signature=inspect.signature(_reduce_scatter_list_signature),
    reference=reduce_scatter_list_reference,
    dtypes=c.DTYPES,
    tolerances=c.REDUCED,
    cases=_CASES,
    make_inputs=c.inputs_of(_reduce_scatter_list_inputs),
    collective=Collective(
        c.WORLD_SIZES,
        _reduce_scatter_list_inputs,
        _reduce_scatter_list_expected,
        _run_reduce_scatter_list,
    ),
)
