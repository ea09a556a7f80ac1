"""The dispatch report: which implementation runs each engine layer class, in every process.

Shared by the SGLang and vLLM integrations. Each process that loads the plugin writes one
``plugin`` record, then one ``layer`` record the first time the engine resolves a fused-op
class there, one ``collective`` record per process group (of more than one rank) and
collective op when the group is created, and one ``handoff`` record the first time a call is
handed back to the engine's own path; in verify mode (``SGLANG_FL_VERIFY``), one ``verify``
record per checked call (:mod:`sglang_fl.verify`). Records are logged at INFO in the first
rank (DEBUG elsewhere) and, with ``SGLANG_FL_DISPATCH_LOG=PATH``, appended to PATH as JSON
lines that all carry ``pid`` and ``role`` (:func:`process_role`: ``main``, ``scheduler``,
``detokenizer``, ...), so the spawned scheduler workers' choices are visible from outside.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import torch

from ._files import open_regular_for_append
from ._forksafe import reset_locks_in_child
from ._strenum import StrEnum
from .dispatch.binder import Decline
from .dispatch.resolve import CandidateOutcome, Decision
from .errors import ConfigError
from .schema import impl_fields, portable_json
from .verify import VERIFY_EVENT

__all__ = [
    "CommunicatorState",
    "DispatchReport",
    "ReportEvent",
    "Runner",
    "process_role",
    "read_log",
]

_log = logging.getLogger("sglang_fl.integrations.sglang")


class ReportEvent(StrEnum):
    """The ``event`` of a dispatch-report record."""

    PLUGIN = "plugin"  # register() ran in this process
    LAYER = "layer"  # a fused-op class (or one refused instance) was first resolved here
    HANDOFF = "handoff"  # a call was first handed to SGLang's own forward, for this reason
    FUNCTION = "function"  # a kernel function SGLang's model code calls was routed (or not)
    CALLED = "called"  # a routed function's first call here: the implementation that served it
    FALLBACK = "fallback"  # an implementation first declined a call; the next candidate ran it
    VERIFY = VERIFY_EVENT  # verify mode checked one routed call against the op's reference
    COLLECTIVE = "collective"  # who serves one collective of one process group (once per group)
    ATTENTION_BACKEND = "attention_backend"  # which SGLang attention backend serves (per runner)
    GRAPH_RUNNER = "graph_runner"  # which decode graph runner serves (per model runner), and why
    GRAPH_STATE = "graph_state"  # the attention backend's plans allocated for a graph mode
    GRAPH_CAPTURE = "graph_capture"  # what compiling the decode step did: graphs, breaks, whose
    GRAPH_REPLAY = "graph_replay"  # a captured step was compiled again at replay (once per reason)
    COMMUNICATOR = "communicator"  # a vendor communicator of one group was opened or closed


class CommunicatorState(StrEnum):
    """The ``state`` of a ``communicator`` record."""

    OPEN = "open"  # set up for the group, agreed by every rank
    CLOSED = "closed"  # its close() returned
    RELEASED = "released"  # the group let go of it; another group still holds the handle
    CLOSE_FAILED = "close_failed"  # its close() raised or did not return in time (problem)


class Runner(StrEnum):
    """Who runs a layer: an sglang-fl implementation, or the engine's own forward.

    A record whose runner is an engine names that engine's forward in ``<runner>_forward``.
    """

    SGLANG_FL = "sglang-fl"
    SGLANG = "sglang"
    VLLM = "vllm"


def _first_rank() -> bool:
    """True unless torch.distributed is up and this is not rank 0."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return True


def _proctitle() -> str | None:
    """SGLang names its processes (``sglang::scheduler_TP0``) with setproctitle."""
    try:
        import setproctitle
    except ImportError:
        return None
    title: str = setproctitle.getproctitle()
    return title


# ``sglang::scheduler_TP0``, ``sglang::detokenizer``, ``VLLM::EngineCore``: an engine's name for
# a process, then (SGLang) its ranks.
_ENGINE_TITLE = re.compile(r"^(?:sglang|VLLM)::([A-Za-z][A-Za-z0-9]*(?:_[a-z][a-z0-9]*)*)")
# ``run_scheduler_process``, ``run_detokenizer_process``, ``run_engine_core``: spawn targets.
_SPAWN_TARGET = re.compile(r"^run_(\w+?)(?:_process)?$")


