"""A chip's collective library reached through its ``torch.distributed`` backend.

NCCL (``ProcessGroupNCCL``) and HCCL (torch_npu's ``ProcessGroupHCCL``) are driven the same
way: the engine's device group already holds the library's communicator, and a collective is
one ``torch.distributed`` call on that group. What differs per library is what it accepts.
:class:`ProcessGroupLibrary` holds that (backend name, dtypes, whether uneven gathers are
possible, each limit with its source) and builds the collective implementations once for every
vendor wheel: each checks the limits and raises :class:`~sglang_fl.errors.Unsupported`, naming
the limit and its source, before anything is sent, so the call goes to the next candidate
instead of failing inside the library.

The ``torch.distributed`` functions are read through :attr:`ProcessGroupLibrary.api` on every
call, so a vendor's tests can put a double of the library there (it cannot run without the
chip); production leaves it ``None``, which means ``torch.distributed`` itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .errors import Unsupported
from .ops.collectives.group import CollectiveGroup

__all__ = ["ProcessGroupLibrary"]

# The standard collective ops a process-group library serves: each is one torch.distributed call
# on the device group. Not ``quant_all_reduce``: its point is the chip's own quantisation kernel.
OPS: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gatherv",
    "reduce_scatter_tensor",
    "reduce_scatterv",
    "reduce_scatter",
    "broadcast",
    "gather",
    "send",
    "recv",
    "all_to_all_single",
)


@dataclass
class ProcessGroupLibrary:
    """One collective library behind a ``torch.distributed`` backend, and what it accepts.

    ``backend`` is the name ``torch.distributed.get_backend`` reports for the library's
    groups; ``dtypes`` the tensor dtypes it moves (``dtypes_source`` documents them);
    ``uneven`` is ``None`` when uneven gathers/scatters work, else why they do not (with its
    source): those calls are declined and the reference (padding) serves them. ``layout_source``
    documents that tensors must be contiguous and on the communicator's device.
    """

    name: str
    backend: str
    dtypes: frozenset[torch.dtype]
    dtypes_source: str
    layout_source: str
    uneven: str | None = None
    api: Any = None  # torch.distributed's functions; None: torch.distributed itself

    def functions(self) -> Any:
        """The ``torch.distributed`` module, or the double a test put in :attr:`api`."""
        if self.api is not None:
            return self.api
        import torch.distributed as dist

        return dist

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

    def check_tensors(self, op: str, group: CollectiveGroup, *tensors: torch.Tensor) -> None:
        """Dtype, contiguity and device of every tensor ``op`` hands to the library."""
        for tensor in tensors:
            if tensor.dtype not in self.dtypes:
                allowed = ", ".join(sorted(str(d).removeprefix("torch.") for d in self.dtypes))
                raise self._decline(
                    op, f"dtype {tensor.dtype} is not one it moves ({allowed})", self.dtypes_source
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
        if sizes is not None and len(set(sizes)) > 1 and self.uneven is not None:
            raise self._decline(op, f"uneven sizes {list(sizes)}", self.uneven)

    # -- the implementations --------------------------------------------------------------

    def implementations(self, ops: Sequence[str] = OPS) -> dict[str, Callable[..., Any]]:
        """``op -> adapter`` for the standard collectives in ``ops``, to register."""
        unknown = sorted(set(ops) - set(OPS))
        if unknown:
            raise ValueError(f"{self.name}: no adapter for {unknown}; collectives: {list(OPS)}")
        adapters = _adapters(self)
        return {op: adapters[op] for op in ops}


def _single(dist: Any, name: str, fallback: str) -> Callable[..., Any]:
    """torch 2.14 renamed the tensor collectives (as SGLang's distributed/utils.py picks)."""
    fn: Callable[..., Any] = getattr(dist, name, None) or getattr(dist, fallback)
    return fn


def _adapters(lib: ProcessGroupLibrary) -> dict[str, Callable[..., Any]]:
    """The adapters of one library: checks first, then one call on the device group."""

    def all_reduce(group: CollectiveGroup, input_: torch.Tensor) -> torch.Tensor:
        lib.check_tensors("all_reduce", group, input_)
        lib.functions().all_reduce(input_, group=group.device_group)
        return input_

    def all_gather_into_tensor(
        group: CollectiveGroup, output: torch.Tensor, input: torch.Tensor
    ) -> None:
        lib.check_tensors("all_gather_into_tensor", group, output, input)
        dist = lib.functions()
        gather = _single(dist, "all_gather_single", "all_gather_into_tensor")
        gather(output, input, group=group.device_group)

    def all_gather(group: CollectiveGroup, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if not -input_.dim() <= dim < input_.dim():
            raise ValueError(f"all_gather: dim={dim} is out of range for shape {input_.shape}")
        lib.check_tensors("all_gather", group, input_)
        n = group.world_size
        out = input_.new_empty((n * input_.shape[0], *input_.shape[1:]))
        all_gather_into_tensor(group, out, input_)
        dim = dim + input_.dim() if dim < 0 else dim
        shape = input_.shape
        stacked = out.reshape((n, *shape)).movedim(0, dim)
        return stacked.reshape((*shape[:dim], n * shape[dim], *shape[dim + 1 :]))

    def all_gatherv(
        group: CollectiveGroup,
        input_: torch.Tensor | list[torch.Tensor],
        sizes: list[int] | None = None,
        output: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        tensors = [input_] if isinstance(input_, torch.Tensor) else list(input_)
        if output is not None and len(tensors) != 1:
            raise ValueError("all_gatherv: output= requires a single-tensor input")
        lib.check_even("all_gatherv", sizes)
        lib.check_tensors("all_gatherv", group, *tensors, *([output] if output is not None else []))
        if sizes is not None:
            mine = sizes[group.rank_in_group]
            if len(sizes) != group.world_size or any(t.shape[0] != mine for t in tensors):
                raise ValueError(f"all_gatherv: sizes={sizes} do not match this rank's rows")
        results = []
        for tensor in tensors:
            shape = (group.world_size * tensor.shape[0], *tensor.shape[1:])
            out = output if output is not None else tensor.new_empty(shape)
            if tuple(out.shape) != shape:
                raise ValueError(f"all_gatherv: output shape {tuple(out.shape)} != {shape}")
            all_gather_into_tensor(group, out, tensor)
            results.append(out)
        return results

    def reduce_scatter_tensor(
        group: CollectiveGroup, output: torch.Tensor, input: torch.Tensor
    ) -> None:
        lib.check_tensors("reduce_scatter_tensor", group, output, input)
        dist = lib.functions()
        scatter = _single(dist, "reduce_scatter_single", "reduce_scatter_tensor")
        scatter(output, input, group=group.device_group)

    def reduce_scatterv(
        group: CollectiveGroup,
        input_: torch.Tensor,
        output: torch.Tensor | None = None,
        sizes: list[int] | None = None,
    ) -> torch.Tensor:
        n = group.world_size
        lib.check_even("reduce_scatterv", sizes)
        lib.check_tensors(
            "reduce_scatterv", group, input_, *([output] if output is not None else [])
        )
        if input_.shape[0] % n:
            raise ValueError(f"reduce_scatterv: {input_.shape[0]} rows do not split into {n}")
        shape = (input_.shape[0] // n, *input_.shape[1:])
        out = output if output is not None else input_.new_empty(shape)
        if tuple(out.shape) != shape:
            raise ValueError(f"reduce_scatterv: output shape {tuple(out.shape)} != {shape}")
        reduce_scatter_tensor(group, out, input_)
        return out

    def reduce_scatter(
        group: CollectiveGroup, output: torch.Tensor, input_list: list[torch.Tensor]
    ) -> torch.Tensor:
        if len(input_list) != group.world_size:
            raise ValueError(
                f"reduce_scatter: input_list has {len(input_list)} tensors, the group has "
                f"{group.world_size} ranks (one each)"
            )
        lib.check_tensors("reduce_scatter", group, output, *input_list)
        lib.functions().reduce_scatter(output, list(input_list), group=group.device_group)
        return output

    def broadcast(group: CollectiveGroup, input_: torch.Tensor, src: int = 0) -> torch.Tensor:
        if not 0 <= src < group.world_size:
            raise ValueError(
                f"broadcast: src={src} is not a rank of the {group.world_size}-rank group"
            )
        lib.check_tensors("broadcast", group, input_)
        lib.functions().broadcast(input_, src=group.ranks[src], group=group.device_group)
        return input_

    def gather(
        group: CollectiveGroup, input_: torch.Tensor, dst: int = 0, dim: int = -1
    ) -> torch.Tensor | None:
        n = group.world_size
        if not 0 <= dst < n:
            raise ValueError(f"gather: dst={dst} is not a rank of the {n}-rank group")
        if not -input_.dim() <= dim < input_.dim():
            raise ValueError(f"gather: dim={dim} is out of range for shape {tuple(input_.shape)}")
        lib.check_tensors("gather", group, input_)
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
