"""``SGLANG_FL_TRACE``: pluggy's own trace of every hook call, each line tagged with the pid.

The trace is pluggy's (``PluginManager.enable_tracing``); only its destination is chosen here.
A file target is what makes SGLang's spawned worker processes traceable: they inherit the
variable, and each appends its lines to the same file. Every write is one ``O_APPEND``
``write(2)`` of whole lines, so lines of concurrent processes never interleave mid-line.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pluggy

from .errors import ConfigError

__all__ = ["trace_hook_calls"]


def trace_hook_calls(pm: pluggy.PluginManager, target: bool | Path) -> None:
    """Trace ``pm``'s hook calls to stderr (``True``) or append them to the file ``target``."""
    if target is False:
        return
    write = _write_stderr if target is True else _file_appender(target)
    pm.trace.root.setwriter(_tagged_with_pid(write))
    pm.enable_tracing()


def _tagged_with_pid(write: Callable[[str], object]) -> Callable[[str], None]:
    def tagged(message: str) -> None:
        # Read per message: a forked child writes its own pid.
        prefix = f"[pid {os.getpid()}] "
        write("".join(prefix + line for line in message.splitlines(keepends=True)))

    return tagged


def _write_stderr(text: str) -> None:
    sys.stderr.write(text)


def _file_appender(path: Path) -> Callable[[str], None]:
    """Checks now that ``path`` can be appended to, so a bad path fails at start-up, named."""
    try:
        os.close(_open_for_append(path))
    except OSError as exc:
        raise ConfigError(
            f"cannot append the hook trace (SGLANG_FL_TRACE) to {str(path)!r}: "
            f"{exc.strerror or exc}"
        ) from None

    def append(text: str) -> None:
        # Opened per message (hooks run at load time only, a few calls per process): nothing
        # stays open across a fork, and every message is one atomic append.
        fd = _open_for_append(path)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    return append


def _open_for_append(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
