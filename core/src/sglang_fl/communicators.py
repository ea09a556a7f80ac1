"""A process group's collectives: who serves them (agreed by every rank), and the vendor's
communicator, set up and torn down per group.

Every decision that changes which code talks to the other ranks is the group's, never one
rank's: :func:`agree_on_collectives` exchanges each rank's own resolution of every collective
(its candidates, the ones it rejected and why, its errors) in one ``all_gather_object`` on the
engine's gloo CPU group, before anyone communicates otherwise, and every rank derives the same
answer from the same data: the first candidate every rank can run (an availability probe that
answers differently on two ranks, a policy that differs, an op one rank cannot resolve), or,
under ``SGLANG_FL_STRICT=1``, a :class:`~sglang_fl.errors.StrictModeError` on every rank.

For the plugin whose collectives serve a group, :func:`open_communicator` asks for its handle
(``sglang_fl_communicator``), bounded by ``SGLANG_FL_PLUGIN_TIMEOUT``, then makes the ranks
agree (one ``all_reduce`` of a flag on the CPU group): either every rank uses the vendor's
library, or every rank falls back to the reference collectives for that group. Mixing the two
would hang (NCCL's send never meets gloo's receive). The plugin never sees the engine's CPU
group: it gets a gloo group of its own for the set-up (``group.cpu_group`` in the hook), so a
half-done set-up leaves the engine's CPU group in step.

Teardown (:func:`close_communicator`) calls the handle's ``close()`` once, when the last group
holding that handle goes (a plugin may hand one handle to several groups), bounded by
``SGLANG_FL_PLUGIN_TIMEOUT`` like any plugin code: one that does not return is reported and
abandoned, so a finished rank still exits. What is still open at interpreter exit is closed
then (:func:`close_all`), and each outcome goes to the listeners an integration registered
(:func:`report_closes_at_exit`: the SGLang integration's dispatch report); a forked child owns
none of its parent's handles and closes none.

A call one rank declines with ``Unsupported`` while another does not cannot fall back there:
the others are in the chosen library's collective. :class:`DeclineCheck` makes the ranks that
declined confirm it together, bounded, before the next candidate runs; a decline the other
ranks did not make is a :class:`~sglang_fl.errors.CollectiveDivergenceError` on the declining
rank instead of two libraries waiting for each other. Used by the SGLang integration and the
kit alike.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .dispatch.resolve import CandidateOutcome
from .dispatch.types import BackendImplKind, OpImpl
from .errors import CollectiveDivergenceError, SglangFlError, StrictModeError, Unsupported
from .guard import ReservedPluginCall, call_plugin_code, describe_exception
from .loader import call_plugin_hook
from .ops.collectives.group import CollectiveGroup
from .runtime import Runtime

__all__ = [
    "AgreedChoice",
    "CloseOutcome",
    "CommunicatorOutcome",
    "DeclineCheck",
    "agree_on_collectives",
    "close_all",
    "close_communicator",
    "open_communicator",
    "open_handles",
    "plugin_of",
    "report_closes_at_exit",
]

_log = logging.getLogger(__name__)
HOOK = "sglang_fl_communicator"


# -- who serves each collective: the group's answer ------------------------------------------


@dataclass(frozen=True)
class _RankChoice:
    """One rank's own resolution of one op, as exchanged (plain, picklable values)."""

    chain: tuple[str, ...] = ()  # impl ids this rank would run, chosen first
    rejected: Mapping[str, str] = field(default_factory=dict)  # impl id -> why not here
    error: str | None = None  # this rank has no implementation (or strict refused one)


@dataclass(frozen=True)
class AgreedChoice:
    """What the whole group runs for one collective, and what this rank would have run alone.

    ``chain`` is empty when no candidate suits every rank: the engine's own method serves the
    op on every rank (``problem`` says why). ``problem`` is set whenever the group's answer is
    not this rank's own choice (``local``).
    """

    op: str
    chain: tuple[OpImpl, ...]
    local: OpImpl | None
    problem: str | None = None

    @property
    def chosen(self) -> OpImpl | None:
        return self.chain[0] if self.chain else None


