"""The process-wide runtime: settings, plugins and registry loaded once, resolutions cached.

Thread-safe (one lock; concurrent first calls get one runtime and one answer per op) and
fork-safe (a forked child inherits the loaded runtime, gets fresh locks, never registers
twice). SGLang's spawned workers are new interpreters and load their own, once.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pluggy

from .config import Settings, is_valid_name, unmatched_names
from .dispatch.availability import AvailabilityCache
from .dispatch.policy import SelectionPolicy
from .dispatch.registry import OpRegistry
from .dispatch.resolve import Resolution, resolve
from .errors import PluginLoadError, SglangFlError
from .loader import PluginRecord, call_plugin_hook, load_plugins, new_plugin_manager
from .ops import STANDARD_OPS

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
        self._availability = AvailabilityCache()
        self._resolutions: dict[str, Resolution] = {}
        self._lock = threading.RLock()

    def resolve(self, op_name: str) -> Resolution:
        """The cached resolution of ``op_name``: bind ``.fn`` once, read ``.decision``."""
        cached = self._resolutions.get(op_name)
        if cached is not None:
            return cached
        with self._lock:  # an unknown op: the registry raises UnknownOpError (close match)
            cached = self._resolutions.get(op_name)
            if cached is None:
                cached = resolve(op_name, self.registry, self.policy, self._availability)
                self._resolutions[op_name] = cached
            return cached

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
        """The first class path among :meth:`platform_answers`, else ``None``.

        A plugin that raised or answered something other than a class path is reported (and
        skipped, or raised under STRICT) instead of taking SGLang's platform selection down.
        """
        for answer in self.platform_answers():
            if answer.problem is None:
                if answer.path is not None:
                    return answer.path
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
        for impl in reversed(pm.hook.sglang_fl_platform.get_hookimpls()):
            try:
                result = call_plugin_hook(pm, impl.plugin, "sglang_fl_platform")
            except Exception as exc:
                problem = f"sglang_fl_platform raised {type(exc).__name__}: {exc}"
            else:
                if result is None or (isinstance(result, str) and result.strip()):
                    yield PlatformAnswer(impl.plugin_name, result)
                    continue
                problem = f"sglang_fl_platform returned {result!r}, not a class path or None"
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
        self._availability._lock = threading.Lock()
        self.registry._lock = threading.RLock()


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def get_runtime() -> Runtime:
    """The process-wide :class:`Runtime`, loading settings and plugins on first use."""
    runtime = _runtime
    if runtime is not None:
        return runtime
    return _load_runtime()


def _load_runtime() -> Runtime:
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = Runtime(Settings.from_environment())
        return _runtime


def reset_runtime() -> None:
    """Forget the runtime so the next :func:`get_runtime` reloads (tests and the CLI only)."""
    global _runtime
    with _runtime_lock:
        _runtime = None


def _after_fork_in_child() -> None:
    global _runtime_lock
    _runtime_lock = threading.Lock()
    if _runtime is not None:
        _runtime._reset_locks_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
