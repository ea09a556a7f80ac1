"""The ``sglang_fl`` attention backend's plan stage: per forward, one plan per planner.

Every candidate of an attention op (the chosen implementation and the fallbacks that get the
calls it declines) plans with its own planner (``OpImpl.planner``); candidates whose planners
plan alike (the default planner, whatever graph modes it declares) share one plan. Per forward
:meth:`BackendPlans.plan` makes them from SGLang's ``ForwardBatch`` (host lengths from its
``seq_lens_cpu`` / ``extend_*_cpu`` where SGLang has them); per layer the chosen candidate
gets its plan as the op's ``plan`` argument and a fallback reads its own from the forward's
plans (:meth:`BackendPlans.chain`), so the chain stays one callable, which the custom op of
``torch.compile`` wraps whole.

In graph mode (SGLang's CPU graph runner, CUDA graphs) the plans live in buffers allocated
once (:meth:`BackendPlans.allocate`) and updated in place for every decode step: the host part
outside the capture (:meth:`BackendPlans.update`), the device part recordable
(:meth:`BackendPlans.record`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ...dispatch.binder import DeclineSink, FallbackChain
from ...dispatch.resolve import Resolution
from ...dispatch.types import OpImpl
from ...ops import get_contract
from ...ops.attention.plan import (
    AttentionBatch,
    AttentionPlan,
    AttentionPlanner,
    DefaultPlanner,
    ForwardKind,
    GraphMode,
    PlanCapacity,
)

__all__ = ["BackendPlans", "GraphPlans", "forward_batch_of", "planner_of"]

Plans = Mapping[object, AttentionPlan]


def planner_of(impl: OpImpl) -> AttentionPlanner:
    """``impl``'s planner (the registry gives every planned implementation one)."""
    stage = get_contract(impl.op_name).plan_stage
    assert stage is not None, f"{impl.op_name} has no plan stage"
    planner: AttentionPlanner = impl.planner or stage.default_planner
    return planner


def _key(planner: AttentionPlanner) -> object:
    """Planners whose plans are alike share one: every plain :class:`DefaultPlanner` (its
    declared graph modes do not change what it plans)."""
    return DefaultPlanner if type(planner) is DefaultPlanner else planner


def forward_batch_of(
    forward_batch: Any, req_to_token: torch.Tensor, page_size: int
) -> AttentionBatch:
    """The attention ops' description of SGLang's ``ForwardBatch``; host lengths are SGLang's
    own host copies where it keeps them (one copy from the device otherwise)."""
    host = getattr(forward_batch, "seq_lens_cpu", None)
    if forward_batch.forward_mode.is_decode_or_idle():
        return AttentionBatch.decode(
            req_to_token,
            forward_batch.req_pool_indices,
            forward_batch.seq_lens,
            page_size,
            host[: forward_batch.seq_lens.shape[0]] if host is not None else None,
        )
    prefix_host = getattr(forward_batch, "extend_prefix_lens_cpu", None)
    extend_host = getattr(forward_batch, "extend_seq_lens_cpu", None)
    return AttentionBatch.extend(
        req_to_token,
        forward_batch.req_pool_indices,
        forward_batch.seq_lens,
        forward_batch.extend_prefix_lens,
        forward_batch.extend_seq_lens,
        page_size,
        seq_lens_host=host,
        extend_prefix_lens_host=None if prefix_host is None else torch.tensor(prefix_host),
        extend_seq_lens_host=None if extend_host is None else torch.tensor(extend_host),
    )


@dataclass
class GraphPlans:
    """Graph-mode plan buffers: per plan key, the planner and what it allocated."""

    capacity: PlanCapacity
    buffers: dict[object, tuple[AttentionPlanner, AttentionPlan]]

    def serves(self, batch: AttentionBatch) -> bool:
        return batch.kind is ForwardKind.DECODE and batch.batch_size <= self.capacity.max_batch