def plugin_of(impl: OpImpl) -> str | None:
    """The plugin whose communicator ``impl`` needs (``None``: the reference needs none)."""
    if impl.kind is BackendImplKind.REFERENCE or impl.provenance is None:
        return None
    return impl.provenance.plugin


def _local_choice(runtime: Runtime, op: str) -> tuple[_RankChoice, tuple[OpImpl, ...]]:
    try:
        resolution = runtime.resolve(op)
    except SglangFlError as exc:  # nothing usable here, or strict refused the explicit choice
        return _RankChoice(error=str(exc)), ()
    rejected = {
        c.impl.impl_id: c.reason
        for c in resolution.decision.candidates
        if c.outcome is CandidateOutcome.REJECTED
    }
    # Every usable candidate, in order: strict mode keeps the first alone when it binds
    # (FallbackChain), where a decline is then its StrictModeError.
    decision = resolution.decision
    chain = (decision.chosen, *decision.fallbacks)
    return _RankChoice(tuple(i.impl_id for i in chain), rejected), chain


def _describe_ranks(choices: list[_RankChoice]) -> str:
    """``rank 0 chose vendor.x.all_reduce, rank 1 chose reference.all_reduce (vendor.x...:
    unavailable: ...)``: every rank's own choice, with why it lacks the others' choices."""
    firsts = {c.chain[0] for c in choices if c.chain}
    parts = []
    for rank, choice in enumerate(choices):
        if choice.error is not None:
            parts.append(f"rank {rank} has none ({choice.error})")
            continue
        why = [f"{i}: {choice.rejected[i]}" for i in sorted(firsts) if i in choice.rejected]
        suffix = f" ({'; '.join(why)})" if why else ""
        parts.append(f"rank {rank} chose {choice.chain[0]}{suffix}")
    return ", ".join(parts)


def _agree_one(
    op: str, choices: list[_RankChoice], mine: tuple[OpImpl, ...], strict: bool, where: str
) -> AgreedChoice:
    local = mine[0] if mine else None
    ranks = _describe_ranks(choices)
    common = [i for i in choices[0].chain if all(i in c.chain for c in choices[1:])]
    if any(c.error is not None for c in choices) or not common:
        problem = f"no implementation of {op} is usable on every rank of {where}: {ranks}"
        if strict:
            raise StrictModeError(f"SGLANG_FL_STRICT=1: {problem}")
        return AgreedChoice(op, (), local, f"{problem}; the engine's own method serves it")
    by_id = {impl.impl_id: impl for impl in mine}
    chosen = by_id[common[0]]
    # Fallbacks another plugin serves would need that plugin's communicator: only the chosen
    # plugin's own candidates and the reference follow the chosen one.
    chain = (
        chosen,
        *(by_id[i] for i in common[1:] if plugin_of(by_id[i]) in (None, plugin_of(chosen))),
    )
    if all(c.chain[0] == chosen.impl_id for c in choices):
        return AgreedChoice(op, chain, local)
    problem = (
        f"the ranks of {where} chose differently for {op}: {ranks}; every rank runs "
        f"{chosen.impl_id}, the first candidate all of them can run"
    )
    if strict:
        raise StrictModeError(f"SGLANG_FL_STRICT=1: {problem}")
    if local is not None and local.impl_id != chosen.impl_id:
        _log.warning("sglang-fl: %s", problem)
        return AgreedChoice(op, chain, local, problem)
    return AgreedChoice(op, chain, local)


def agree_on_collectives(
    runtime: Runtime, group: CollectiveGroup, ops: Iterable[str]
) -> dict[str, AgreedChoice]:
    """The implementation every rank of ``group`` runs for each of ``ops``, agreed.

    Every rank of ``group`` must call this at the same point, with the same ``ops``: it runs
    one ``all_gather_object`` on ``group.cpu_group``. Each rank resolves the ops on its own
    first (availability probes, policy, strict); no rank raises before the exchange, so a
    strict failure on one rank is a :class:`StrictModeError` on every rank, naming the rank.
    """
    names = list(ops)
    mine: dict[str, tuple[OpImpl, ...]] = {}
    choices: dict[str, _RankChoice] = {}
    for op in names:
        choices[op], mine[op] = _local_choice(runtime, op)
    gathered: list[Any] = [None] * group.world_size
    dist.all_gather_object(gathered, choices, group=group.cpu_group)
    where = group.describe()
    return {
        op: _agree_one(op, [g[op] for g in gathered], mine[op], runtime.config.strict, where)
        for op in names
    }


