"""``SGLANG_FL_TRACE``: pluggy's own trace of every hook call, each line tagged with the pid.

The trace is pluggy's (``PluginManager.enable_tracing``); only its destination is chosen here.
A file target is what makes SGLang's spawned worker processes traceable: they inherit the
variable, and each appends its lines to the same file. Every write is one ``O_APPEND``
``write(2)`` of whole lines to a regular file (a FIFO or device is refused), so lines of
concurrent processes never interleave mid-line.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pluggy

from ._files import open_regular_for_append
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

    failed: list[str] = []

    def append(text: str) -> None:
        # Opened per message (hooks run at load time only, a few calls per process): nothing
        # stays open across a fork, and every message is one atomic append.
        if failed:
            return
        try:
            fd = _open_for_append(path)
            try:
                os.write(fd, text.encode())
            finally:
                os.close(fd)
        except OSError as exc:  # replaced by a FIFO, a full disk: the trace stops, said once
            failed.append(str(exc))
            sys.stderr.write(
                f"sglang-fl: SGLANG_FL_TRACE={str(path)!r}: cannot append the hook trace "
                f"({exc.strerror or exc}); no further trace lines are written\n"
            )

    return append


def _open_for_append(path: Path) -> int:
    """A regular file only, never blocking: a FIFO without a reader would hang every command,
    one with a reader would split the lines of concurrent processes."""
    return open_regular_for_append(path)
