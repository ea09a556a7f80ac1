"""Resolution: from candidates to one bound callable and the decision record explaining it.

Everything here runs once per op per process. The callable handed out is the chosen
implementation itself, or, when a fallback exists, one closure that only catches
:class:`~sglang_fl.errors.Unsupported`; no registry, policy or pluggy call per tensor call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import NoImplementationError, StrictModeError, Unsupported
from .availability import AvailabilityCache
from .policy import SelectionPolicy
from .registry import OpRegistry
from .types import Availability, OpImpl

__all__ = ["CandidateVerdict", "Decision", "Resolution", "resolve"]

_log = logging.getLogger(__name__)

CHOSEN = "chosen"
FALLBACK = "fallback"
REJECTED = "rejected"


@dataclass(frozen=True)
class CandidateVerdict:
    """One candidate's fate: chosen, kept as fallback (and why it lost), or rejected (why)."""

    impl: OpImpl
    outcome: str
    reason: str
    availability: Availability | None = None

    def to_dict(self) -> dict[str, Any]:
        impl = self.impl
        provenance = impl.provenance
        return {
            "impl_id": impl.impl_id,
            "kind": impl.kind.value,
            "vendor": impl.vendor,
            "priority": int(impl.priority),
            "plugin": provenance.plugin if provenance else None,
            "distribution": provenance.distribution if provenance else None,
            "version": provenance.version if provenance else None,
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
            if verdict.outcome == CHOSEN:
                return verdict.impl
        raise LookupError(f"op {self.op!r} has no usable implementation")

    @property
    def fallbacks(self) -> tuple[OpImpl, ...]:
        return tuple(c.impl for c in self.candidates if c.outcome == FALLBACK)

    def to_dict(self) -> dict[str, Any]:
        chosen = next((c.impl.impl_id for c in self.candidates if c.outcome == CHOSEN), None)
        return {
            "op": self.op,
            "chosen": chosen,
            "order": list(self.order),
            "order_source": self.order_source,
            "candidates": [c.to_dict() for c in self.candidates],
        }


@dataclass(frozen=True)
class Resolution:
    """The callable to bind (standard signature) and the decision behind it."""

    op: str
    fn: Callable[..., Any]
    decision: Decision


def resolve(
    op_name: str,
    registry: OpRegistry,
    policy: SelectionPolicy,
    availability: AvailabilityCache,
) -> Resolution:
    """Choose the implementation of ``op_name``; raises :class:`NoImplementationError`."""
    order = policy.order_for(op_name)
    verdicts: list[CandidateVerdict] = []
    survivors: list[tuple[int, int, str, OpImpl, Availability]] = []
    for impl in registry.implementations(op_name):
        refusal = policy.vendor_refusal(impl)
        if refusal is not None:
            verdicts.append(CandidateVerdict(impl, REJECTED, refusal))
            continue
        ranked = policy.rank(op_name, impl)
        if ranked is None:
            order_text = ", ".join(map(str, order))
            verdicts.append(
                CandidateVerdict(impl, REJECTED, f"matches no token of the order [{order_text}]")
            )
            continue
        state = availability.check(impl)
        if not state.available:
            verdicts.append(CandidateVerdict(impl, REJECTED, f"unavailable: {state.reason}", state))
            continue
        survivors.append((ranked[0], -int(impl.priority), impl.impl_id, impl, state))

    if not survivors:
        details = "; ".join(f"{v.impl.impl_id}: {v.reason}" for v in verdicts) or "none registered"
        raise NoImplementationError(
            f"no usable implementation of op {op_name!r} ({details})",
            Decision(
                op_name, tuple(map(str, order)), policy.order_source(op_name), tuple(verdicts)
            ),
        )

    survivors.sort(key=lambda s: s[:3])
    best_rank, best_priority, _, chosen, chosen_state = survivors[0]
    _check_explicit_choice(op_name, policy, verdicts, best_rank, chosen)
    ranked_verdicts = [
        CandidateVerdict(chosen, CHOSEN, _chosen_reason(order, best_rank), chosen_state)
    ]
    for rank, priority, _, impl, state in survivors[1:]:
        if rank != best_rank:
            why = (
                f"lower in the order: matches {order[rank]} (position {rank + 1}), "
                f"{chosen.impl_id} matches {order[best_rank]} (position {best_rank + 1})"
            )
        elif priority != best_priority:
            why = f"lower priority: {-priority} < {-best_priority} of {chosen.impl_id}"
        else:
            why = f"same order and priority as {chosen.impl_id}; impl_id sorts after"
        ranked_verdicts.append(CandidateVerdict(impl, FALLBACK, why, state))

    decision = Decision(
        op=op_name,
        order=tuple(map(str, order)),
        order_source=policy.order_source(op_name),
        candidates=(*ranked_verdicts, *verdicts),
    )
    chain = [v.impl for v in ranked_verdicts]
    fn = chain[0].fn if policy.settings.strict else _bind_chain(op_name, chain)
    return Resolution(op=op_name, fn=fn, decision=decision)


def _chosen_reason(order: tuple[Any, ...], rank: int) -> str:
    return f"first available candidate: matches {order[rank]} (position {rank + 1} of the order)"


def _check_explicit_choice(
    op_name: str,
    policy: SelectionPolicy,
    rejected: list[CandidateVerdict],
    best_rank: int,
    chosen: OpImpl,
) -> None:
    """An explicit choice that fell through to a later token: an error under STRICT, else a
    warning (once per op, since resolutions are cached)."""
    if not policy.is_explicit(op_name) or best_rank == 0:
        return
    first = policy.order_for(op_name)[0]
    reasons = [
        f"{v.impl.impl_id}: {v.reason}"
        for v in rejected
        if (ranked := policy.rank(op_name, v.impl)) is not None and ranked[0] == 0
    ]
    detail = "; ".join(reasons) if reasons else "no implementation matches it"
    message = (
        f"op {op_name!r} was asked to use {first} ({policy.order_source(op_name)}) "
        f"but cannot ({detail})"
    )
    if policy.settings.strict:
        raise StrictModeError(f"SGLANG_FL_STRICT=1: {message}")
    _log.warning(
        "%s; using %s instead (SGLANG_FL_STRICT=1 makes this an error)", message, chosen.impl_id
    )


def _bind_chain(op_name: str, chain: list[OpImpl]) -> Callable[..., Any]:
    """The chosen fn itself, or a closure handing an ``Unsupported`` call to the next one."""
    fn = chain[-1].fn
    for impl, fallback in zip(reversed(chain[:-1]), reversed(chain[1:]), strict=True):
        fn = _with_fallback(op_name, impl, fallback, fn)
    return fn


def _with_fallback(
    op_name: str, impl: OpImpl, fallback: OpImpl, next_fn: Callable[..., Any]
) -> Callable[..., Any]:
    primary = impl.fn
    warned = False

    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal warned
        try:
            return primary(*args, **kwargs)
        except Unsupported as exc:
            if not warned:
                warned = True
                _log.warning(
                    "%s: %s declined a call (%s); handing it to %s (warned once per process)",
                    op_name,
                    impl.impl_id,
                    exc,
                    fallback.impl_id,
                )
            return next_fn(*args, **kwargs)

    call.__name__ = f"{op_name}_via_{impl.impl_id}"
    call.__qualname__ = call.__name__
    call.__doc__ = f"{impl.impl_id}, handing Unsupported calls to {fallback.impl_id}."
    return call