# -- the communicator's set-up --------------------------------------------------------------


@dataclass(frozen=True)
class CommunicatorOutcome:
    """What one group got from one plugin: its handle, or why the group falls back."""

    plugin: str
    group: CollectiveGroup
    communicator: Any = None
    problem: str | None = None  # set: the group runs the reference collectives

    @property
    def ok(self) -> bool:
        return self.problem is None


def _ask(runtime: Runtime, plugin_name: str, group: CollectiveGroup) -> tuple[Any, str | None]:
    """This rank's answer from the plugin: ``(handle, None)`` or ``(None, problem)``."""
    pm = runtime.plugin_manager
    plugin = pm.get_plugin(plugin_name)
    if plugin is None:
        return None, f"plugin {plugin_name!r} is not loaded in this process"
    timeout = runtime.config.plugin_timeout
    outcome = call_plugin_code(
        functools.partial(call_plugin_hook, pm, plugin, HOOK, group=group),
        what=f"{HOOK} of plugin {plugin_name!r} for {group.describe()}",
        timeout=timeout,
    )
    if outcome.timed_out:
        return None, f"{HOOK} did not return within {timeout:g} s (SGLANG_FL_PLUGIN_TIMEOUT)"
    if outcome.error is not None:
        return None, f"{HOOK} raised {describe_exception(outcome.error)}"
    return outcome.value, None


def _agree(group: CollectiveGroup, ok: bool) -> int:
    """How many ranks of the group failed (0: all succeeded), over the gloo CPU group."""
    failed = torch.tensor([0 if ok else 1], dtype=torch.int32)
    dist.all_reduce(failed, group=group.cpu_group)
    return int(failed.item())


def _gloo_group(group: CollectiveGroup, timeout: float) -> Any:
    """A gloo group of the same ranks, for sglang-fl's or the plugin's own use; only its
    members create it.

    Its operations time out after ``timeout``, so a rank left waiting for a peer that never
    comes gets an error instead of a collective pending at interpreter exit, which gloo
    answers with ``std::terminate``."""
    return dist.new_group(
        list(group.ranks),
        backend="gloo",
        timeout=timedelta(seconds=timeout),
        use_local_synchronization=True,
    )


def open_communicator(
    runtime: Runtime, plugin_name: str, group: CollectiveGroup
) -> CommunicatorOutcome:
    """Set up ``plugin_name``'s communicator for ``group`` on this rank, agreed by all ranks.

    Every rank of ``group`` must call this at the same point (it runs one CPU-group
    collective). Under ``SGLANG_FL_STRICT=1`` a failure raises :class:`StrictModeError`
    naming the plugin and the group; otherwise the outcome carries the problem and the caller
    serves the group with the reference collectives.
    """
    timeout = runtime.config.plugin_timeout
    setup = dataclasses.replace(group, cpu_group=_gloo_group(group, timeout))
    handle, problem = _ask(runtime, plugin_name, setup)
    failed = _agree(group, problem is None)
    if failed and problem is None:
        problem = f"{failed} other rank(s) of the group failed to set it up"
        if not _held(handle):  # a handle another group holds stays open for it
            _close(plugin_name, group, handle, timeout)
        handle = None
    if problem is not None:
        message = f"plugin {plugin_name!r}: communicator for {group.describe()}: {problem}"
        if runtime.config.strict:
            raise StrictModeError(f"SGLANG_FL_STRICT=1: {message}")
        _log.warning("sglang-fl: %s; the group uses the reference collectives", message)
        return CommunicatorOutcome(plugin_name, group, problem=problem)
    if handle is not None:
        _register(plugin_name, group, handle, timeout)
    return CommunicatorOutcome(plugin_name, group, communicator=handle)


