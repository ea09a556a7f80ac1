"""Collectives on template, through this rank's communicator for the group.

Each takes the group first (``group.communicator`` is what communicator.py set up for it) and
calls one library function on the chip's current stream. Raise ``Unsupported`` before sending
anything for what the library cannot do (a dtype, uneven counts), and decline alike on every
rank: a rank that sends while another declined would wait forever.
"""

from __future__ import annotations

import torch

from sglang_fl.types import CollectiveGroup, Unsupported


def all_reduce(group: CollectiveGroup, input_: torch.Tensor) -> torch.Tensor:
    # The element-wise sum over the group; in place (return input_) or a new tensor, e.g.
    # flagcxAllReduce(buf, buf, numel, dtype, flagcxSum, group.communicator.comm, stream).
    raise Unsupported("template: all_reduce is not implemented")


def all_gather(group: CollectiveGroup, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
    # The ranks' input_ concatenated along dim, in group order (a new tensor).
    raise Unsupported("template: all_gather is not implemented")


def all_gather_into_tensor(
    group: CollectiveGroup, output: torch.Tensor, input: torch.Tensor
) -> None:
    # output [world_size * rows, ...] gets every rank's input [rows, ...], rank-major
    # (flagcxAllGather(input, output, input.numel(), dtype, comm, stream)).
    raise Unsupported("template: all_gather_into_tensor is not implemented")


def all_gatherv(
    group: CollectiveGroup,
    input_: torch.Tensor | list[torch.Tensor],
    sizes: list[int] | None = None,
    output: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    # Uneven counts: rank r gives sizes[r] rows; one gathered tensor per input.
    raise Unsupported("template: all_gatherv is not implemented")


def quant_all_reduce(group: CollectiveGroup, input_: torch.Tensor) -> torch.Tensor:
    # all_reduce that may move the inputs quantised (--enable-quant-communications): e.g. an
    # int8 per-token all-gather, dequantised and summed; within the contract's tolerance.
    raise Unsupported("template: quant_all_reduce is not implemented")


def reduce_scatter_tensor(
    group: CollectiveGroup, output: torch.Tensor, input: torch.Tensor
) -> None:
    # The sum of input [world_size * rows, ...]; this rank's rows into output [rows, ...]
    # (flagcxReduceScatter(input, output, output.numel(), dtype, flagcxSum, comm, stream)).
    raise Unsupported("template: reduce_scatter_tensor is not implemented")


def reduce_scatterv(
    group: CollectiveGroup,
    input_: torch.Tensor,
    output: torch.Tensor | None = None,
    sizes: list[int] | None = None,
) -> torch.Tensor:
    # Uneven slices of the sum: rank r keeps sizes[r] rows.
    raise Unsupported("template: reduce_scatterv is not implemented")


def reduce_scatter(
    group: CollectiveGroup, output: torch.Tensor, input_list: list[torch.Tensor]
) -> torch.Tensor:
    # Rank r's output gets the sum over the group of each rank's input_list[r]; returns output.
    raise Unsupported("template: reduce_scatter is not implemented")


def broadcast(group: CollectiveGroup, input_: torch.Tensor, src: int = 0) -> torch.Tensor:
    # Rank src's values into every rank's input_, in place (src is a rank in the group).
    raise Unsupported("template: broadcast is not implemented")


def gather(
    group: CollectiveGroup, input_: torch.Tensor, dst: int = 0, dim: int = -1
) -> torch.Tensor | None:
    # Rank dst gets the ranks' input_ concatenated along dim, in group order; the others None.
    raise Unsupported("template: gather is not implemented")


def send(group: CollectiveGroup, tensor: torch.Tensor, dst: int | None = None) -> None:
    # To rank dst of the group (None: the next), e.g. flagcxSend(tensor, numel, dtype, dst, ...).
    raise Unsupported("template: send is not implemented")


def recv(
    group: CollectiveGroup, size: torch.Size, dtype: torch.dtype, src: int | None = None
) -> torch.Tensor:
    # A new tensor on group.device from rank src (None: the previous), e.g. flagcxRecv.
    raise Unsupported("template: recv is not implemented")


def all_to_all_single(group: CollectiveGroup, output: torch.Tensor, input: torch.Tensor) -> None:
    # Equal slices of rows exchanged between every pair of ranks (flagcxAlltoAll).
    raise Unsupported("template: all_to_all_single is not implemented")
