"""The conformance kit's checks of planned ops (the attention ops): plans and per-layer calls.

An attention implementation plans once per forward and then runs every layer from the plan
(:mod:`sglang_fl.ops.attention.plan`). Beyond values, the kit checks what makes that work:

- the plan: an :class:`~sglang_fl.ops.attention.plan.AttentionPlan` whose default fields hold
  what the default planner computes (the reference and verify mode read them);
- graph-mode plans: allocated once, then updated in place for one batch and the next, the
  per-layer call gives the next batch's result from tensors whose storage never moved (what a
  captured or compiled step keeps reading);
- no host read in a per-layer call: the call runs on fake tensors for ``q``, the caches and the
  plan's device fields (its host fields stay real), where ``.item()``, ``.tolist()``,
  ``int()``, ``.numpy()`` or a data-dependent shape of a device value raise; a kernel that
  cannot run on fake tensors at all (a C extension without a fake implementation) is run for
  real under a dispatch mode that fails any scalar read of a tensor that is not a host field.
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)
from torch.utils._python_dispatch import TorchDispatchMode

from ..dispatch.types import OpImpl
from ..errors import Unsupported
from ..ops import OpContract, OpInputs
from ..ops.attention.plan import (
    AttentionBatch,
    AttentionPlan,
    AttentionPlanner,
    ForwardKind,
    GraphMode,
    PlanCapacity,
    plan_fields,
)

__all__ = [
    "HostRead",
    "host_read",
    "plan_problems",
    "planner_of",
]

# Ops whose results a host read takes: a device value copied to a Python scalar, or an output
# whose shape depends on values (the host waits for them).
_SCALAR_READS = frozenset({"aten._local_scalar_dense.default", "aten.item.default"})
_VALUE_SHAPED = frozenset(
    {
        "aten.nonzero.default",
        "aten.masked_select.default",
        "aten.unique_consecutive.default",
        "aten._unique2.default",
        "aten.repeat_interleave.Tensor",
    }
)


def planner_of(impl: OpImpl, contract: OpContract) -> AttentionPlanner:
    """The implementation's planner (the registry fills the default in; a hand-made
    :class:`OpImpl` without one gets it here)."""
    assert contract.plan_stage is not None
    planner: AttentionPlanner = impl.planner or contract.plan_stage.default_planner
    return planner


# -- no host read in a per-layer call --------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HostRead:
    """A per-layer call's read of a device value on the host, and where it happened."""

    what: str
    where: str

    def __str__(self) -> str:
        return f"{self.what} at {self.where}"


def host_read(fn: Callable[..., Any], obj: Any, args: tuple[Any, ...]) -> HostRead | None:
    """The first host read of a device value in ``fn(obj, *args)``, or ``None``.

    ``args`` end with the plan; its host fields are the only tensors whose values the call may
    read. Declining (:class:`~sglang_fl.Unsupported`) reads nothing.
    """
    *tensors, plan = args
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake_args = (*(_fake(mode, value) for value in tensors), _fake_plan(mode, plan))
    try:
        with mode:
            fn(obj, *fake_args)
    except Unsupported:
        return None
    except (DataDependentOutputException, DynamicOutputShapeException) as exc:
        return HostRead(_describe_fake(exc), _where(exc))
    except Exception as exc:
        if ".numpy()" in str(exc):
            return HostRead("a .numpy() of a device tensor", _where(exc))
        # A kernel that cannot run on fake tensors: run it for real, watching every read.
        return _watched(fn, obj, args)
    return None


def _fake(mode: FakeTensorMode, value: Any) -> Any:
    return mode.from_tensor(value) if isinstance(value, torch.Tensor) else value


def _fake_plan(mode: FakeTensorMode, plan: AttentionPlan) -> AttentionPlan:
    """``plan`` with its device tensors fake, its host tensors and plain values as they are."""
    device: dict[str, Any] = {
        name: mode.from_tensor(value)
        for name, value, on_host in plan_fields(plan)
        if isinstance(value, torch.Tensor) and not on_host
    }
    return dataclasses.replace(plan, **device)


