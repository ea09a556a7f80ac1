"""Log and trace targets: regular files only, appended to without ever blocking.

A FIFO without a reader would block the opener forever, one with a reader splits large records
of several processes, a device is not a log; so the dispatch log and the hook trace, and the
settings that name them, accept only a regular file (created if missing).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

__all__ = ["append_target_problem", "file_kind", "open_regular_for_append"]


def append_target_problem(path: Path) -> str | None:
    """Why a file could not be appended to at ``path`` (missing directories are created).

    Only a regular file is a target: a FIFO without a reader would block the opener forever,
    one with a reader splits large records of several processes, a device is not a log.
    """
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # the walk below names the missing part
        mode = None
    except OSError as exc:
        return f"cannot be examined ({exc.strerror or exc})"
    if mode is not None and stat.S_ISDIR(mode):
        return "is a directory"
    if mode is not None and not stat.S_ISREG(mode):
        return f"is not a regular file (a {file_kind(mode)}); expected a file"
    if mode is not None:
        try:  # opening an existing regular file for append changes nothing
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
        except OSError as exc:
            return f"cannot be opened for appending ({exc.strerror or exc})"
        return None
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{str(parent)!r} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"directory {str(parent)!r} is not writable"
    return None


def file_kind(mode: int) -> str:
    """``FIFO``, ``character device``, ... for a ``stat`` mode that is not a regular file."""
    kinds = (
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISDIR, "directory"),
    )
    return next((name for test, name in kinds if test(mode)), "special file")


def open_regular_for_append(path: Path) -> int:
    """A descriptor appending to the regular file ``path`` (created if missing), never blocking.

    ``O_NONBLOCK``: a FIFO without a reader fails at once (``ENXIO``) instead of hanging; any
    other file that is not regular is refused (``OSError``) once opened, before a write.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # what O_NONBLOCK gives for a FIFO nobody reads
            raise OSError(errno.ENXIO, "not a regular file (a FIFO without a reader)") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"not a regular file (a {file_kind(mode)})")
    return fd


# The settings that name plugins (entry points) or vendors: each name should match one installed.
