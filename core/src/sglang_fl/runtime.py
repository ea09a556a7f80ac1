"""The process-wide runtime: settings, plugins and registry loaded once, resolutions cached.

Thread-safe (one lock; concurrent first calls get one runtime and one answer per op). Fork:
``os.fork()`` waits for a plugin load or availability probe another thread is running (both
are bounded: every plugin import, hook and probe is waited for at most
``SGLANG_FL_PLUGIN_TIMEOUT``), so the child never inherits a half-done import; it inherits the
loaded runtime with fresh locks and never registers twice. A child forked by plugin code in the
middle of a load gets a clear error from :func:`get_runtime` instead of hanging on an import
lock. SGLang's spawned workers are new interpreters and load their own.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import pluggy

from ._forksafe import reset_locks_in_child
from .config import Settings, is_valid_name, unmatched_names
from .dispatch.availability import AvailabilityCache
from .dispatch.policy import SelectionPolicy
from .dispatch.registry import OpRegistry
from .dispatch.resolve import Resolution, resolve, resolve_among
from .dispatch.types import OpImpl
from .errors import GraphModeRefused, PluginLoadError, SglangFlError
from .guard import call_plugin_code, describe_exception, in_plugin_code, plain_str, safe_repr
from .loader import (
    PluginRecord,
    call_plugin_hook,
    hold_loads_for_fork,
    load_plugins,
    loading_in_this_thread,
    new_plugin_manager,
    release_loads_after_fork,
    reset_loads_in_child,
)
from .ops import STANDARD_OPS
from .ops.attention.plan import GraphMode

__all__ = ["PlatformAnswer", "Runtime", "get_runtime", "reset_runtime"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlatformAnswer:
    """One plugin's ``sglang_fl_platform()``: a class path or ``None``, or why it has none."""

    plugin: str
    path: str | None
    problem: str | None = None


class Runtime:
    """Loaded plugins, their registrations, and the per-op resolutions of this process."""

    def __init__(self, config: Settings, *, inspecting: bool = False) -> None:
        """``inspecting=True`` (the CLI) records plugin failures even under STRICT."""
        self.config = config
        self.policy = SelectionPolicy(config)
        self.registry = OpRegistry()
        self.plugin_manager: pluggy.PluginManager = new_plugin_manager(config)
        self.plugins: tuple[PluginRecord, ...] = tuple(
            load_plugins(config, self.registry, self.plugin_manager, tolerate_failures=inspecting)
        )
        installed = {p.name for p in self.plugins if not p.builtin and is_valid_name(p.name)}
        # Names in the plugin and vendor lists that nothing installed has: likely typos.
        self.setting_warnings: tuple[str, ...] = tuple(unmatched_names(config, installed))
        for warning in self.setting_warnings:
            _log.warning("%s", warning)
        self._availability = AvailabilityCache(timeout=config.plugin_timeout)
        self._resolutions: dict[str, Resolution] = {}
        self._bound: dict[str, OpImpl] = {}  # op -> the implementation an engine bound
        self.graph_mode: GraphMode | None = None  # a graph runner's, once it started
        self._lock = threading.RLock()
        reset_locks_in_child(self)

    def resolve(self, op_name: str) -> Resolution:
        """The cached resolution of ``op_name``: bind ``.fn`` once, read ``.decision``."""
        running = in_plugin_code()
        if running is not None:  # a probe resolving would wait for its own resolution
            raise SglangFlError(
                f"{running} asked to resolve op {op_name!r}: plugin code (hooks, availability "
                "probes) cannot resolve ops; a probe answers for its own kernels only"
            )
        cached = self._resolutions.get(op_name)
        if cached is not None:
            return cached
        with self._lock:  # an unknown op: the registry raises UnknownOpError (close match)
            cached = self._resolutions.get(op_name)
            if cached is None:
                cached = resolve(op_name, self.registry, self.policy, self._availability)
                self._resolutions[op_name] = cached
            return cached

    def bound(self, op_name: str, impl: OpImpl) -> None:
        """An engine integration bound ``impl`` for ``op_name`` (once per op and binding site).

        While a graph runner runs (:attr:`graph_mode`), an implementation that declares it
        cannot run under that mode is refused: :class:`~sglang_fl.errors.GraphModeRefused`,
        raised in the eager warm-up step that binds it, before any capture.
        """
        mode = self.graph_mode
        problem = impl.graph_problem(mode) if mode is not None else None
        if problem is not None:
            raise GraphModeRefused(
                f"{op_name}: {impl.impl_id} cannot run under a {mode} graph runner: {problem}"
            )
        with self._lock:
            self._bound[op_name] = impl

    def graph_problems(self, mode: GraphMode, skip: Iterable[str] = ()) -> list[str]:
        """Why the implementations bound so far cannot run under ``mode`` (``skip``: ops the
        caller checks itself), one line each."""
        with self._lock:
            return [
                f"{op}: {impl.impl_id}: {problem}"
                for op, impl in self._bound.items()
                if op not in skip and (problem := impl.graph_problem(mode)) is not None
            ]

    def enter_graph_mode(self, mode: GraphMode) -> None:
        """A graph runner starts in this process: from now on every binding is checked
        against ``mode`` (:meth:`bound`)."""
        self.graph_mode = mode

    def resolve_among(self, name: str, candidates: Iterable[OpImpl]) -> Resolution:
        """A selection of :data:`~sglang_fl.ops.SELECTIONS` over ``candidates``, by this
        process's policy and availability cache (uncached: the caller keeps it)."""
        with self._lock:
            return resolve_among(name, candidates, self.policy, self._availability)

    def resolve_all(self) -> Mapping[str, Resolution | SglangFlError]:
        """Every standard op's resolution, or the error explaining why it has none."""
        results: dict[str, Resolution | SglangFlError] = {}
        for op_name in STANDARD_OPS:
            try:
                results[op_name] = self.resolve(op_name)
            except SglangFlError as exc:
                results[op_name] = exc
        return results

    def platform(self) -> str | None:
        """The first class path among :meth:`platform_answers`, else ``None``."""
        answer = self.platform_answer()
        return None if answer is None else answer.path

    def platform_answer(self) -> PlatformAnswer | None:
        """The first answer of :meth:`platform_answers` naming a class path, else ``None``.

        A plugin that raised or answered something other than a class path is reported (and
        skipped, or raised under STRICT) instead of taking SGLang's platform selection down.
        """
        for answer in self.platform_answers():
            if answer.problem is None:
                if answer.path is not None:
                    return answer
                continue
            message = f"plugin {answer.plugin!r}: {answer.problem}"
            if self.config.strict:
                raise PluginLoadError(f"SGLANG_FL_STRICT=1: {message}")
            _log.warning("%s; its platform answer is ignored", message)
        return None

    def platform_answers(self) -> Iterator[PlatformAnswer]:
        """Each plugin's ``sglang_fl_platform()``, asked alone, lazily, in pluggy's call order.

        Asked alone so that one plugin's failure is its own answer; lazily so that
        :meth:`platform` asks no plugin after the first class path (``sglang-fl hooks`` asks all).
        """
        pm = self.plugin_manager
        timeout = self.config.plugin_timeout
        for impl in reversed(pm.hook.sglang_fl_platform.get_hookimpls()):
            outcome = call_plugin_code(
                functools.partial(call_plugin_hook, pm, impl.plugin, "sglang_fl_platform"),
                what=f"sglang_fl_platform of plugin {impl.plugin_name!r}",
                timeout=timeout,
            )
            # A class path is an exact str (a subclass's methods would run here, unbounded).
            result = outcome.value if outcome.value is None else plain_str(outcome.value)
            if outcome.timed_out:
                problem = f"sglang_fl_platform did not return within {timeout:g} s"
            elif outcome.error is not None:
                problem = f"sglang_fl_platform raised {describe_exception(outcome.error)}"
            elif outcome.value is None or (result is not None and result.strip()):
                yield PlatformAnswer(impl.plugin_name, result)
                continue
            else:
                shown = safe_repr(outcome.value)
                problem = f"sglang_fl_platform returned {shown}, not a class path or None"
            yield PlatformAnswer(impl.plugin_name, None, problem)

    def plugin(self, name: str) -> PluginRecord:
        for record in self.plugins:
            if record.name == name:
                return record
        raise KeyError(
            f"no plugin named {name!r}; known: {', '.join(p.name for p in self.plugins)}"
        )

    def _reset_locks_after_fork(self) -> None:
        self._lock = threading.RLock()
        # A parent thread may have held these at fork time (e.g. mid availability probe, which
        # runs under the cache's lock): the child would block on them forever.
        self._availability._reset_locks_after_fork()
        self.registry._lock = threading.RLock()


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()
# Set in a child forked (by plugin code) in the middle of a load: why it cannot load.
_forked_mid_load: str | None = None