def _describe_fake(exc: Exception) -> str:
    if isinstance(exc, DynamicOutputShapeException):
        return f"an output shaped by device values ({exc})"
    return f"a device value read as a Python scalar ({exc}: .item(), .tolist(), int(), bool())"


def _where(exc: BaseException) -> str:
    """The innermost frame of the traceback outside torch: the implementation's line."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/torch/" not in f.filename]
    if not frames:
        return "an unknown place"
    last = frames[-1]
    return f"{last.filename}:{last.lineno} ({last.line})"


class _ReadWatch(TorchDispatchMode):
    """Records the first read of a tensor's value on the host, unless it is a host field's."""

    def __init__(self, host_storages: set[int]) -> None:
        super().__init__()
        self.host = host_storages
        self.read: HostRead | None = None

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        name = str(func)
        if self.read is None and (name in _SCALAR_READS or name in _VALUE_SHAPED):
            sources = [a for a in args if isinstance(a, torch.Tensor)]
            if any(t.untyped_storage().data_ptr() not in self.host for t in sources):
                where = "".join(traceback.format_stack(limit=8)[:-2][-1:]).strip()
                self.read = HostRead(f"{name} of a device tensor", where)
        return func(*args, **(kwargs or {}))


def _watched(fn: Callable[..., Any], obj: Any, args: tuple[Any, ...]) -> HostRead | None:
    plan = args[-1]
    host = {
        value.untyped_storage().data_ptr()
        for _, value, on_host in plan_fields(plan)
        if on_host and isinstance(value, torch.Tensor)
    }
    watch = _ReadWatch(host)
    try:
        with watch:
            fn(obj, *args)
    except Unsupported:
        return None
    return watch.read


# -- the plan itself ---------------------------------------------------------------------------


def plan_problems(impl: OpImpl, contract: OpContract, inputs: OpInputs) -> Iterator[str]:
    """What is wrong with ``impl``'s planner on one case: its eager plan against the default
    plan, and, when it claims a graph mode, its in-place graph-mode plan."""
    stage = contract.plan_stage
    assert stage is not None
    assert isinstance(inputs.batch, AttentionBatch)
    planner = planner_of(impl, contract)
    batch = inputs.batch
    plan: object = planner.plan(batch)
    if not isinstance(plan, AttentionPlan):
        yield f"plan() returned {type(plan).__name__}, not an AttentionPlan (or a subclass)"
        return
    yield from _default_fields_problems(plan, stage.default_planner.plan(batch), "plan()")
    claimed = [mode for mode in GraphMode if planner.graph_problem(mode) is None]
    if not claimed or batch.kind is not ForwardKind.DECODE:
        return
    yield from _graph_plan_problems(impl, planner, contract, inputs, claimed)


def _default_fields_problems(
    plan: AttentionPlan, want: AttentionPlan, made_by: str, rows: int | None = None
) -> Iterator[str]:
    """The default fields of ``plan`` against the default planner's (``page_table`` compared
    over the pages a request holds: the rest is never read)."""
    for name, expected, _ in plan_fields(want):
        got = getattr(plan, name)
        if name == "req_to_token":
            if got is not expected and not torch.equal(got, expected):
                yield f"{made_by}: req_to_token is not the batch's request table"
            continue
        if name == "page_table" and isinstance(got, torch.Tensor):
            yield from _page_table_problems(got, expected, want, made_by)
            continue
        if name in ("max_seqlen_k",) and isinstance(got, int):
            if got < expected:
                yield f"{made_by}: max_seqlen_k {got} is below the longest request ({expected})"
            continue
        if name == "max_seqlen_q" and made_by != "plan()":
            continue  # a graph-mode plan's is its capacity's
        if not _same(got, expected):
            yield (
                f"{made_by}: field {name} is {_show(got)}, the default planner's is "
                f"{_show(expected)}"
            )


def _page_table_problems(
    got: torch.Tensor, expected: torch.Tensor, want: AttentionPlan, made_by: str
) -> Iterator[str]:
    if got.dtype != torch.int32 or got.shape[0] != expected.shape[0]:
        yield f"{made_by}: page_table is {_show(got)}, expected [batch, pages] int32"
        return
    for row, length in enumerate(want.seq_lens_host.tolist()):
        pages = -(-length // want.page_size)
        if got.shape[1] < pages or not torch.equal(
            got[row, :pages].cpu(), expected[row, :pages].cpu()
        ):
            yield f"{made_by}: page_table row {row} does not list the request's {pages} pages"
            return


def _same(got: Any, expected: Any) -> bool:
    if isinstance(expected, torch.Tensor):
        return (
            isinstance(got, torch.Tensor)
            and got.dtype == expected.dtype
            and got.shape == expected.shape
            and torch.equal(got.cpu(), expected.cpu())
        )
    return bool(got == expected)


def _show(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        shown = value.tolist() if value.numel() <= 16 else f"{value.numel()} elements"
        return f"{list(value.shape)} {str(value.dtype).removeprefix('torch.')} {shown}"
    return repr(value)


def _graph_plan_problems(
    impl: OpImpl,
    planner: AttentionPlanner,
    contract: OpContract,
    inputs: OpInputs,
    claimed: list[GraphMode],
) -> Iterator[str]:
    """A graph-mode plan updated for a decoy batch, then in place for the case's: the call
    gives the case's result, from the same storages."""
    batch = inputs.batch
    capacity = PlanCapacity(
        kind=batch.kind,
        max_batch=batch.batch_size + 2,
        max_tokens=batch.batch_size + 2,
        max_context=batch.req_to_token.shape[1],
        page_size=batch.page_size,
        device=batch.device,
    )
    what = f"graph-mode plan (claimed for {', '.join(claimed)})"
    buffers = planner.allocate(capacity)
    decoy = _decoy(batch)
    first = planner.update(buffers, decoy)
    planner.record(first, decoy)
    storages = _storages(first)
    plan = planner.update(buffers, batch)
    planner.record(plan, batch)
    moved = [name for name, ptr in _storages(plan).items() if storages.get(name) != ptr]
    if moved:
        yield (
            f"{what}: update() moved {', '.join(moved)} to new storage; a captured or compiled "
            "step keeps reading the old one (write the buffers from allocate() in place)"
        )
    stage = contract.plan_stage
    assert stage is not None
    yield from _default_fields_problems(plan, stage.default_planner.plan(batch), what)
    *tensors, _ = inputs.args
    try:
        got = impl.fn(inputs.obj, *tensors, plan)
    except Unsupported:
        return
    want = contract.reference(inputs.obj, *inputs.args)
    tolerance = contract.tolerance(want.dtype)
    if got.shape != want.shape or not torch.allclose(
        got.float().cpu(), want.float().cpu(), atol=tolerance.atol, rtol=tolerance.rtol
    ):
        yield f"{what}: the call on the updated plan does not give the batch's result"


def _decoy(batch: AttentionBatch) -> AttentionBatch:
    """Another decode batch of the same size over the same pool: the requests reversed."""
    order = torch.arange(batch.batch_size - 1, -1, -1)
    return AttentionBatch.decode(
        batch.req_to_token,
        batch.req_pool_indices[order.to(batch.device)],
        batch.seq_lens[order.to(batch.device)],
        batch.page_size,
        batch.seq_lens_host[order],
    )


def _storages(plan: AttentionPlan) -> Mapping[str, int]:
    return {
        name: value.untyped_storage().data_ptr()
        for name, value, _ in plan_fields(plan)
        if isinstance(value, torch.Tensor) and name != "req_to_token" and value.numel()
    }
