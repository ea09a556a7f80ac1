"""The fallback binder: one op's candidates, in the decision's order, as the callable kept.

Everything that binds a chosen implementation goes through :class:`FallbackChain`: the
resolution itself, the layer router (so the attention backend too), the SGLang function
hooks (kernel functions, linear attention) and verify mode. So a decline means the same
everywhere: an implementation raising :class:`~sglang_fl.errors.Unsupported` hands that same
call to the next candidate; the first decline per implementation and reason is logged once per
process and handed to the binder's report callback; any other exception propagates (a call
that failed is never re-run elsewhere); and under ``SGLANG_FL_STRICT=1`` the chain is the
chosen implementation alone, whose decline is a :class:`~sglang_fl.errors.StrictModeError`
naming the op and the implementation. A decline's reason is plugin text: cut at
:data:`~sglang_fl.guard.PLUGIN_TEXT_LIMIT`, and an implementation whose declines keep giving
new reasons is reported for its first :data:`REASONS_REPORTED` only. A caller that reports
what was *called*, not only what was bound, gives the chain an ``on_first_call`` sink: it
learns which implementation served the chain's first call (the chosen one, or the fallback a
decline handed it to).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .._forksafe import reset_locks_in_child
from ..errors import StrictModeError, Unsupported
from ..guard import exception_text
from .types import OpImpl

__all__ = [
    "REASONS_REPORTED",
    "BeforeNext",
    "Decline",
    "DeclineSink",
    "FallbackChain",
    "FirstCallSink",
]

_log = logging.getLogger(__name__)

# Distinct decline reasons reported per implementation (a reason made per call, with a
# counter or a shape in it, would otherwise log and record every call).
REASONS_REPORTED = 20


@dataclass(frozen=True)
class Decline:
    """An implementation declined a call of ``op`` (``reason``); ``next_impl_id`` gets it."""

    op: str
    impl_id: str
    next_impl_id: str
    reason: str


# Receives each first decline per (implementation, reason): a dispatch-report record, say.
DeclineSink = Callable[[Decline], object]
# Called on every decline, with the declining candidate's position in the chain, before the
# next candidate runs; it may raise to stop the call there (a collective's ranks confirming
# that every one of them declined it, :class:`sglang_fl.communicators.DeclineCheck`).
BeforeNext = Callable[[int, Unsupported], None]
# Receives, once per chain, the implementation that served its first eager call.
FirstCallSink = Callable[[OpImpl], object]


class FallbackChain:
    """``candidates`` bound into :attr:`fn`: the first, then each next while they decline.

    ``fn`` is the chosen implementation itself when it is the only candidate; otherwise one
    closure whose common case, the chosen implementation accepting, costs one frame and a
    ``try``. ``strict`` keeps the chosen implementation alone (:attr:`impls`); its decline is
    then a :class:`~sglang_fl.errors.StrictModeError`. ``on_decline`` is called, after the log
    warning, once per declining implementation and reason in this chain's life (one chain per
    op and process wherever records must not repeat). ``before_next`` is called on every
    decline, before the next candidate runs (see :data:`BeforeNext`). ``on_first_call`` is
    called once, after the chain's first eager call returned, with the implementation that
    served it (through :attr:`fn` or :meth:`serve`); :attr:`fn` is then a wrapper whose later
    calls cost one frame and a flag test more. Calls traced by ``torch.compile`` are not
    observed (the wrapper steps aside, so the trace holds no flag and no report), nor calls
    that raised.
    """

    def __init__(
        self,
        op: str,
        candidates: Sequence[OpImpl],
        *,
        strict: bool = False,
        on_decline: DeclineSink | None = None,
        before_next: BeforeNext | None = None,
        on_first_call: FirstCallSink | None = None,
    ) -> None:
        if not candidates:
            raise ValueError(f"op {op!r}: a fallback chain needs at least one candidate")
        self.op = op
        self.impls: tuple[OpImpl, ...] = tuple(candidates[:1] if strict else candidates)
        # Strict cut fallbacks off: a decline is then an error, not the caller's Unsupported.
        self.strict = strict and len(candidates) > 1
        self.on_decline = on_decline
        self.before_next = before_next
        self._declined: set[tuple[str, str]] = set()
        self._reasons: dict[str, int] = {}  # impl_id -> distinct reasons reported
        self._lock = threading.Lock()
        reset_locks_in_child(self)
        self.on_first_call = on_first_call
        # Nothing to observe without a sink: serve() then never takes the lock.
        self._called = on_first_call is None
        self._bound = self._bind()
        self.fn: Callable[..., Any] = (
            self._bound if on_first_call is None else self._observed(self._bound)
        )

    @property
    def traceable(self) -> bool:
        """Whether :attr:`fn` is one implementation itself, declared traceable
        (:attr:`OpImpl.traceable`): nothing of the chain's own around it for dynamo to trace."""
        return self.fn is self.impls[0].fn and self.impls[0].traceable

    def _reset_locks_after_fork(self) -> None:
        self._lock = threading.Lock()

    def serve(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[OpImpl, Any]:
        """Call the chain as :attr:`fn` does; also say which implementation's result it is.

        Verify mode calls this, so that a record names the implementation whose output it
        judged, not the chosen one that declined the call.
        """
        if len(self.impls) == 1:
            impl, result = self.impls[0], self._bound(*args, **kwargs)
        else:
            index, result = self._walk(0, args, kwargs)
            impl = self.impls[index]
        if not self._called:
            self._first_call(impl)
        return impl, result

    def _observed(self, bound: Callable[..., Any]) -> Callable[..., Any]:
        """``bound`` behind a test of whether the first call was reported yet."""
        serve, compiling = self.serve, torch.compiler.is_compiling

        def observed(*args: Any, **kwargs: Any) -> Any:
            # compiling() first: a trace never reads the flag (no guard on it, no recompile).
            if compiling() or self._called:
                return bound(*args, **kwargs)
            return serve(args, kwargs)[1]

        observed.__name__ = observed.__qualname__ = getattr(bound, "__name__", self.op)
        observed.__wrapped__ = bound  # type: ignore[attr-defined]
        return observed

    def _first_call(self, impl: OpImpl) -> None:
        with self._lock:
            if self._called:  # another thread's call came first
                return
            self._called = True
        assert self.on_first_call is not None
        self.on_first_call(impl)

    def _bind(self) -> Callable[..., Any]:
        first = self.impls[0]
        if len(self.impls) == 1:
            return self._strict(first) if self.strict else first.fn
        head, walk, decline = first.fn, self._walk, self._decline

        def call(*args: Any, **kwargs: Any) -> Any:
            # The common case, the first candidate accepting, costs one frame and a try.
            try:
                return head(*args, **kwargs)
            except Unsupported as exc:
                decline(0, exc)
            return walk(1, args, kwargs)[1]

        rest = ", ".join(impl.impl_id for impl in self.impls[1:])
        call.__name__ = call.__qualname__ = f"{self.op}_via_{first.impl_id}"
        call.__doc__ = f"{first.impl_id}, handing Unsupported calls on to, in order: {rest}."
        return call

    def _walk(self, start: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, Any]:
        """The candidates from ``start`` on: the index of the one that served, and its result.

        A loop, not nested closures: a chain of any length (a thousand plugins declining)
        costs one more frame, and an ``Unsupported`` handled here is not the ``__context__`` of
        the next candidate's exceptions. The last candidate's errors are the caller's.
        """
        last = len(self.impls) - 1
        for index in range(start, last):
            try:
                return index, self.impls[index].fn(*args, **kwargs)
            except Unsupported as exc:  # the next candidate runs after this block
                self._decline(index, exc)
        return last, self.impls[last].fn(*args, **kwargs)

    def _strict(self, chosen: OpImpl) -> Callable[..., Any]:
        fn, op = chosen.fn, self.op

        def strict_call(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Unsupported as exc:
                raise StrictModeError(
                    f"SGLANG_FL_STRICT=1: {chosen.impl_id} declined a call of {op} "
                    f"({exception_text(exc)}); without strict mode the next candidate would "
                    "run it"
                ) from exc

        strict_call.__name__ = strict_call.__qualname__ = f"{op}_strictly_{chosen.impl_id}"
        return strict_call

    def _decline(self, index: int, exc: Unsupported) -> None:
        """Let :attr:`before_next` stop the call; log and report the first decline of each
        implementation and reason, once (at most :data:`REASONS_REPORTED` reasons each)."""
        if self.before_next is not None:
            self.before_next(index, exc)
        impl_id, reason = self.impls[index].impl_id, exception_text(exc)
        key = (impl_id, reason)
        if key in self._declined:  # the common case after the first: no lock
            return
        with self._lock:
            if key in self._declined:
                return
            reported = self._reasons.get(impl_id, 0)
            if reported > REASONS_REPORTED:
                return
            self._reasons[impl_id] = reported + 1
            if reported < REASONS_REPORTED:  # the set stays bounded too
                self._declined.add(key)
        if reported == REASONS_REPORTED:
            _log.warning(
                "%s: %s declined calls for more than %d different reasons; further ones are "
                "handed on without a log line or record",
                self.op,
                impl_id,
                REASONS_REPORTED,
            )
            return
        decline = Decline(self.op, impl_id, self.impls[index + 1].impl_id, reason)
        _log.warning(
            "%s: %s declined a call (%s); handing it to %s (warned once per process)",
            decline.op,
            decline.impl_id,
            decline.reason,
            decline.next_impl_id,
        )
        if self.on_decline is not None:
            self.on_decline(decline)
