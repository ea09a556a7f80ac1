"""A chip's collective library reached through its ``torch.distributed`` backend.

NCCL (``ProcessGroupNCCL``) and HCCL (torch_npu's ``ProcessGroupHCCL``) are driven the same
way: the engine's device group already holds the library's communicator, and a collective is
one ``torch.distributed`` call on that group. What differs per library is what it accepts.
:class:`ProcessGroupLibrary` holds that (backend name, the dtypes each kind of collective
takes, how uneven gathers are served, the ops that need a runtime condition, each limit with
its source) and builds the collective implementations once for every vendor wheel: each
checks its arguments (the same checks as the references, :mod:`.ops.collectives.arguments`)
and the library's limits, raising :class:`~sglang_fl.errors.Unsupported` naming the limit and
its source before anything is sent, so the call goes to the next candidate instead of
failing inside the library.

The ``torch.distributed`` functions (and a library's own uneven ones) are read through
:attr:`ProcessGroupLibrary.api` on every call, so a vendor's tests can put a double of the
library there (it cannot run without the chip); production leaves it ``None``, which means
``torch.distributed`` itself (and :attr:`UnevenCalls.module`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ._strenum import StrEnum
from .errors import Unsupported
from .ops.collectives.arguments import (
    check_dim,
    check_one_per_rank,
    check_output_shape,
    check_rank,
    gatherv_counts,
    gatherv_inputs,
    scatterv_counts,
)
from .ops.collectives.group import CollectiveGroup

__all__ = ["CollectiveKind", "DtypeSet", "ProcessGroupLibrary", "UnevenCalls"]


class CollectiveKind(StrEnum):
    """What a collective does with the data, which decides the dtypes a library takes for it:
    libraries move any dtype they can address but reduce only those their reduction engine
    computes in (HCCL's ``checkSupportedDataType``, NCCL's reduction types)."""

    MOVE = "data movement"
    REDUCE = "reduction"


# The standard collective ops a process-group library serves, each with its kind: each is one
# torch.distributed call on the device group. Not ``quant_all_reduce``: its point is the
# chip's own quantisation kernel.
KINDS: Mapping[str, CollectiveKind] = {
    "all_reduce": CollectiveKind.REDUCE,
    "all_gather": CollectiveKind.MOVE,
    "all_gather_into_tensor": CollectiveKind.MOVE,
    "all_gatherv": CollectiveKind.MOVE,
    "reduce_scatter_tensor": CollectiveKind.REDUCE,
    "reduce_scatterv": CollectiveKind.REDUCE,
    "reduce_scatter": CollectiveKind.REDUCE,
    "broadcast": CollectiveKind.MOVE,
    "gather": CollectiveKind.MOVE,
    "send": CollectiveKind.MOVE,
    "recv": CollectiveKind.MOVE,
    "all_to_all_single": CollectiveKind.MOVE,
}
OPS: tuple[str, ...] = tuple(KINDS)


@dataclass(frozen=True)
class DtypeSet:
    """The dtypes one kind of collective takes, and where the library documents them.

    ``only_where`` are dtypes only some devices of the library take (float64 reductions on one
    SoC generation), ``where`` the device's answer and ``where_text`` who takes them
    (``"on Ascend 950 only"``): read when a call passes one of those dtypes, never at import.
    """

    dtypes: frozenset[torch.dtype]
    source: str
    only_where: frozenset[torch.dtype] = frozenset()
    where: Callable[[], bool] | None = None
    where_text: str = ""

    def allows(self, dtype: torch.dtype) -> bool:
        if dtype in self.dtypes:
            return True
        return dtype in self.only_where and self.where is not None and self.where()

    def describe(self) -> str:
        """The allowed dtypes, sorted, for messages (the device-dependent ones marked)."""
        text = _names(self.dtypes)
        return f"{text}; {_names(self.only_where)} {self.where_text}" if self.only_where else text


def _names(dtypes: frozenset[torch.dtype]) -> str:
    return ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))


@dataclass(frozen=True)
class UnevenCalls:
    """A library's own uneven all-gather and reduce-scatter: functions of ``module`` (or of
    :attr:`ProcessGroupLibrary.api` when a test put a double there) called as
    ``fn(output, input, split_sizes, group=device_group)``, ``split_sizes`` the rows of each
    rank (torch_npu's ``all_gather_into_tensor_uneven`` / ``reduce_scatter_tensor_uneven``)."""

    module: str
    all_gather: str
    reduce_scatter: str
    source: str


@dataclass
class ProcessGroupLibrary:
    """One collective library behind a ``torch.distributed`` backend, and what it accepts.

    - ``backend``: the name ``torch.distributed.get_backend`` reports for the library's groups;
    - ``dtypes``: the dtypes it moves (``dtypes_source`` documents them); ``reduce_dtypes``:
      those its reductions take, when fewer (``None``: the same); ``move_dtypes``: the moved
      ones as a :class:`DtypeSet` when some are moved only on some devices or releases (its
      ``dtypes`` those moved everywhere, replacing ``dtypes``; ``None``: ``dtypes``);
    - ``uneven``: how uneven ``all_gatherv``/``reduce_scatterv`` are served: ``None`` through
      the even calls (padded to the widest rank, or an all-reduce of which each rank keeps its
      rows: what the references do), an :class:`UnevenCalls` through the library's own
      uneven calls, or a string saying why they cannot be (with its source): those calls are
      declined and the reference serves them;
    - ``requirements``: ``op -> check`` for ops the library serves only under a runtime
      condition; the check returns why it cannot here (declined), or ``None``;
    - ``layout_source`` documents that tensors must be contiguous and on the device.
    """

    name: str
    backend: str
    dtypes: frozenset[torch.dtype]
    dtypes_source: str
    layout_source: str
    reduce_dtypes: DtypeSet | None = None
    move_dtypes: DtypeSet | None = None
    uneven: str | UnevenCalls | None = None
    requirements: Mapping[str, Callable[[], str | None]] = field(default_factory=dict)
    api: Any = None  # torch.distributed's functions; None: torch.distributed itself

    def functions(self) -> Any:
        """The ``torch.distributed`` module, or the double a test put in :attr:`api`."""
        if self.api is not None:
            return self.api
        import torch.distributed as dist

        return dist

    def dtype_set(self, kind: CollectiveKind) -> DtypeSet:
        """The dtypes collectives of ``kind`` take on this library."""
        if kind is CollectiveKind.REDUCE and self.reduce_dtypes is not None:
            return self.reduce_dtypes
        if self.move_dtypes is not None:
            return self.move_dtypes
        return DtypeSet(self.dtypes, self.dtypes_source)

    # -- the communicator lifecycle -------------------------------------------------------

    def check_group(self, group: CollectiveGroup) -> None:
        """For ``sglang_fl_communicator``: raise unless the engine built ``group``'s device
        group on this library's backend (a group on another backend cannot be served; the
        lifecycle then keeps the reference for it, reported, or fails under strict)."""
        found = str(self.functions().get_backend(group.device_group))
        if found != self.backend:
            raise RuntimeError(
                f"{self.name}: {group.describe()} has a {found!r} device group; {self.name} "
                f"runs on {self.backend!r} groups (the platform's torch.distributed backend)"
            )

    # -- refusals, before anything is sent ------------------------------------------------

    def _decline(self, op: str, what: str, source: str) -> Unsupported:
        return Unsupported(f"{self.name} {op}: {what} (source: {source})")

    def check_available(self, op: str) -> None:
        """Decline ``op`` when its runtime requirement does not hold on this machine."""
        requirement = self.requirements.get(op)
        why = requirement() if requirement is not None else None
        if why is not None:
            raise Unsupported(f"{self.name} {op}: {why}")

    def check_tensors(self, op: str, group: CollectiveGroup, *tensors: torch.Tensor) -> None:
        """Dtype (for the op's kind), contiguity and device of every tensor ``op`` hands to
        the library."""
        dtypes = self.dtype_set(KINDS[op])
        for tensor in tensors:
            if not dtypes.allows(tensor.dtype):
                raise self._decline(
                    op,
                    f"dtype {tensor.dtype} is not one its {KINDS[op]} collectives take "
                    f"({dtypes.describe()})",
                    dtypes.source,
                )
            if not tensor.is_contiguous():
                raise self._decline(op, "a non-contiguous tensor", self.layout_source)
            if tensor.device != group.device:
                raise self._decline(
                    op,
                    f"a tensor on {tensor.device}, not the communicator's device {group.device}",
                    self.layout_source,
                )

    def check_even(self, op: str, sizes: Sequence[int] | None) -> None:
        """Decline uneven ``sizes`` of ``op`` when this library cannot serve them."""
        if sizes is not None:
            self.uneven_function(op, sizes)

    def uneven_function(self, op: str, counts: Sequence[int]) -> Callable[..., Any] | None:
        """For uneven ``counts``: the library's own uneven call, ``None`` to pad through the
        even calls; declined when the library cannot serve them. ``None`` for even counts."""
        if len(set(counts)) <= 1:
            return None
        uneven = self.uneven
        if uneven is None:
            return None
        if isinstance(uneven, str):
            raise self._decline(op, f"uneven sizes {list(counts)}", uneven)
        name = uneven.all_gather if op == "all_gatherv" else uneven.reduce_scatter
        module = self.api if self.api is not None else _import(uneven.module)
        fn: Callable[..., Any] | None = getattr(module, name, None)
        if fn is None:
            release = getattr(module, "__version__", None)
            found = f"this release ({release}) has" if release else "it has"
            raise self._decline(
                op,
                f"uneven sizes {list(counts)}: {uneven.module}.{name} needed, {found} none",
                uneven.source,
            )
        return fn

    # -- the implementations --------------------------------------------------------------

    def implementations(self, ops: Sequence[str] = OPS) -> dict[str, Callable[..., Any]]:
        """``op -> adapter`` for the standard collectives in ``ops``, to register."""
        unknown = sorted(set(ops) - set(OPS))
        if unknown:
            raise ValueError(f"{self.name}: no adapter for {unknown}; collectives: {list(OPS)}")
        adapters = _adapters(self)
        return {op: adapters[op] for op in ops}


def _import(module: str) -> Any:
    """``module``, or ``None`` when it does not import (a library release without it)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def _single(dist: Any, name: str, fallback: str) -> Callable[..., Any]:
    """torch 2.14 renamed the tensor collectives (as SGLang's distributed/utils.py picks)."""
    fn: Callable[..., Any] = getattr(dist, name, None) or getattr(dist, fallback)
    return fn


def _adapters(lib: ProcessGroupLibrary) -> dict[str, Callable[..., Any]]:
    """The adapters of one library: checks first, then the calls on the device group."""

    def all_reduce(group: CollectiveGroup, input_: torch.Tensor) -> torch.Tensor:
        lib.check_tensors("all_reduce", group, input_)
        lib.functions().all_reduce(input_, group=group.device_group)
        return input_

    def gather_into(group: CollectiveGroup, output: torch.Tensor, input: torch.Tensor) -> None:
        dist = lib.functions()
        _single(dist, "all_gather_single", "all_gather_into_tensor")(
            output, input, group=group.device_group
        )

    def all_gather_into_tensor(
        group: CollectiveGroup, output: torch.Tensor, input: torch.Tensor
    ) -> None:
        lib.check_tensors("all_gather_into_tensor", group, output, input)
        gather_into(group, output, input)

    def all_gather(group: CollectiveGroup, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        dim = check_dim("all_gather", input_, dim)
        lib.check_tensors("all_gather", group, input_)
        n, shape = group.world_size, input_.shape
        out = input_.new_empty((n * shape[0], *shape[1:]))
        gather_into(group, out, input_)
        stacked = out.reshape((n, *shape)).movedim(0, dim)
        return stacked.reshape((*shape[:dim], n * shape[dim], *shape[dim + 1 :]))

    def all_gatherv(
        group: CollectiveGroup,
        input_: torch.Tensor | list[torch.Tensor],
        sizes: list[int] | None = None,
        output: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        tensors = gatherv_inputs(input_, output)
        outputs = [output] if output is not None else []
        lib.check_tensors("all_gatherv", group, *tensors, *outputs)
        plans = []  # every check of every tensor first: nothing is sent before a refusal
        for tensor in tensors:
            counts = gatherv_counts(group, tensor, sizes)
            shape = (sum(counts), *tensor.shape[1:])
            if output is not None:
                check_output_shape("all_gatherv", output, shape)
            plans.append((tensor, counts, shape, lib.uneven_function("all_gatherv", counts)))
        results = []
        for tensor, counts, shape, uneven in plans:
            out = output if output is not None else tensor.new_empty(shape)
            if uneven is not None:
                uneven(out, tensor, counts, group=group.device_group)
            elif len(set(counts)) <= 1:
                gather_into(group, out, tensor)
            else:  # padded to the widest rank, then the padding cut away
                widest, n = max(counts), group.world_size
                padded = tensor.new_zeros((widest, *tensor.shape[1:]))
                padded[: tensor.shape[0]] = tensor
                everyone = tensor.new_empty((n * widest, *tensor.shape[1:]))
                gather_into(group, everyone, padded)
                parts = [everyone[r * widest : r * widest + k] for r, k in enumerate(counts)]
                torch.cat(parts, out=out)
            results.append(out)
        return results

    def scatter_into(group: CollectiveGroup, output: torch.Tensor, input: torch.Tensor) -> None:
        dist = lib.functions()
        _single(dist, "reduce_scatter_single", "reduce_scatter_tensor")(
            output, input, group=group.device_group
        )

    def reduce_scatter_tensor(
        group: CollectiveGroup, output: torch.Tensor, input: torch.Tensor
    ) -> None:
        lib.check_tensors("reduce_scatter_tensor", group, output, input)
        scatter_into(group, output, input)

    def reduce_scatterv(
        group: CollectiveGroup,
        input_: torch.Tensor,
        output: torch.Tensor | None = None,
        sizes: list[int] | None = None,
    ) -> torch.Tensor:
        counts = scatterv_counts(group, input_, sizes)
        rank = group.rank_in_group
        shape = (counts[rank], *input_.shape[1:])
        if output is not None:
            check_output_shape("reduce_scatterv", output, shape)
        lib.check_tensors(
            "reduce_scatterv", group, input_, *([output] if output is not None else [])
        )
        uneven = lib.uneven_function("reduce_scatterv", counts)
        out = output if output is not None else input_.new_empty(shape)
        if uneven is not None:
            uneven(out, input_, counts, group=group.device_group)
        elif len(set(counts)) <= 1:
            scatter_into(group, out, input_)
        else:  # the whole sum on every rank, each keeping its own rows
            reduced = input_.clone()
            lib.functions().all_reduce(reduced, group=group.device_group)
            start = sum(counts[:rank])
            out.copy_(reduced[start : start + counts[rank]])
        return out

    def reduce_scatter(
        group: CollectiveGroup, output: torch.Tensor, input_list: list[torch.Tensor]
    ) -> torch.Tensor:
        check_one_per_rank("reduce_scatter", "input_list", input_list, group)
        lib.check_tensors("reduce_scatter", group, output, *input_list)
        lib.functions().reduce_scatter(output, list(input_list), group=group.device_group)
        return output

    def broadcast(group: CollectiveGroup, input_: torch.Tensor, src: int = 0) -> torch.Tensor:
        check_rank("broadcast", "src", src, group)
        lib.check_tensors("broadcast", group, input_)
        lib.functions().broadcast(input_, src=group.ranks[src], group=group.device_group)
        return input_

    def gather(
        group: CollectiveGroup, input_: torch.Tensor, dst: int = 0, dim: int = -1
    ) -> torch.Tensor | None:
        check_rank("gather", "dst", dst, group)
        check_dim("gather", input_, dim)
        lib.check_available("gather")
        lib.check_tensors("gather", group, input_)
        n = group.world_size
        parts = [torch.empty_like(input_) for _ in range(n)] if group.rank_in_group == dst else None
        lib.functions().gather(input_, parts, dst=group.ranks[dst], group=group.device_group)
        return torch.cat(parts, dim=dim) if parts is not None else None

    def send(group: CollectiveGroup, tensor: torch.Tensor, dst: int | None = None) -> None:
        lib.check_tensors("send", group, tensor)
        peer = (group.rank_in_group + 1) % group.world_size if dst is None else dst
        lib.functions().send(tensor, group.ranks[peer], group.device_group)

    def recv(
        group: CollectiveGroup, size: torch.Size, dtype: torch.dtype, src: int | None = None
    ) -> torch.Tensor:
        tensor = torch.empty(size, dtype=dtype, device=group.device)
        lib.check_tensors("recv", group, tensor)
        peer = (group.rank_in_group - 1) % group.world_size if src is None else src
        lib.functions().recv(tensor, group.ranks[peer], group.device_group)
        return tensor

    def all_to_all_single(
        group: CollectiveGroup, output: torch.Tensor, input: torch.Tensor
    ) -> None:
        lib.check_tensors("all_to_all_single", group, output, input)
        lib.functions().all_to_all_single(output, input, group=group.device_group)

    found: dict[str, Callable[..., Any]] = {
        "all_reduce": all_reduce,
        "all_gather": all_gather,
        "all_gather_into_tensor": all_gather_into_tensor,
        "all_gatherv": all_gatherv,
        "reduce_scatter_tensor": reduce_scatter_tensor,
        "reduce_scatterv": reduce_scatterv,
        "reduce_scatter": reduce_scatter,
        "broadcast": broadcast,
        "gather": gather,
        "send": send,
        "recv": recv,
        "all_to_all_single": all_to_all_single,
    }
    for op, fn in found.items():
        fn.__qualname__ = f"{lib.name}.{op}"
    return found