# -- teardown: bounded, once per handle, never in a forked child ----------------------------


@dataclass(frozen=True)
class CloseOutcome:
    """How one group's teardown ended: ``close()`` ran and returned, was not due yet (another
    group still holds the handle), or failed (``problem``: raised, or did not return)."""

    plugin: str
    group: CollectiveGroup
    closed: bool
    problem: str | None = None


@dataclass
class _Open:
    plugin: str
    handle: Any
    timeout: float
    groups: list[CollectiveGroup]
    # The thread its close() will run on, started with the handle: at interpreter exit
    # Python 3.12 starts no thread, and close_all runs there.
    closer: ReservedPluginCall[None]


_open: dict[int, _Open] = {}  # id(handle) -> who holds it; keyed by identity, never hashed
_open_lock = threading.Lock()
_exit_registered = False
# Told how each close() that interpreter exit runs ended (report_closes_at_exit).
_exit_listeners: list[Callable[[CloseOutcome], object]] = []


def _register(plugin_name: str, group: CollectiveGroup, handle: Any, timeout: float) -> None:
    global _exit_registered
    with _open_lock:
        if not _exit_registered:
            atexit.register(_close_all_at_exit)
            _exit_registered = True
        entry = _open.get(id(handle))
        if entry is None:
            closer: ReservedPluginCall[None] = ReservedPluginCall(
                f"close() of plugin {plugin_name!r}'s communicator"
            )
            _open[id(handle)] = _Open(plugin_name, handle, timeout, [group], closer)
        else:
            entry.groups.append(group)


def _held(handle: Any) -> bool:
    """Whether some group of this process holds ``handle`` (a plugin that shares one handle
    between groups may hand a group that failed to set up the one another group runs on)."""
    with _open_lock:
        return id(handle) in _open


def open_handles() -> list[tuple[str, CollectiveGroup]]:
    """``(plugin, group)`` of every group whose communicator this process has not closed."""
    with _open_lock:
        return [(e.plugin, g) for e in _open.values() for g in e.groups]


def close_communicator(plugin_name: str, group: CollectiveGroup, handle: Any) -> CloseOutcome:
    """``group`` lets go of ``handle``; the last group to do so runs its ``close()``.

    Bounded by the ``SGLANG_FL_PLUGIN_TIMEOUT`` of the runtime that opened it; a ``close()``
    that raises or does not return is logged and in the outcome, never raised (teardown runs
    while the engine shuts down), and an abandoned one keeps running in its daemon thread.
    """
    with _open_lock:
        entry = _open.get(id(handle))
        if entry is not None:
            held = [g for g in entry.groups if _same_group(g, group)]
            if held:
                entry.groups.remove(held[0])
            if entry.groups:  # another group still uses it
                return CloseOutcome(plugin_name, group, closed=False)
            del _open[id(handle)]
    timeout = entry.timeout if entry is not None else _default_timeout()
    closer = entry.closer if entry is not None else None
    problem = _close(plugin_name, group, handle, timeout, closer)
    return CloseOutcome(plugin_name, group, closed=problem is None, problem=problem)


def _same_group(a: CollectiveGroup, b: CollectiveGroup) -> bool:
    """One group, whatever the copy (``dataclasses.replace`` adding the communicator)."""
    return (a.name, a.ranks, a.rank_in_group) == (b.name, b.ranks, b.rank_in_group)


def _default_timeout() -> float:
    from .config import Settings

    try:
        return Settings.from_environment().plugin_timeout
    except SglangFlError:
        return 60.0


def _close(
    plugin_name: str,
    group: CollectiveGroup,
    handle: Any,
    timeout: float,
    closer: ReservedPluginCall[None] | None = None,
) -> str | None:
    """``handle.close()``, bounded (on ``closer``'s thread when the handle has one); ``None``
    when it returned (or there is none), else why."""
    if handle is None:
        return None

    def run_close() -> None:
        close = getattr(handle, "close", None)  # a lazy attribute is plugin code too
        if callable(close):
            close()

    if closer is not None:
        outcome = closer.run(run_close, timeout=timeout)
    else:
        outcome = call_plugin_code(
            run_close,
            what=f"close() of plugin {plugin_name!r}'s communicator for {group.describe()}",
            timeout=timeout,
        )
    if outcome.timed_out:
        problem = f"close() did not return within {timeout:g} s (SGLANG_FL_PLUGIN_TIMEOUT)"
    elif outcome.error is not None:
        problem = f"close() raised {describe_exception(outcome.error)}"
    else:
        return None
    _log.warning(
        "sglang-fl: plugin %r: closing the communicator of %s: %s; abandoned",
        plugin_name,
        group.describe(),
        problem,
    )
    return problem


