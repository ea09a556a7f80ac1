"""Forking in tests: a child that hangs fails the test instead of hanging the run."""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable

import pytest

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")


def run_in_child(body: Callable[[], int], timeout: float = 20.0) -> int:
    """Fork; run ``body()`` in the child (its return value is the exit code); wait with a timeout.

    A child that does not finish in time is killed and the test fails: that is a deadlock.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 99
        try:
            code = int(body())
        except BaseException:
            traceback.print_exc()
            code = 98
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail(f"forked child did not finish within {timeout}s: deadlock")