def get_runtime() -> Runtime:
    """The process-wide :class:`Runtime`, loading settings and plugins on first use.

    Called from plugin code while plugins load (a plugin's import or hook), it raises
    :class:`~sglang_fl.errors.PluginLoadError` instead of waiting for itself.
    """
    runtime = _runtime
    if runtime is not None:
        return runtime
    _refuse_plugin_code("get_runtime()", "before the runtime finished loading")
    if _forked_mid_load is not None:
        raise PluginLoadError(_forked_mid_load)
    return _load_runtime()


def _refuse_plugin_code(call: str, when: str) -> None:
    """Plugin code (an import, hook or probe) cannot load or reset the runtime: it would wait
    for the very load that is running it."""
    running = in_plugin_code()
    if running is not None or loading_in_this_thread():
        where = f"{running or 'a plugin module'} {when}".rstrip()
        raise PluginLoadError(
            f"{call} was called from {where}; plugin code cannot load or reset the runtime "
            "(a hook gets what it needs as arguments)"
        )


def _load_runtime() -> Runtime:
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = Runtime(Settings.from_environment())
        return _runtime


def reset_runtime() -> None:
    """Forget the runtime so the next :func:`get_runtime` reloads (tests and the CLI only)."""
    global _runtime
    _refuse_plugin_code("reset_runtime()", "")
    with _runtime_lock:
        _runtime = None


_fork_waited = False  # whether this fork waited for other threads' loads and probes


def _before_fork() -> None:
    """Wait for other threads' plugin loads and probes (each bounded by the plugin timeout),
    so the child inherits no half-done import."""
    global _fork_waited
    if in_plugin_code() is not None or loading_in_this_thread():
        return  # the load in progress is this thread's own: waiting would wait for ourselves
    hold_loads_for_fork()
    _fork_waited = True
    if _runtime is not None:
        _runtime._availability.wait_for_probe_before_fork()


def _after_fork_in_parent() -> None:
    global _fork_waited
    if _fork_waited:
        _fork_waited = False
        if _runtime is not None:
            _runtime._availability.release_after_fork()
        release_loads_after_fork()


def _after_fork_in_child() -> None:
    global _runtime_lock, _fork_waited, _forked_mid_load
    cut_off = reset_loads_in_child(held=_fork_waited)
    _fork_waited = False
    _runtime_lock = threading.Lock()
    if cut_off and _runtime is None:
        _forked_mid_load = (
            "this process was forked by plugin code while its parent was loading sglang-fl "
            "plugins; their imports may be half done here. Fork after loading "
            "(sglang_fl.get_runtime() first) or start workers with the 'spawn' method"
        )


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )
