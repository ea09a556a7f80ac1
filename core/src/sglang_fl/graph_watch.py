"""What ``torch.compile`` did while sglang-fl watched: graphs, graph breaks, recompiles, whose.

A graph runner compiles an engine's step; every graph break splits it (the code between runs
eagerly) and every recompile is a guard that failed on a later step. Both cost speed, and
users ask whose they are. :class:`DynamoWatch` records them around a region of code from
dynamo's own bookkeeping (its ``graph_breaks`` log, with the user code location of each break,
and ``torch._dynamo.utils.guard_failures``) and attributes each to the code it happened in
(:class:`Owner`): sglang-fl, a vendor plugin, the engine, torch, or other code. Engine-agnostic.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ._strenum import StrEnum

__all__ = [
    "CompileSummary",
    "DynamoWatch",
    "GraphBreak",
    "Owner",
    "Recompile",
    "RecompileCheck",
    "owner_of",
]


class Owner(StrEnum):
    """Whose code a graph break or recompile happened in."""

    SGLANG_FL = "sglang-fl"
    VENDOR = "vendor"  # a vendor wheel (``sglang_fl_<vendor>``)
    SGLANG = "sglang"
    TORCH = "torch"
    OTHER = "other"


_OWNERS = (
    (re.compile(r"[/\\]sglang_fl[/\\]"), Owner.SGLANG_FL),
    (re.compile(r"[/\\]sglang_fl_[A-Za-z0-9_]+[/\\]"), Owner.VENDOR),
    (re.compile(r"[/\\]sglang[/\\]"), Owner.SGLANG),
    (re.compile(r"[/\\]torch[/\\]"), Owner.TORCH),
)


def owner_of(filename: str) -> Owner:
    """The owner of a source file, from its installed package directory."""
    for pattern, owner in _OWNERS:
        if pattern.search(filename):
            return owner
    return Owner.OTHER


@dataclass(frozen=True)
class GraphBreak:
    """One graph break: where in user code, whose code, and dynamo's reason (its summary and
    the line saying what it could not trace)."""

    location: str
    owner: Owner
    reason: str


@dataclass(frozen=True)
class Recompile:
    """One recompile: the function recompiled, whose, and the guard that failed."""

    function: str
    owner: Owner
    reason: str


@dataclass
class CompileSummary:
    """What happened in one watched region."""

    graphs: int = 0
    breaks: list[GraphBreak] = field(default_factory=list)
    recompiles: list[Recompile] = field(default_factory=list)

    def count(self, owner: Owner) -> tuple[int, int]:
        """``(graph breaks, recompiles)`` in ``owner``'s code."""
        return (
            sum(b.owner is owner for b in self.breaks),
            sum(r.owner is owner for r in self.recompiles),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "graphs": self.graphs,
            "graph_breaks": [
                {"location": b.location, "owner": str(b.owner), "reason": b.reason}
                for b in self.breaks
            ],
            "recompiles": [
                {"function": r.function, "owner": str(r.owner), "reason": r.reason}
                for r in self.recompiles
            ],
        }


_BREAK_AT = re.compile(r"in user code at (?P<location>\S+?):(?P<line>\d+)")
_REASON = re.compile(r"Graph Break Reason: (?P<reason>.*)\n\s*(?P<cause>.*)")


class _BreakLog(logging.Handler):
    """Collects dynamo's ``graph_breaks`` artifact records."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.breaks: list[GraphBreak] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        at = _BREAK_AT.search(message)
        if at is None:
            return
        found = _REASON.search(message)
        reason = ""
        if found is not None:  # dynamo's summary, then what it could not trace
            cause = found["cause"].strip()
            reason = found["reason"].strip()
            if cause and not cause.startswith("User code traceback"):
                reason = f"{reason} {cause}"
        location = f"{at['location']}:{at['line']}"
        self.breaks.append(GraphBreak(location, owner_of(at["location"]), reason))


_lock = threading.Lock()


class DynamoWatch:
    """Records graphs compiled, graph breaks and recompiles in the ``with`` block it guards.

    Dynamo logs each graph break once per break site (later hits of the same site are
    suppressed), so :attr:`summary` lists every distinct break; recompiles are read from
    ``guard_failures``, one per failed guard check. Watches do not nest.
    """

    def __init__(self) -> None:
        self.summary = CompileSummary()

    @contextmanager
    def watching(self) -> Iterator[CompileSummary]:
        from torch._dynamo import symbolic_convert

        log = symbolic_convert.graph_break_log
        handler = _BreakLog()
        with _lock:
            level, propagate = log.level, log.propagate
            log.addHandler(handler)
            log.setLevel(logging.DEBUG)
            log.propagate = False  # recorded here, not printed
        check = RecompileCheck()
        try:
            yield self.summary
        finally:
            with _lock:
                log.removeHandler(handler)
                log.setLevel(level)
                log.propagate = propagate
            self.summary.breaks += handler.breaks
            since = check.since()
            self.summary.graphs += since.graphs
            self.summary.recompiles += since.recompiles


class RecompileCheck:
    """Graphs compiled and guards failed since the last check: a cheap per-step test
    (:meth:`changed`, one counter read) and, when something changed, what (:meth:`since`)."""

    def __init__(self) -> None:
        from torch._dynamo.utils import counters, guard_failures

        self._counters = counters
        self._failures = guard_failures
        self._graphs = counters["stats"]["unique_graphs"]
        self._seen = {code: len(reasons) for code, reasons in guard_failures.items()}

    def changed(self) -> bool:
        return bool(self._counters["stats"]["unique_graphs"] != self._graphs)

    def since(self) -> CompileSummary:
        """What was compiled since the last call (or since this check was made)."""
        graphs = self._counters["stats"]["unique_graphs"]
        summary = CompileSummary(graphs=graphs - self._graphs)
        self._graphs = graphs
        for code, reasons in list(self._failures.items()):
            for reason in reasons[self._seen.get(code, 0) :]:
                summary.recompiles.append(
                    Recompile(
                        f"{code.co_name} at {code.co_filename}:{code.co_firstlineno}",
                        owner_of(code.co_filename),
                        reason.splitlines()[0] if reason else "",
                    )
                )
            self._seen[code] = len(reasons)
        return summary
