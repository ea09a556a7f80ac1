"""Fresh locks in a forked child for every object that asked for them.

A thread of the parent may hold a lock at the moment another thread forks; in the child that
thread does not exist and the lock would stay held forever. Objects owning locks register here
and get ``_reset_locks_after_fork()`` called in the child, before anything else runs there.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol

__all__ = ["reset_locks_in_child"]


class _OwnsLocks(Protocol):
    def _reset_locks_after_fork(self) -> None: ...


_owners: weakref.WeakSet[_OwnsLocks] = weakref.WeakSet()


def reset_locks_in_child(owner: _OwnsLocks) -> None:
    """Call ``owner._reset_locks_after_fork()`` in every child forked while it is alive."""
    _owners.add(owner)


def _after_fork_in_child() -> None:
    for owner in list(_owners):
        owner._reset_locks_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
