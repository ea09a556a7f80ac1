"""Lazy availability probes: each probe runs at most once per process, never raises, and is
waited for at most ``SGLANG_FL_PLUGIN_TIMEOUT`` seconds (then the kernel is unavailable)."""

from __future__ import annotations

import logging
import threading
import types
from collections.abc import Callable

from ..guard import call_plugin_code, describe_exception, plugin_text, safe_repr
from .types import Availability, OpImpl

__all__ = ["AvailabilityCache"]

_log = logging.getLogger(__name__)


class AvailabilityCache:
    """Memoises probe results by probe (bound methods of one backend share one entry)."""

    def __init__(self, *, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self._results: dict[object, tuple[Callable[[], object], Availability]] = {}
        self._lock = threading.Lock()
        self._fork_holds_lock = False

    def check(self, impl: OpImpl) -> Availability:
        probe = impl.available  # checked at registration: None, a bool or a callable
        if probe is None:
            # The seed layout's ``fn._is_available``: reading it is plugin code (a lazy proxy's
            # __getattr__ may import, block or exit), so it is bounded like the probe itself.
            looked = call_plugin_code(
                lambda: impl.availability_probe,
                what=f"the availability-probe lookup of {impl.impl_id!r}",
                timeout=self.timeout,
            )
            if looked.timed_out:
                return Availability(
                    False,
                    f"looking up its probe (fn._is_available) did not answer within "
                    f"{self.timeout:g} s (SGLANG_FL_PLUGIN_TIMEOUT); treated as unavailable",
                )
            if looked.error is not None:
                return Availability(
                    False, f"looking up its probe raised {describe_exception(looked.error)}"
                )
            probe = looked.value
        if probe is None:
            return Availability(True, "no availability probe: always available")
        if isinstance(probe, bool):
            return Availability(probe, f"declared available={probe} when registered")
        key = _key(probe)
        with self._lock:
            cached = self._results.get(key)
            if cached is None:
                # The probe is kept with its answer, so the identities in the key stay unique.
                cached = self._results[key] = (probe, _run(probe, impl, self.timeout))
            return cached[1]

    # -- fork (see sglang_fl.runtime) ---------------------------------------------------------

    def wait_for_probe_before_fork(self) -> None:
        """Let a probe another thread runs answer (or time out), so the child inherits no
        half-done import."""
        self._fork_holds_lock = self._lock.acquire()

    def release_after_fork(self) -> None:
        if self._fork_holds_lock:
            self._fork_holds_lock = False
            self._lock.release()

    def _reset_locks_after_fork(self) -> None:
        self._fork_holds_lock = False
        self._lock = threading.Lock()


def _key(probe: Callable[[], object]) -> object:
    """The probe's identity; a bound method by its object and function, so that the bound
    methods of one backend share an entry. No method of the probe runs (its ``__hash__`` or
    ``__eq__`` is plugin code, and this runs under the cache's lock)."""
    if isinstance(probe, types.MethodType):
        return ("method", id(probe.__self__), id(probe.__func__))
    return ("probe", id(probe))


def _run(probe: Callable[[], object], impl: OpImpl, timeout: float) -> Availability:
    outcome = call_plugin_code(
        lambda: _answer(probe, impl),
        what=f"the availability probe of {impl.impl_id!r}",
        timeout=timeout,
    )
    if outcome.timed_out:
        reason = (
            f"availability probe did not answer within {timeout:g} s (SGLANG_FL_PLUGIN_TIMEOUT);"
            " treated as unavailable"
        )
        _log.warning("%s (%s): %s", impl.impl_id, impl.provenance, reason)
        return Availability(False, reason)
    if outcome.error is not None:  # a vendor bug, even sys.exit(), must not end the process
        error = describe_exception(outcome.error)
        _log.warning(
            "availability probe of %s (%s) raised %s; treating it as unavailable",
            impl.impl_id,
            impl.provenance,
            error,
        )
        return Availability(False, f"availability probe raised {error}")
    assert outcome.value is not None  # _answer always answers
    return outcome.value


def _answer(probe: Callable[[], object], impl: OpImpl) -> Availability:
    """The probe's answer as a plain :class:`Availability`, read in the probe's own thread
    (an ``Availability`` subclass's properties are plugin code too)."""
    result = probe()
    if isinstance(result, Availability):
        reason: object = result.reason
        text = plugin_text(reason)  # an exact str (its __str__ cannot run later), capped
        return Availability(bool(result.available), safe_repr(reason) if text is None else text)
    if result is True:
        return Availability(True, "probe reported available")
    if result is False:
        return Availability(False, "probe reported unavailable")
    shown = safe_repr(result)
    _log.warning(
        "availability probe of %s (%s) returned %s, not a bool; treating it as unavailable",
        impl.impl_id,
        impl.provenance,
        shown,
    )
    return Availability(False, f"availability probe returned {shown}, not a bool")
