"""Resolution: from candidates to one bound callable and the decision record explaining it.

Everything here runs once per op per process. The callable handed out is bound by the
fallback binder (:class:`~sglang_fl.dispatch.binder.FallbackChain`): the chosen implementation
itself, or, when a fallback exists, one closure that only catches
:class:`~sglang_fl.errors.Unsupported`; no registry, policy or pluggy call per tensor call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .._strenum import StrEnum
from ..errors import NoImplementationError, StrictModeError
from ..schema import CandidateJson, DecisionJson, provenance_fields
from .availability import AvailabilityCache
from .binder import DeclineSink, FallbackChain, FirstCallSink
from .policy import OrderPlan, SelectionPolicy
from .registry import OpRegistry
from .types import Availability, OpImpl

__all__ = [
    "CandidateOutcome",
    "CandidateVerdict",
    "Decision",
    "Resolution",
    "resolve",
    "resolve_among",
]

_log = logging.getLogger(__name__)


class CandidateOutcome(StrEnum):
    """A candidate's fate in a decision."""

    CHOSEN = "chosen"  # runs the op
    FALLBACK = "fallback"  # usable; gets a call the chosen one declines with Unsupported
    REJECTED = "rejected"  # never runs here (vendor list, order, availability)


@dataclass(frozen=True)
class CandidateVerdict:
    """One candidate's fate: chosen, kept as fallback (and why it lost), or rejected (why)."""

    impl: OpImpl
    outcome: CandidateOutcome
    reason: str
    availability: Availability | None = None

    def to_dict(self) -> CandidateJson:
        impl = self.impl
        return {
            "impl_id": impl.impl_id,
            "kind": impl.kind,
            "vendor": impl.vendor,
            "priority": int(impl.priority),
            **provenance_fields(impl.provenance),
            "available": None if self.availability is None else self.availability.available,
            "availability_reason": None if self.availability is None else self.availability.reason,
            "outcome": self.outcome,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Decision:
    """Why ``chosen`` runs ``op``: the order applied and every candidate's verdict."""

    op: str
    order: tuple[str, ...]
    order_source: str
    candidates: tuple[CandidateVerdict, ...]

    @property
    def chosen(self) -> OpImpl:
        """The implementation that runs; a decision carried by an error has none."""
        for verdict in self.candidates:
            if verdict.outcome is CandidateOutcome.CHOSEN:
                return verdict.impl
        raise LookupError(f"op {self.op!r} has no usable implementation")

    @property
    def fallbacks(self) -> tuple[OpImpl, ...]:
        return tuple(c.impl for c in self.candidates if c.outcome is CandidateOutcome.FALLBACK)

    def to_dict(self) -> DecisionJson:
        chosen = next(
            (c.impl.impl_id for c in self.candidates if c.outcome is CandidateOutcome.CHOSEN),
            None,
        )
        return {
            "op": self.op,
            "chosen": chosen,
            "order": list(self.order),
            "order_source": self.order_source,
            "candidates": [c.to_dict() for c in self.candidates],
        }


@dataclass(frozen=True)
class Resolution:
    """The callable to bind (standard signature) and the decision behind it.

    ``chain`` is what ``fn`` calls, in order: the chosen implementation, then each fallback a
    call it declines with :class:`~sglang_fl.errors.Unsupported` is handed to (the chosen one
    alone under ``SGLANG_FL_STRICT``, ``strict``: its decline is then a
    :class:`~sglang_fl.errors.StrictModeError`). ``fn`` logs each first decline; a caller
    that also reports declines binds its own chain with :meth:`bind`.
    """

    op: str
    fn: Callable[..., Any]
    decision: Decision
    chain: tuple[OpImpl, ...] = ()
    strict: bool = False

    def bind(
        self,
        on_decline: DeclineSink | None = None,
        on_first_call: FirstCallSink | None = None,
    ) -> FallbackChain:
        """A new binding of this decision's candidates, each first decline per implementation
        and reason also handed to ``on_decline`` (bind once per op and process, so that a
        report does not repeat itself), and the implementation that served its first call to
        ``on_first_call``."""
        ranked = (self.decision.chosen, *self.decision.fallbacks)
        return FallbackChain(
            self.op,
            ranked,
            strict=self.strict,
            on_decline=on_decline,
            on_first_call=on_first_call,
        )


@dataclass(frozen=True)
class _Survivor:
    """A candidate that passed the vendor lists, the order and its availability probe."""

    rank: int  # position of the first order token it matches
    impl: OpImpl
    availability: Availability

    @property
    def sort_key(self) -> tuple[int, int, str]:
        """Earlier in the order, then higher priority, then impl_id."""
        return self.rank, -int(self.impl.priority), self.impl.impl_id


def resolve(
    op_name: str,
    registry: OpRegistry,
    policy: SelectionPolicy,
    availability: AvailabilityCache,
) -> Resolution:
    """Choose the implementation of ``op_name``; raises :class:`NoImplementationError`."""
    return resolve_among(op_name, registry.implementations(op_name), policy, availability)


def resolve_among(
    op_name: str,
    candidates: Iterable[OpImpl],
    policy: SelectionPolicy,
    availability: AvailabilityCache,
) -> Resolution:
    """:func:`resolve` over given candidates: a selection whose candidates are not registered
    kernels (:data:`sglang_fl.ops.SELECTIONS`) goes through the same policy."""
    plan = policy.plan(op_name)
    rejected: list[CandidateVerdict] = []
    survivors: list[_Survivor] = []
    for impl in candidates:
        refusal = policy.vendor_refusal(impl)
        if refusal is not None:
            rejected.append(CandidateVerdict(impl, CandidateOutcome.REJECTED, refusal))
            continue
        rank = plan.rank(impl)
        if rank is None:
            why = f"matches no token of the order [{', '.join(plan.texts())}]"
            rejected.append(CandidateVerdict(impl, CandidateOutcome.REJECTED, why))
            continue
        state = availability.check(impl)
        if not state.available:
            why = f"unavailable: {state.reason}"
            rejected.append(CandidateVerdict(impl, CandidateOutcome.REJECTED, why, state))
            continue
        survivors.append(_Survivor(rank, impl, state))

    if not survivors:
        details = "; ".join(f"{v.impl.impl_id}: {v.reason}" for v in rejected) or "none registered"
        raise NoImplementationError(
            f"no usable implementation of op {op_name!r} ({details})",
            Decision(op_name, plan.texts(), plan.source, tuple(rejected)),
        )

    survivors.sort(key=lambda survivor: survivor.sort_key)
    best = survivors[0]
    _check_explicit_choice(plan, policy.settings.strict, rejected, best)
    ranked = [
        CandidateVerdict(
            best.impl, CandidateOutcome.CHOSEN, _chosen_reason(plan, best.rank), best.availability
        )
    ]
    ranked.extend(
        CandidateVerdict(
            other.impl,
            CandidateOutcome.FALLBACK,
            _fallback_reason(plan, best, other),
            other.availability,
        )
        for other in survivors[1:]
    )
    decision = Decision(
        op=op_name,
        order=plan.texts(),
        order_source=plan.source,
        candidates=(*ranked, *rejected),
    )
    strict = policy.settings.strict
    bound = FallbackChain(op_name, [verdict.impl for verdict in ranked], strict=strict)
    return Resolution(op_name, bound.fn, decision, bound.impls, strict)


def _chosen_reason(plan: OrderPlan, rank: int) -> str:
    token = plan.tokens[rank]
    return f"first available candidate: matches {token} (position {rank + 1} of the order)"


def _fallback_reason(plan: OrderPlan, best: _Survivor, other: _Survivor) -> str:
    """Why ``other`` lost to ``best``: the order, then the priority, then the impl_id."""
    chosen = best.impl.impl_id
    if other.rank != best.rank:
        return (
            f"lower in the order: matches {plan.tokens[other.rank]} (position {other.rank + 1}), "
            f"{chosen} matches {plan.tokens[best.rank]} (position {best.rank + 1})"
        )
    priority, best_priority = int(other.impl.priority), int(best.impl.priority)
    if priority != best_priority:
        return f"lower priority: {priority} < {best_priority} of {chosen}"
    return f"same order and priority as {chosen}; impl_id sorts after"


def _check_explicit_choice(
    plan: OrderPlan, strict: bool, rejected: list[CandidateVerdict], best: _Survivor
) -> None:
    """An explicit choice that fell through to a later token: an error under STRICT, else a
    warning (once per op, since resolutions are cached)."""
    if not plan.explicit or best.rank == 0:
        return
    reasons = [f"{v.impl.impl_id}: {v.reason}" for v in rejected if plan.rank(v.impl) == 0]
    detail = "; ".join(reasons) if reasons else "no implementation matches it"
    message = (
        f"op {plan.op!r} was asked to use {plan.tokens[0]} ({plan.source}) but cannot ({detail})"
    )
    if strict:
        raise StrictModeError(f"SGLANG_FL_STRICT=1: {message}")
    _log.warning(
        "%s; using %s instead (SGLANG_FL_STRICT=1 makes this an error)", message, best.impl.impl_id
    )
