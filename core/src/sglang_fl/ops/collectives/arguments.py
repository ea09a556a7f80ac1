"""The argument checks every collective implementation makes before anything is sent.

The references (this package) and the vendors' process-group libraries
(:class:`~sglang_fl.collective_library.ProcessGroupLibrary`) take the same arguments, so they
refuse the same bad ones with the same message, from here. Each check raises ``ValueError``
naming the op, what was passed and what is allowed (a caller's mistake, not a limit of one
library: no other implementation would serve it); the helpers that work out how many rows each
rank holds return those counts.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .group import CollectiveGroup

__all__ = [
    "check_dim",
    "check_one_per_rank",
    "check_output_shape",
    "check_rank",
    "gatherv_counts",
    "gatherv_inputs",
    "scatterv_counts",
]


def check_dim(op: str, tensor: torch.Tensor, dim: int) -> int:
    """``dim`` as a non-negative index into ``tensor``'s dimensions."""
    if not -tensor.dim() <= dim < tensor.dim():
        raise ValueError(f"{op}: dim={dim} is out of range for shape {tuple(tensor.shape)}")
    return dim + tensor.dim() if dim < 0 else dim


def check_rank(op: str, name: str, rank: int, group: CollectiveGroup) -> int:
    """A ``src``/``dst`` argument: a rank in ``group`` (an index into ``group.ranks``)."""
    if not 0 <= rank < group.world_size:
        raise ValueError(f"{op}: {name}={rank} is not a rank of the {group.world_size}-rank group")
    return rank


def check_one_per_rank(
    op: str, name: str, tensors: Sequence[torch.Tensor], group: CollectiveGroup
) -> None:
    """A list argument with one tensor per rank of ``group`` (the list ``reduce_scatter``)."""
    if len(tensors) != group.world_size:
        raise ValueError(
            f"{op}: {name} has {len(tensors)} tensors, the group has {group.world_size} "
            "ranks (one each)"
        )


def check_output_shape(op: str, output: torch.Tensor, shape: Sequence[int]) -> None:
    """An ``output=`` the caller preallocated must have the shape the op writes."""
    if tuple(output.shape) != tuple(shape):
        raise ValueError(f"{op}: output shape {tuple(output.shape)} != {tuple(shape)}")


def gatherv_inputs(
    input_: torch.Tensor | Sequence[torch.Tensor], output: torch.Tensor | None
) -> list[torch.Tensor]:
    """``all_gatherv``'s ``input_`` as a list; ``output=`` only with a single tensor."""
    single = isinstance(input_, torch.Tensor)
    tensors = [input_] if isinstance(input_, torch.Tensor) else list(input_)
    if output is not None and not single:
        raise ValueError("all_gatherv: output= requires a single-tensor input")
    return tensors


def gatherv_counts(
    group: CollectiveGroup, tensor: torch.Tensor, sizes: Sequence[int] | None
) -> list[int]:
    """Rows each rank contributes to ``all_gatherv`` of ``tensor``: ``sizes``, or this rank's
    row count on every rank when ``sizes`` is ``None``; this rank's rows must be its entry."""
    n = group.world_size
    if sizes is not None and len(sizes) != n:
        raise ValueError(f"all_gatherv: sizes={list(sizes)} must have one entry per rank ({n})")
    counts = list(sizes) if sizes is not None else [int(tensor.shape[0])] * n
    mine = counts[group.rank_in_group]
    if tensor.shape[0] != mine:
        raise ValueError(
            f"all_gatherv: this rank's input has {tensor.shape[0]} rows, sizes says {mine}"
        )
    return counts


def scatterv_counts(
    group: CollectiveGroup, input_: torch.Tensor, sizes: Sequence[int] | None
) -> list[int]:
    """Rows of ``reduce_scatterv``'s sum each rank keeps: ``sizes`` (one entry per rank, summing
    to ``input_``'s rows), or equal slices when ``sizes`` is ``None``."""
    n, rows = group.world_size, int(input_.shape[0])
    if sizes is None:
        if rows % n:
            raise ValueError(f"reduce_scatterv: {rows} rows do not split into {n} ranks")
        return [rows // n] * n
    if len(sizes) != n or sum(sizes) != rows:
        raise ValueError(
            f"reduce_scatterv: sizes={list(sizes)} must have {n} entries summing to "
            f"input_.shape[0]={rows}"
        )
    return list(sizes)
