"""Doubles of collective libraries behind ``torch.distributed`` (NCCL, HCCL), over gloo.

A vendor's collective adapters (:class:`~sglang_fl.collective_library.ProcessGroupLibrary`)
call ``torch.distributed`` functions on a device group of the library's backend, which needs
the chip. :class:`ProcessGroupDouble` stands in for those functions: it runs them on the gloo
group the test ranks share (CPU tensors stand for device tensors) and first refuses, with a
:class:`~sglang_fl.testing.doubles.ConstraintViolation`, every call the real library's process
group refuses. What is refused is the subclass's: it declares each rule below as a
:class:`~sglang_fl.testing.doubles.Constraint` naming its source (the library's docs, the
process group's C++ checks), and its ``BACKEND`` and ``DTYPES``.

In the spawned ranks of :func:`~sglang_fl.testing.collectives.run_collective_checks`, put the
double in place with ``prepare="my_double_module:install"``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, TypeVar

import torch

from .doubles import Constraint, SdkDouble, constraint_tests

__all__ = ["ProcessGroupDouble", "process_group_double_tests", "world_of_one"]


class ProcessGroupDouble(SdkDouble):
    """``torch.distributed``'s collective functions for one library, checked, over gloo.

    Subclasses set ``BACKEND`` (what ``get_backend`` reports for the library's groups),
    ``DTYPES`` and these constraints: ``DTYPE``, ``CONTIGUOUS``, ``DEVICE`` (tensors on the
    rank's device: ``device`` here), ``SAME_DTYPE`` (output and input), ``GATHER_SIZE``
    (all-gather output = world size x input), ``SCATTER_SIZE`` (reduce-scatter input = world
    size x output), ``ALL_TO_ALL_SIZE`` (equal splits: same numel, divisible by world size).
    A library whose reductions take fewer dtypes than it moves also sets ``REDUCE_DTYPE``
    (checked by the reductions after ``DTYPE``) and overrides :meth:`reduce_dtypes`; one whose
    moved dtypes depend on the emulated release or device overrides :meth:`moved_dtypes`.
    """

    BACKEND: ClassVar[str]
    DTYPES: ClassVar[frozenset[torch.dtype]]
    DTYPE: ClassVar[Constraint]
    CONTIGUOUS: ClassVar[Constraint]
    DEVICE: ClassVar[Constraint]
    SAME_DTYPE: ClassVar[Constraint]
    GATHER_SIZE: ClassVar[Constraint]
    SCATTER_SIZE: ClassVar[Constraint]
    ALL_TO_ALL_SIZE: ClassVar[Constraint]
    REDUCE_DTYPE: ClassVar[Constraint | None] = None
    # The list forms' shapes are checked by torch.distributed itself, before any backend.
    GATHER_LIST: ClassVar[Constraint] = Constraint(
        "gather",
        "a gather_list of one tensor per rank, each shaped like the input, on the dst rank only",
        "torch/distributed/distributed_c10d.py, gather: _validate_output_list_for_rank; the "
        "backends' gather (ProcessGroupNCCL.cpp, ProcessGroupHCCL.cpp) check each output's size",
    )
    SCATTER_LIST: ClassVar[Constraint] = Constraint(
        "reduce_scatter",
        "an input_list of one tensor per rank, each shaped like the output",
        "torch/distributed/distributed_c10d.py, reduce_scatter (input_list of world size); the "
        "backends' reduce_scatter (ProcessGroupNCCL.cpp, ProcessGroupHCCL.cpp) check the sizes",
    )

    def __init__(self, device: torch.device | None = None) -> None:
        super().__init__("torch.distributed")
        self.device = device or torch.device("cpu")

    @staticmethod
    def _gloo() -> Any:
        import torch.distributed as dist

        return dist

    def _check(self, *tensors: torch.Tensor) -> None:
        for tensor in tensors:
            self.DTYPE.check(tensor.dtype in self.moved_dtypes(), str(tensor.dtype))
            self.CONTIGUOUS.check(tensor.is_contiguous(), f"strides {tensor.stride()}")
            self.DEVICE.check(tensor.device == self.device, str(tensor.device))

    def _pair(self, output: torch.Tensor, input: torch.Tensor) -> None:
        self._check(output, input)
        self.SAME_DTYPE.check(output.dtype == input.dtype, f"{output.dtype} and {input.dtype}")

    def moved_dtypes(self) -> frozenset[torch.dtype]:
        """The dtypes the library moves on the emulated release and device (``DTYPES``)."""
        return self.DTYPES

    def reduce_dtypes(self) -> frozenset[torch.dtype]:
        """The dtypes the library's reductions take on the emulated device (all it moves,
        unless a subclass with a ``REDUCE_DTYPE`` rule says fewer)."""
        return self.moved_dtypes()

    def _reduced(self, *tensors: torch.Tensor) -> None:
        """A reduction's extra rule: its dtypes (after the checks every collective makes)."""
        if self.REDUCE_DTYPE is None:
            return
        allowed = self.reduce_dtypes()
        for tensor in tensors:
            self.REDUCE_DTYPE.check(tensor.dtype in allowed, str(tensor.dtype))

    def get_backend(self, group: Any = None) -> str:
        self.record("get_backend", group)
        return self.BACKEND

    def all_reduce(self, tensor: torch.Tensor, group: Any = None) -> None:
        self.record("all_reduce", tensor, group=group)
        self._check(tensor)
        self._reduced(tensor)
        self._gloo().all_reduce(tensor, group=group)

    def all_gather_into_tensor(
        self, output: torch.Tensor, input: torch.Tensor, group: Any = None
    ) -> None:
        self.record("all_gather_into_tensor", output, input, group=group)
        self._pair(output, input)
        n = self._gloo().get_world_size(group)
        self.GATHER_SIZE.check(
            output.numel() == n * input.numel(), f"{output.numel()} vs {n} x {input.numel()}"
        )
        dist = self._gloo()
        gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
        gather(_wire(output), _wire(input), group=group)

    def reduce_scatter_tensor(
        self, output: torch.Tensor, input: torch.Tensor, group: Any = None
    ) -> None:
        self.record("reduce_scatter_tensor", output, input, group=group)
        self._pair(output, input)
        self._reduced(output, input)
        n = self._gloo().get_world_size(group)
        self.SCATTER_SIZE.check(
            input.numel() == n * output.numel(), f"{input.numel()} vs {n} x {output.numel()}"
        )
        dist = self._gloo()
        scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
        scatter(output, input, group=group)

    # torch 2.14's names for the two (torch.distributed keeps both; the adapters prefer these).
    all_gather_single = all_gather_into_tensor
    reduce_scatter_single = reduce_scatter_tensor

    def reduce_scatter(
        self, output: torch.Tensor, input_list: list[torch.Tensor], group: Any = None
    ) -> None:
        self.record("reduce_scatter", output, input_list, group=group)
        for input in input_list:
            self._pair(output, input)
            self._reduced(output, input)
        n = self._gloo().get_world_size(group)
        self.SCATTER_LIST.check(
            len(input_list) == n and all(t.shape == output.shape for t in input_list),
            f"{[tuple(t.shape) for t in input_list]} for {n} ranks of {tuple(output.shape)}",
        )
        self._gloo().reduce_scatter(output, input_list, group=group)

    def gather(
        self,
        tensor: torch.Tensor,
        gather_list: list[torch.Tensor] | None = None,
        dst: int = 0,
        group: Any = None,
    ) -> None:
        self.record("gather", tensor, gather_list, dst=dst, group=group)
        self._check(tensor)
        dist = self._gloo()
        if gather_list is not None:
            for part in gather_list:
                self._pair(part, tensor)
        mine = dist.get_rank() == dst  # dst is a global rank, as torch.distributed.gather takes
        self.GATHER_LIST.check(
            (gather_list is not None) == mine, f"gather_list {gather_list is not None} on dst {dst}"
        )
        if gather_list is not None:
            n = dist.get_world_size(group)
            self.GATHER_LIST.check(
                len(gather_list) == n and all(t.shape == tensor.shape for t in gather_list),
                f"{[tuple(t.shape) for t in gather_list]} for {n} ranks of {tuple(tensor.shape)}",
            )
        parts = [_wire(part) for part in gather_list] if gather_list is not None else None
        dist.gather(_wire(tensor), parts, dst=dst, group=group)

    def broadcast(self, tensor: torch.Tensor, src: int, group: Any = None) -> None:
        self.record("broadcast", tensor, src=src, group=group)
        self._check(tensor)
        self._gloo().broadcast(_wire(tensor), src=src, group=group)

    def send(self, tensor: torch.Tensor, dst: int, group: Any = None) -> None:
        self.record("send", tensor, dst, group)
        self._check(tensor)
        self._gloo().send(_wire(tensor), dst, group)

    def recv(self, tensor: torch.Tensor, src: int, group: Any = None) -> None:
        self.record("recv", tensor, src, group)
        self._check(tensor)
        self._gloo().recv(_wire(tensor), src, group)

    def all_to_all_single(
        self, output: torch.Tensor, input: torch.Tensor, group: Any = None
    ) -> None:
        self.record("all_to_all_single", output, input, group=group)
        self._pair(output, input)
        n = self._gloo().get_world_size(group)
        self.ALL_TO_ALL_SIZE.check(
            output.numel() == input.numel() and input.numel() % n == 0,
            f"{input.numel()} in, {output.numel()} out, {n} ranks",
        )
        self._gloo().all_to_all_single(_wire(output), _wire(input), group=group)


# Moving data copies bits: dtypes gloo cannot carry (float8) travel as bytes of the same size.
_AS_BYTES = frozenset({torch.float8_e4m3fn, torch.float8_e5m2})


def _wire(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as gloo carries it: a ``uint8`` view of a float8 tensor, else itself."""
    return tensor.view(torch.uint8) if tensor.dtype in _AS_BYTES else tensor


@contextmanager
def world_of_one() -> Iterator[None]:
    """A one-rank gloo world in this process while the block runs (destroyed after)."""
    import torch.distributed as dist

    with tempfile.TemporaryDirectory(prefix="sglang-fl-world-") as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


PgDoubleT = TypeVar("PgDoubleT", bound=ProcessGroupDouble)


def process_group_double_tests(
    make_double: Callable[[], PgDoubleT],
    valid: Sequence[Callable[[PgDoubleT], object]] = (),
    rejected: Mapping[Constraint, Callable[[PgDoubleT], object]] | None = None,
) -> tuple[Callable[..., None], Callable[..., None], Callable[..., None]]:
    """:func:`~sglang_fl.testing.doubles.constraint_tests` for a :class:`ProcessGroupDouble`:
    valid calls of every function, and one call per constraint valid but for it, each in a
    one-rank gloo world (``REDUCE_DTYPE`` included when the double declares it). ``valid`` and
    ``rejected`` add the calls of a library's own functions and constraints (run in that
    world too). Bind the three to ``test_*`` names in a vendor's test module."""
    cls = type(make_double())

    def within(call: Callable[[PgDoubleT], object]) -> Callable[[PgDoubleT], object]:
        def run(double: PgDoubleT) -> object:
            with world_of_one():
                return call(double)

        return run

    def z(*shape: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=device)

    calls: list[Callable[[PgDoubleT], object]] = [
        within(lambda d: d.get_backend()),
        within(lambda d: d.all_reduce(z(2, 3, dtype=torch.bfloat16))),
        within(lambda d: d.all_gather_into_tensor(z(4), z(4))),
        within(lambda d: d.all_gather_single(z(0, 8), z(0, 8))),
        within(
            lambda d: d.reduce_scatter_tensor(z(4, dtype=torch.float16), z(4, dtype=torch.float16))
        ),
        within(lambda d: d.reduce_scatter(z(2, 3), [z(2, 3)])),
        within(lambda d: d.broadcast(z(3), 0)),
        within(lambda d: d.gather(z(3), [z(3)], 0)),
        within(lambda d: d.all_to_all_single(z(6), z(6))),
        *(within(call) for call in valid),
    ]
    refused: dict[Constraint, Callable[[PgDoubleT], object]] = {
        cls.DTYPE: within(lambda d: d.all_reduce(z(2, dtype=torch.complex64))),
        cls.CONTIGUOUS: within(lambda d: d.broadcast(z(4, 4)[:, ::2], 0)),
        cls.DEVICE: within(lambda d: d.all_reduce(z(2, device="meta"))),
        cls.SAME_DTYPE: within(lambda d: d.all_gather_into_tensor(z(4, dtype=torch.float16), z(4))),
        cls.GATHER_SIZE: within(lambda d: d.all_gather_into_tensor(z(3), z(2))),
        cls.SCATTER_SIZE: within(lambda d: d.reduce_scatter_tensor(z(2), z(3))),
        cls.ALL_TO_ALL_SIZE: within(lambda d: d.all_to_all_single(z(2), z(3))),
        cls.GATHER_LIST: within(lambda d: d.gather(z(3), [z(3), z(3)], 0)),
        cls.SCATTER_LIST: within(lambda d: d.reduce_scatter(z(2), [z(2), z(2)])),
    }
    if cls.REDUCE_DTYPE is not None:
        double = make_double()
        moved_only = sorted(double.moved_dtypes() - double.reduce_dtypes(), key=str)
        if not moved_only:
            raise ValueError(f"{cls.__name__}: REDUCE_DTYPE without a dtype it moves only")
        refused[cls.REDUCE_DTYPE] = within(lambda d: d.all_reduce(z(2, dtype=moved_only[0])))
    refused.update({constraint: within(call) for constraint, call in (rejected or {}).items()})
    return constraint_tests(make_double, calls, refused)
