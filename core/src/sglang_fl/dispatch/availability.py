"""Lazy availability probes: each probe runs at most once per process and never raises."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .types import Availability, OpImpl

__all__ = ["AvailabilityCache"]

_log = logging.getLogger(__name__)


class AvailabilityCache:
    """Memoises probe results by probe (bound methods of one backend share one entry)."""

    def __init__(self) -> None:
        self._results: dict[object, Availability] = {}
        self._lock = threading.Lock()

    def check(self, impl: OpImpl) -> Availability:
        probe = impl.availability_probe
        if probe is None:
            return Availability(True, "no availability probe: always available")
        if isinstance(probe, bool):
            return Availability(probe, f"declared available={probe} when registered")
        with self._lock:
            key = _key(probe)
            cached = self._results.get(key)
            if cached is None:
                cached = self._results[key] = _run(probe, impl)
            return cached


def _key(probe: Callable[[], object]) -> object:
    """The probe itself (equal bound methods share an entry), or its identity if unhashable."""
    try:
        hash(probe)
    except TypeError:  # e.g. a callable dataclass instance: eq without hash
        return ("unhashable probe", id(probe))
    return probe


def _run(probe: Callable[[], object], impl: OpImpl) -> Availability:
    try:
        result = probe()
    except Exception as exc:  # a vendor bug must not take the process down
        _log.warning(
            "availability probe of %s (%s) raised %s: %s; treating it as unavailable",
            impl.impl_id,
            impl.provenance,
            type(exc).__name__,
            exc,
        )
        return Availability(False, f"availability probe raised {type(exc).__name__}: {exc}")
    if isinstance(result, Availability):
        return result
    if result is True:
        return Availability(True, "probe reported available")
    if result is False:
        return Availability(False, "probe reported unavailable")
    _log.warning(
        "availability probe of %s (%s) returned %r, not a bool; treating it as unavailable",
        impl.impl_id,
        impl.provenance,
        result,
    )
    return Availability(False, f"availability probe returned {result!r}, not a bool")