def close_all() -> list[CloseOutcome]:
    """Close every communicator this process still holds (interpreter exit, engine shutdown):
    each ``close()`` once, each bounded."""
    with _open_lock:
        pending = [(e.plugin, g, e.handle) for e in list(_open.values()) for g in list(e.groups)]
    return [close_communicator(plugin, group, handle) for plugin, group, handle in pending]


def report_closes_at_exit(listener: Callable[[CloseOutcome], object]) -> None:
    """Have ``listener`` told how each ``close()`` that interpreter exit runs ended (closed,
    released, or failed with the problem), so that a report written at set-up (``open``)
    also says how the handle went when nothing tore the group down before exit. Registering
    the same listener again does nothing. A listener that raises is logged, never raised
    (the process is exiting)."""
    with _open_lock:
        if listener not in _exit_listeners:
            _exit_listeners.append(listener)


def _close_all_at_exit() -> None:
    """The ``atexit`` teardown: :func:`close_all`, each outcome handed to the listeners."""
    for outcome in close_all():
        for listener in list(_exit_listeners):
            try:
                listener(outcome)
            except Exception:
                _log.exception("sglang-fl: reporting a communicator's close at exit failed")


def _forget_in_child() -> None:
    """A forked child shares its parent's communicators but owns none: its exit closes
    nothing (closing would tear down the parent's links)."""
    global _open_lock
    _open_lock = threading.Lock()
    _open.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


# -- a decline on some ranks only --------------------------------------------------------------


class DeclineCheck:
    """Confirms, before a collective's next candidate runs a declined call, that every rank of
    the group declined it at the same step of the chain.

    Made by every rank of the group together (it creates a gloo group, bounded by
    ``timeout``). The common case, nobody declining, never touches it. The ranks that declined
    meet in one small ``all_reduce``; a rank whose peers did not decline (they are in the
    chosen library's collective) waits at most ``timeout`` seconds, then gets
    :class:`CollectiveDivergenceError` naming the op, the group, the implementation and the
    reason: running the next candidate there would leave two libraries waiting for each other,
    or give a wrong result.
    """

    def __init__(self, group: CollectiveGroup, timeout: float) -> None:
        self.group = group
        self.timeout = timeout
        self._confirm_group = _gloo_group(group, timeout)

    def confirm(self, op: str, impl_id: str, step: int, exc: Unsupported) -> None:
        """Return when every rank declined ``op`` at chain position ``step``; else raise."""
        steps = torch.tensor([step, -step], dtype=torch.int64)
        why = describe_exception(exc)
        try:
            dist.all_reduce(steps, op=dist.ReduceOp.MAX, group=self._confirm_group)
        except RuntimeError as broken:  # gloo's timeout: the peers are elsewhere
            raise self._diverged(op, impl_id, why, describe_exception(broken)) from None
        highest, lowest = int(steps[0]), -int(steps[1])
        if highest != lowest:
            raise self._diverged(op, impl_id, why, f"ranks declined at steps {lowest}..{highest}")

    def _diverged(self, op: str, impl_id: str, why: str, detail: str) -> CollectiveDivergenceError:
        return CollectiveDivergenceError(
            f"{op} on {self.group.describe()}: {impl_id} declined a call here ({why}), but not "
            f"on every rank of the group within {self.timeout:g} s ({detail}); a collective "
            "cannot fall back on one rank alone (the others are in its collective), so this "
            "rank stops. The implementation must decline only what every rank sees alike "
            "(dtype, shapes, arguments): the conformance kit fails a case some ranks decline"
        )