class BackendPlans:
    """One attention backend's planners, per op, and the forward's current plans."""

    def __init__(self) -> None:
        self.planners: dict[ForwardKind, dict[object, AttentionPlanner]] = {}
        self.owners: dict[ForwardKind, dict[object, list[str]]] = {}  # key -> impl ids
        self.head: dict[ForwardKind, object] = {}
        self.current: dict[object, AttentionPlan] = {}
        self.graph: GraphPlans | None = None

    # -- binding, once per op ---------------------------------------------------------------

    def chain(
        self, kind: ForwardKind, resolution: Resolution, on_decline: DeclineSink
    ) -> FallbackChain:
        """The op's fallback chain over its candidates, each reading its own plan: the chosen
        one the plan it is called with, a fallback of another planner this forward's."""
        ranked = (resolution.decision.chosen, *resolution.decision.fallbacks)
        keyed = [(impl, planner_of(impl)) for impl in ranked]
        head = _key(keyed[0][1])
        wrapped = [impl if _key(p) is head else self._own_plan(impl, _key(p)) for impl, p in keyed]
        chain = FallbackChain(
            resolution.op, wrapped, strict=resolution.strict, on_decline=on_decline
        )
        kept = keyed[: len(chain.impls)]  # strict keeps the chosen one alone
        self.head[kind] = head
        self.planners[kind] = {_key(planner): planner for _, planner in kept}
        owners: dict[object, list[str]] = {}
        for impl, planner in kept:
            owners.setdefault(_key(planner), []).append(impl.impl_id)
        self.owners[kind] = owners
        return chain

    def _own_plan(self, impl: OpImpl, key: object) -> OpImpl:
        fn, current = impl.fn, self.current

        def with_own_plan(obj: Any, q: Any, k_cache: Any, v_cache: Any, plan: Any) -> Any:
            return fn(obj, q, k_cache, v_cache, current[key])

        with_own_plan.__name__ = with_own_plan.__qualname__ = getattr(fn, "__name__", "fn")
        return dataclasses.replace(impl, fn=with_own_plan)

    # -- per forward ----------------------------------------------------------------------------

    def plan(self, batch: AttentionBatch) -> AttentionPlan | None:
        """This forward's plans; returns the chosen implementation's (``None``: the op has no
        implementation bound)."""
        planners = self.planners.get(batch.kind)
        if planners is None:
            return None
        graph = self.graph
        self.current.clear()
        if graph is not None and graph.serves(batch):
            self.current.update(self.update(batch))
            self.record(batch)
        else:
            self.current.update({key: p.plan(batch) for key, p in planners.items()})
        return self.current[self.head[batch.kind]]

    def head_plan(self, kind: ForwardKind) -> AttentionPlan:
        return self.current[self.head[kind]]

    # -- graph mode -----------------------------------------------------------------------------

    def allocate(self, capacity: PlanCapacity) -> None:
        """Allocate the decode planners' buffers once, for the runner's largest batch."""
        planners = self.planners.get(ForwardKind.DECODE, {})
        self.graph = GraphPlans(
            capacity, {key: (p, p.allocate(capacity)) for key, p in planners.items()}
        )

    def update(self, batch: AttentionBatch) -> dict[object, AttentionPlan]:
        """The host side of a graph step's plans (outside any capture); they become current."""
        assert self.graph is not None
        plans = {key: p.update(buffers, batch) for key, (p, buffers) in self.graph.buffers.items()}
        self.current.clear()
        self.current.update(plans)
        return plans

    def record(self, batch: AttentionBatch) -> None:
        """The device side of the current graph-step plans: static shapes, no host read."""
        assert self.graph is not None
        for key, (planner, _) in self.graph.buffers.items():
            planner.record(self.current[key], batch)

    def problems(self, mode: GraphMode, kinds: Iterable[ForwardKind]) -> list[str]:
        """Why each planner of ``kinds`` cannot serve ``mode``, naming the implementation."""
        found = []
        for kind in kinds:
            for key, planner in self.planners.get(kind, {}).items():
                problem = planner.graph_problem(mode)
                if problem is not None:
                    who = ", ".join(self.owners[kind][key])
                    found.append(f"{who}: {problem}")
        return found