def _snake(name: str) -> str:
    """``EngineCore`` -> ``engine_core``; ``scheduler`` stays."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def process_role(title: str | None) -> str:
    """What this process is to its engine: ``main``, ``scheduler``, ``detokenizer``, ...

    From the engine's process title when it has set one (``sglang::scheduler_TP0`` is
    ``scheduler``), else from the function the process was started to run: SGLang loads the
    plugins before it names its scheduler, so a scheduler's first records (the ``plugin``
    record among them) carry Python's title, and ``run_scheduler_process`` says the same. The
    process that started the others is ``main``; any other is named as multiprocessing names it.
    """
    match = _ENGINE_TITLE.match(title or "")
    if match:
        return _snake(match.group(1))
    current = multiprocessing.current_process()
    target = getattr(getattr(current, "_target", None), "__name__", "")
    spawned = _SPAWN_TARGET.match(target)
    if spawned:
        return _snake(spawned.group(1))
    if multiprocessing.parent_process() is None:
        return "main"
    return current.name


class DispatchReport:
    """Logs records once and appends them to the dispatch log, if one is configured."""

    def __init__(self, log_path: Path | None) -> None:
        """Opens ``log_path`` once now: a path that cannot be appended to is a
        :class:`~sglang_fl.errors.ConfigError` naming ``SGLANG_FL_DISPATCH_LOG`` at start-up,
        not an ``OSError`` inside SGLang's hook later."""
        self.log_path = log_path
        self._lock = threading.Lock()
        self._described: set[str] = set()  # ops whose rejected candidates were reported
        reset_locks_in_child(self)  # a thread emitting at fork time must not hang the child
        if log_path is not None:
            try:
                os.close(self._open(log_path))
            except OSError as exc:
                raise ConfigError(_log_error(log_path, exc)) from None

    def report_decline(self, decline: Decline) -> None:
        """A routed implementation's first decline of a call, per reason: a ``fallback``
        record (a chain's ``on_decline``, for the layers and the collectives alike)."""
        self.emit(
            ReportEvent.FALLBACK,
            op=decline.op,
            impl_id=decline.impl_id,
            next_impl_id=decline.next_impl_id,
            reason=decline.reason,
            runner=Runner.SGLANG_FL,
        )

    def emit(self, event: ReportEvent, **fields: Any) -> dict[str, Any]:
        """Log one record and append it to the dispatch log; returns the record."""
        title = _proctitle()
        record = {
            "event": event,
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "process": multiprocessing.current_process().name,
            "proctitle": title,
            "role": process_role(title),
            "time": round(time.time(), 3),
            **fields,
        }
        level = logging.INFO if _first_rank() else logging.DEBUG
        if event is ReportEvent.LAYER:
            if fields.get("runner") is Runner.SGLANG_FL:
                _log.log(
                    level,
                    "sglang-fl dispatch: %s -> %s (%s, %s %s)",
                    fields["layer"],
                    fields["impl_id"],
                    fields["kind"],
                    fields["distribution"],
                    fields["version"],
                )
            else:
                runner = fields.get("runner")
                _log.log(
                    level,
                    "sglang-fl dispatch: %s -> %s %s (%s)",
                    fields["layer"],
                    runner,
                    fields.get(f"{runner}_forward"),
                    fields.get("reason"),
                )
        elif event is ReportEvent.HANDOFF:
            runner = fields.get("runner")
            _log.log(
                level,
                "sglang-fl: %s hands a call to %s's %s: %s (logged once)",
                fields["layer"],
                runner,
                fields.get(f"{runner}_forward"),
                fields["reason"],
            )
        elif event is ReportEvent.COLLECTIVE:
            _log.log(
                level,
                "sglang-fl collective: %s on %s -> %s %s%s",
                fields["op"],
                fields["group"],
                fields["runner"],
                fields.get("impl_id") or fields.get("sglang_method"),
                f" (fallback: {fields['fallback_reason']})"
                if fields.get("fallback_reason")
                else "",
            )
        else:
            _log.debug("sglang-fl %s: %s", event, fields)
        if self.log_path is not None:
            self._append(self.log_path, record)
        return record

    def decision_fields(self, decision: Decision) -> dict[str, Any]:
        """What a record naming the implementation that serves ``decision.op`` carries: the
        chosen one (``impl_id``, ``kind``, ``vendor``, provenance), its ``fallbacks`` in order
        and, the first time the op is reported, ``rejected`` (:meth:`rejected_once`)."""
        return {
            **impl_fields(decision.chosen),
            "fallbacks": [impl.impl_id for impl in decision.fallbacks],
            **self.rejected_once(decision),
        }

    def rejected_once(self, decision: Decision | None) -> dict[str, Any]:
        """``{"rejected": [...]}`` for the first record of ``decision.op`` in this process, else
        ``{}``: every candidate that never runs here, as ``sglang-fl explain`` shows it (its
        ``reason``; a vendor whose probe said no with the probe's ``availability_reason``), so
        the report says why a vendor was skipped in the engine's own environment."""
        if decision is None:
            return {}
        with self._lock:
            if decision.op in self._described:
                return {}
            self._described.add(decision.op)
        rejected = [c for c in decision.candidates if c.outcome is CandidateOutcome.REJECTED]
        return {"rejected": [verdict.to_dict() for verdict in rejected]}

    def _reset_locks_after_fork(self) -> None:
        self._lock = threading.Lock()

    def _append(self, path: Path, record: dict[str, Any]) -> None:
        # Non-finite numbers as strings (see sglang_fl.schema.NON_FINITE): every line is JSON.
        text = json.dumps(portable_json(record), sort_keys=True, default=str, allow_nan=False)
        line = (text + "\n").encode()
        with self._lock:
            if self.log_path is None:  # an earlier write failed: reported once, then off
                return
            try:
                # One O_APPEND write per record: lines from concurrent processes never interleave.
                fd = self._open(path)
                try:
                    os.write(fd, line)
                finally:
                    os.close(fd)
            except OSError as exc:  # became unwritable after start-up: never fail a forward
                self.log_path = None
                _log.error("%s; no further records are written to it", _log_error(path, exc))

    @staticmethod
    def _open(path: Path) -> int:
        """A regular file only, opened without blocking (see
        :func:`~sglang_fl._files.open_regular_for_append`): each record is then one
        ``O_APPEND`` write that no other process's record can split."""
        path.parent.mkdir(parents=True, exist_ok=True)
        return open_regular_for_append(path)


def _log_error(path: Path, exc: OSError) -> str:
    return (
        f"SGLANG_FL_DISPATCH_LOG={str(path)!r}: cannot append the dispatch report "
        f"({exc.strerror or exc}); expected a writable file path"
    )


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """Parse a dispatch log written by :class:`DispatchReport` (for the demo and the tests)."""
    text = Path(path).read_text() if Path(path).exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]
