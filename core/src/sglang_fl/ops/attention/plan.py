"""The attention ops' plan stage: a forward's batch worked out once, before any layer runs.

Every fast attention library splits its work the same way: FlashInfer's wrappers ``plan`` a
batch (index pointers, a work schedule, read on the host) and then ``run`` each layer; FA3
builds its page table, cumulative lengths and scheduler metadata once; Ascend's fused
attention takes the lengths as host arrays (``actual_seq_lengths``). So do the attention ops.
Once per forward, the attention backend describes the batch (:class:`AttentionBatch`: request
rows, lengths with their host copies, page size) and asks each implementation's
:class:`AttentionPlanner` for its plan, an :class:`AttentionPlan`; reading lengths on the host
is allowed there. Per layer, ``decode_attention`` and ``extend_attention`` take that plan and
must not read a device value on the host (no ``.item()``, ``.tolist()``, ``.cpu()``, no
data-dependent shape): a pipeline stall per layer eagerly, an error under graph capture.

Graph modes (:class:`GraphMode`) replay one step many times. Their plans live in buffers
allocated once for the largest batch (:meth:`AttentionPlanner.allocate`) and updated in place
before each step (:meth:`~AttentionPlanner.update` on the host, :meth:`~AttentionPlanner.record`
on the device, recordable into a device graph), so a captured or compiled step sees the next
batch. A planner says which graph modes its plans and the per-layer calls reading them
support (:meth:`~AttentionPlanner.graph_problem`); the backend refuses a graph runner, with
that reason, before capture.

Every plan is an :class:`AttentionPlan`: a vendor's planner builds on :class:`DefaultPlanner`
and returns a subclass with its own fields (FA3's scheduler metadata, Ascend's host length
arrays, a FlashInfer wrapper), so the reference, verify mode and the conformance kit can read
any plan. Fields are tensors, with ``metadata=HOST`` when they live on the host, or plain
``int``/``float``/``bool`` values, which a graph mode treats as constants of the step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from ..._strenum import StrEnum

__all__ = [
    "DEFAULT_PLANNER",
    "DEFAULT_PLANNER_PROBLEMS",
    "HOST",
    "REFERENCE_PLANNER",
    "AttentionBatch",
    "AttentionPlan",
    "AttentionPlanner",
    "DefaultPlanner",
    "ForwardKind",
    "GraphMode",
    "PlanCapacity",
    "plan_fields",
]

# A plan field holding a host (CPU) tensor, e.g. lengths the planner read on the host:
# ``seq_lens_host: torch.Tensor = field(metadata=HOST)``.
_HOST_KEY = "sglang_fl_host"
HOST: Mapping[str, bool] = MappingProxyType({_HOST_KEY: True})


class ForwardKind(StrEnum):
    """Which attention op a forward runs: one new token per request, or a chunk of tokens."""

    DECODE = "decode"
    EXTEND = "extend"


class GraphMode(StrEnum):
    """How a graph runner replays a step; what it asks of a plan and the per-layer calls.

    - ``compiled``: ``torch.compile`` (SGLang's CPU graph runner). Each per-layer call is one
      opaque ``sglang_fl::<op>`` custom op, run afresh every step: it may read the plan's
      host tensors. The plan's shapes and plain values are constants of the compiled step: a
      change recompiles it, so they must come from the capacity, not the batch.
    - ``captured``: a device graph (CUDA graphs, NPU graphs) records the kernels one step
      launched and replays them: a per-layer call may read only the plan's device tensors and
      plain values, never a host tensor's values (a replay would reuse the capture's).
    """

    COMPILED = "compiled"
    CAPTURED = "captured"


def _host(tensor: torch.Tensor) -> torch.Tensor:
    """A host copy, never the tensor itself (a host field aliasing a device field on the CPU in
    one batch but not the next would make a compiled step recompile)."""
    return tensor.to("cpu", torch.int64, copy=True)


@dataclass(frozen=True)
class AttentionBatch:
    """One forward's batch as the attention ops see it: what a plan is made from.

    ``req_to_token`` ``[rows, context]`` is the pool's request table (see
    :mod:`sglang_fl.ops.attention.common`), ``req_pool_indices`` and ``seq_lens`` ``[batch]``
    the requests' rows and full lengths on the device, ``seq_lens_host`` the same lengths on
    the host (int64: an engine already has them, e.g. SGLang's ``seq_lens_cpu``). An extend
    batch also has each request's prefix and new-token counts, on both sides. In graph mode
    the batch is the runner's padded one (padding rows: length ``fill``, row 0).
    """

    kind: ForwardKind
    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_host: torch.Tensor
    page_size: int = 1
    extend_prefix_lens: torch.Tensor | None = None
    extend_seq_lens: torch.Tensor | None = None
    extend_prefix_lens_host: torch.Tensor | None = None
    extend_seq_lens_host: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError(f"page_size must be at least 1, got {self.page_size}")
        if self.seq_lens_host.device.type != "cpu":
            raise ValueError(f"seq_lens_host must be on the host, got {self.seq_lens_host.device}")
        if self.kind is ForwardKind.EXTEND and (
            self.extend_prefix_lens is None
            or self.extend_seq_lens is None
            or self.extend_prefix_lens_host is None
            or self.extend_seq_lens_host is None
        ):
            raise ValueError(
                "an extend batch needs extend_prefix_lens and extend_seq_lens, on the device "
                "and on the host"
            )

    @classmethod
    def decode(
        cls,
        req_to_token: torch.Tensor,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        page_size: int = 1,
        seq_lens_host: torch.Tensor | None = None,
    ) -> AttentionBatch:
        """A decode batch; ``seq_lens_host`` is copied from ``seq_lens`` when not given (one
        host read, here, once per forward)."""
        host = _host(seq_lens if seq_lens_host is None else seq_lens_host)
        return cls(ForwardKind.DECODE, req_to_token, req_pool_indices, seq_lens, host, page_size)

    @classmethod
    def extend(
        cls,
        req_to_token: torch.Tensor,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        extend_prefix_lens: torch.Tensor,
        extend_seq_lens: torch.Tensor,
        page_size: int = 1,
        *,
        seq_lens_host: torch.Tensor | None = None,
        extend_prefix_lens_host: torch.Tensor | None = None,
        extend_seq_lens_host: torch.Tensor | None = None,
    ) -> AttentionBatch:
        """An extend batch; host copies not given are read from the device ones, once."""
        return cls(
            ForwardKind.EXTEND,
            req_to_token,
            req_pool_indices,
            seq_lens,
            _host(seq_lens if seq_lens_host is None else seq_lens_host),
            page_size,
            extend_prefix_lens,
            extend_seq_lens,
            _host(
                extend_prefix_lens if extend_prefix_lens_host is None else extend_prefix_lens_host
            ),
            _host(extend_seq_lens if extend_seq_lens_host is None else extend_seq_lens_host),
        )

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens_host.shape[0])

    @property
    def num_tokens(self) -> int:
        """Query rows: one per request in decode, the new tokens in extend (host values)."""
        if self.kind is ForwardKind.DECODE:
            return self.batch_size
        assert self.extend_seq_lens_host is not None
        return int(self.extend_seq_lens_host.sum())

    @property
    def device(self) -> torch.device:
        return self.seq_lens.device


@dataclass(frozen=True)
class PlanCapacity:
    """The largest batch a graph-mode plan serves: its buffers are this big, made once.

    ``max_context`` is the longest sequence (the request table's width), ``page_size`` the
    pool's; a plan for this capacity has static shapes for every batch up to ``max_batch``
    requests (``max_tokens`` query rows).
    """

    kind: ForwardKind
    max_batch: int
    max_tokens: int
    max_context: int
    page_size: int
    device: torch.device

    @property
    def max_pages(self) -> int:
        return -(-self.max_context // self.page_size)


@dataclass(frozen=True)
class AttentionPlan:
    """The default plan: what paged attention kernels and the reference read per layer.

    Device tensors: the pool's ``req_to_token``; per request its row (``req_pool_indices``,
    int64), its full length (``seq_lens``, int64; ``cache_seqlens``, int32), its pages in
    token order (``page_table`` ``[batch, pages]`` int32, covering ``max_seqlen_k`` tokens:
    rows end in pages a kernel never reads) and, for the queries, the cumulative counts
    ``cu_seqlens_q`` ``[batch + 1]`` int32 (decode: ``0, 1, ..., batch``); extend adds the
    prefix and new-token counts. Host tensors (int64): the same lengths, read once by the
    planner. Plain values: ``page_size``, ``max_seqlen_q`` (1 in decode) and ``max_seqlen_k``.
    """

    page_size: int
    max_seqlen_q: int
    max_seqlen_k: int
    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    cache_seqlens: torch.Tensor
    page_table: torch.Tensor
    cu_seqlens_q: torch.Tensor
    seq_lens_host: torch.Tensor = field(metadata=HOST)
    extend_prefix_lens: torch.Tensor | None = None
    extend_seq_lens: torch.Tensor | None = None
    extend_prefix_lens_host: torch.Tensor | None = field(default=None, metadata=HOST)
    extend_seq_lens_host: torch.Tensor | None = field(default=None, metadata=HOST)

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens_host.shape[0])


def plan_fields(plan: AttentionPlan) -> Iterator[tuple[str, Any, bool]]:
    """``(name, value, on_host)`` for every field of ``plan``, in declaration order."""
    for spec in dataclasses.fields(plan):
        yield spec.name, getattr(plan, spec.name), bool(spec.metadata.get(_HOST_KEY))


# Why the default planner's plans are refused by a graph mode, when a vendor supplies none.
DEFAULT_PLANNER_PROBLEMS: Mapping[GraphMode, str] = MappingProxyType(
    {
        GraphMode.CAPTURED: "the implementation supplies no planner, so it declares nothing "
        "about device graphs: its per-layer calls may read the plan's host lengths, which a "
        "replay would take from the capture",
    }
)


class AttentionPlanner:
    """How one attention implementation plans a forward; ``OpImpl(..., planner=...)``.

    Subclass :class:`DefaultPlanner` (whose plans every reader understands) rather than this
    protocol. Methods run once per forward, never per layer; all but :meth:`record` may read
    the host. :meth:`graph_problem` says why a graph mode cannot replay this implementation
    (``None``: it can); the backend asks before it captures anything.
    """

    def plan(self, batch: AttentionBatch) -> AttentionPlan:
        """The plan of one eager forward; fresh tensors, shaped to this batch."""
        raise NotImplementedError

    def allocate(self, capacity: PlanCapacity) -> AttentionPlan:
        """A graph-mode plan for ``capacity``: every buffer allocated once, here."""
        raise NotImplementedError

    def update(self, plan: AttentionPlan, batch: AttentionBatch) -> AttentionPlan:
        """Before a graph step, outside any capture: write ``batch``'s host-side values into
        ``plan`` (from :meth:`allocate`) in place; returns the plan of ``batch``'s rows, whose
        tensors are views of ``plan``'s (same storage every step)."""
        raise NotImplementedError

    def record(self, plan: AttentionPlan, batch: AttentionBatch) -> None:
        """The device side of :meth:`update`, on the plan it returned: static shapes, no host
        read, so a device graph may record it and recompute it at every replay."""
        raise NotImplementedError

    def graph_problem(self, mode: GraphMode) -> str | None:
        """Why ``mode`` cannot replay this implementation's calls, or ``None``."""
        return f"{type(self).__qualname__} declares no graph support"


class DefaultPlanner(AttentionPlanner):
    """Plans :class:`AttentionPlan`; what an implementation without a planner gets.

    ``problems`` maps each graph mode this implementation cannot run under to the reason (the
    default: :data:`DEFAULT_PLANNER_PROBLEMS`); an implementation whose per-layer calls read
    only device fields and plain values passes ``problems={}``. Subclasses add fields by
    overriding :meth:`plan`, :meth:`allocate`, :meth:`update` and :meth:`record`, each calling
    this class's and extending its result (``dataclasses.replace`` into their own type).
    """

    def __init__(self, problems: Mapping[GraphMode, str] = DEFAULT_PLANNER_PROBLEMS) -> None:
        self.problems = MappingProxyType(dict(problems))

    def graph_problem(self, mode: GraphMode) -> str | None:
        return self.problems.get(mode)

    # -- eager ------------------------------------------------------------------------------

    def plan(self, batch: AttentionBatch) -> AttentionPlan:
        page = batch.page_size
        max_len = int(batch.seq_lens_host.max()) if batch.batch_size else 0
        pages = -(-max_len // page)
        rows = batch.req_pool_indices.to(torch.int64)
        table = batch.req_to_token[rows, : pages * page : page] // page
        if batch.kind is ForwardKind.DECODE:
            max_q = 1
            cu_q = torch.arange(batch.batch_size + 1, dtype=torch.int32, device=batch.device)
        else:
            assert batch.extend_seq_lens is not None
            assert batch.extend_seq_lens_host is not None
            max_q = int(batch.extend_seq_lens_host.max()) if batch.batch_size else 0
            cu_q = _cumulative(batch.extend_seq_lens)
        return AttentionPlan(
            page_size=page,
            max_seqlen_q=max_q,
            max_seqlen_k=pages * page,
            req_to_token=batch.req_to_token,
            req_pool_indices=rows,
            seq_lens=batch.seq_lens.to(torch.int64),
            cache_seqlens=batch.seq_lens.to(torch.int32),
            page_table=table.to(torch.int32).contiguous(),
            cu_seqlens_q=cu_q,
            seq_lens_host=batch.seq_lens_host,
            extend_prefix_lens=batch.extend_prefix_lens,
            extend_seq_lens=batch.extend_seq_lens,
            extend_prefix_lens_host=batch.extend_prefix_lens_host,
            extend_seq_lens_host=batch.extend_seq_lens_host,
        )

    # -- graph mode ---------------------------------------------------------------------------

    def allocate(self, capacity: PlanCapacity) -> AttentionPlan:
        if capacity.kind is not ForwardKind.DECODE:
            raise ValueError(
                "graph-mode plans are made for decode steps (a graph runner captures decode); "
                f"got {capacity.kind}"
            )
        rows, device = capacity.max_batch, capacity.device
        return AttentionPlan(
            page_size=capacity.page_size,
            max_seqlen_q=1,
            max_seqlen_k=capacity.max_pages * capacity.page_size,
            req_to_token=torch.zeros((0, 0), dtype=torch.int32, device=device),
            req_pool_indices=torch.zeros(rows, dtype=torch.int64, device=device),
            seq_lens=torch.zeros(rows, dtype=torch.int64, device=device),
            cache_seqlens=torch.zeros(rows, dtype=torch.int32, device=device),
            page_table=torch.zeros((rows, capacity.max_pages), dtype=torch.int32, device=device),
            cu_seqlens_q=torch.arange(rows + 1, dtype=torch.int32, device=device),
            seq_lens_host=torch.zeros(rows, dtype=torch.int64),
        )

    def update(self, plan: AttentionPlan, batch: AttentionBatch) -> AttentionPlan:
        capacity = plan.seq_lens_host.shape[0]
        if batch.kind is not ForwardKind.DECODE:
            raise ValueError(f"a graph-mode plan serves decode batches, not {batch.kind}")
        if batch.batch_size > capacity:
            raise ValueError(
                f"a batch of {batch.batch_size} requests exceeds the plan's capacity of "
                f"{capacity} (allocated for the graph runner's largest batch)"
            )
        if batch.page_size != plan.page_size:
            raise ValueError(
                f"the batch's page size {batch.page_size} is not the plan's {plan.page_size}"
            )
        width = plan.page_table.shape[1] * plan.page_size
        if batch.req_to_token.shape[1] > width:
            raise ValueError(
                f"the request table holds {batch.req_to_token.shape[1]} tokens per request, "
                f"more than the plan's capacity of {width}"
            )
        n = batch.batch_size
        plan.seq_lens_host[:n].copy_(batch.seq_lens_host)
        return dataclasses.replace(
            plan,
            req_to_token=batch.req_to_token,
            req_pool_indices=plan.req_pool_indices[:n],
            seq_lens=plan.seq_lens[:n],
            cache_seqlens=plan.cache_seqlens[:n],
            page_table=plan.page_table[:n],
            cu_seqlens_q=plan.cu_seqlens_q[: n + 1],
            seq_lens_host=plan.seq_lens_host[:n],
        )

    def record(self, plan: AttentionPlan, batch: AttentionBatch) -> None:
        page = plan.page_size
        plan.req_pool_indices.copy_(batch.req_pool_indices)
        plan.seq_lens.copy_(batch.seq_lens)
        plan.cache_seqlens.copy_(batch.seq_lens)
        starts = batch.req_to_token[plan.req_pool_indices, ::page]  # [n, pages of the table]
        plan.page_table[:, : starts.shape[1]].copy_(starts // page)


# What an implementation without a planner of its own gets.
DEFAULT_PLANNER = DefaultPlanner()

# The reference's plan: the default one. Its per-layer calls loop over the requests with the
# plan's host lengths (torch_native's numerics), which a compiled step re-runs but a device
# graph would replay with the capture's lengths.
REFERENCE_PLANNER = DefaultPlanner(
    {
        GraphMode.CAPTURED: "the reference attention loops over the requests with the plan's "
        "host lengths (torch_native's per-request SDPA): a device graph would replay the "
        "capture's lengths",
    }
)


def _cumulative(lengths: torch.Tensor) -> torch.Tensor:
    """int32 ``[0, l0, l0 + l1, ...]`` (device side: no host read)."""
    sums = torch.cumsum(lengths.to(torch.int64), dim=0).to(torch.int32)
    return torch.cat([sums.new_zeros(1), sums])
