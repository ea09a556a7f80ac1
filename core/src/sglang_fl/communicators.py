"""The communicator lifecycle: a vendor's collective library set up and torn down per group.

For each process group with more than one rank, :func:`open_communicator` asks the plugin
whose collectives serve the group for its handle (``sglang_fl_communicator``), bounded by
``SGLANG_FL_PLUGIN_TIMEOUT``, then makes the group's ranks agree (one ``all_reduce`` of a flag
on the engine's gloo CPU group): either every rank uses the vendor's library, or every rank
falls back to the reference collectives for that group. Mixing the two would hang (NCCL's send
never meets gloo's receive).

The plugin never sees the engine's CPU group: it gets a gloo group of its own for the set-up
(``group.cpu_group`` in the hook), created here for the same ranks. A set-up that raises on one
rank while another waits in its unique-id broadcast, or one abandoned at the timeout, leaves a
half-done collective only on that group; the engine's CPU group, which the agreement and all of
SGLang's coordination use, stays in step. Used by the SGLang integration and the kit alike.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import logging
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .errors import StrictModeError
from .guard import call_plugin_code, describe_exception
from .loader import call_plugin_hook
from .ops.collectives.group import CollectiveGroup
from .runtime import Runtime

__all__ = ["CommunicatorOutcome", "close_communicator", "open_communicator"]

_log = logging.getLogger(__name__)
HOOK = "sglang_fl_communicator"


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


def _setup_group(group: CollectiveGroup, timeout: float) -> Any:
    """A gloo group of the same ranks for the plugin's set-up; only its members create it.

    Its operations time out with the hook, so a rank left waiting for a peer whose set-up
    failed gets an error in its (abandoned) hook thread instead of a collective pending at
    interpreter exit, which gloo answers with ``std::terminate``."""
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
    setup_group = _setup_group(group, runtime.config.plugin_timeout)
    setup = dataclasses.replace(group, cpu_group=setup_group)
    handle, problem = _ask(runtime, plugin_name, setup)
    failed = _agree(group, problem is None)
    if failed and problem is None:
        problem = f"{failed} other rank(s) of the group failed to set it up"
        close_communicator(plugin_name, group, handle)
        handle = None
    if problem is not None:
        message = f"plugin {plugin_name!r}: communicator for {group.describe()}: {problem}"
        if runtime.config.strict:
            raise StrictModeError(f"SGLANG_FL_STRICT=1: {message}")
        _log.warning("sglang-fl: %s; the group uses the reference collectives", message)
        return CommunicatorOutcome(plugin_name, group, problem=problem)
    if handle is not None:
        _register_for_exit(plugin_name, group, handle)
    return CommunicatorOutcome(plugin_name, group, communicator=handle)


_open: dict[int, tuple[str, CollectiveGroup, Any]] = {}
_open_lock = threading.Lock()


def _register_for_exit(plugin_name: str, group: CollectiveGroup, handle: Any) -> None:
    with _open_lock:
        if not _open:
            atexit.register(_close_all)
        _open[id(handle)] = (plugin_name, group, handle)


def close_communicator(plugin_name: str, group: CollectiveGroup, handle: Any) -> None:
    """The teardown: ``handle.close()`` once, if it has one; a failure is logged, not raised
    (teardown runs while the engine shuts down)."""
    with _open_lock:
        _open.pop(id(handle), None)
    close = getattr(handle, "close", None)
    if handle is None or not callable(close):
        return
    try:
        close()
    except Exception as exc:
        _log.warning(
            "sglang-fl: plugin %r: closing the communicator of %s raised %s",
            plugin_name,
            group.describe(),
            describe_exception(exc),
        )


def _close_all() -> None:
    for plugin_name, group, handle in list(_open.values()):
        close_communicator(plugin_name, group, handle)
