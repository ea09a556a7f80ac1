"""A throwaway vendor wheel with a collective library of its own: a counting communicator.

Its ``sglang_fl_communicator`` does what a real library (NCCL, HCCL, FlagCX) does per group:
rank 0 makes a unique id, the others receive it over the set-up gloo group sglang-fl hands it,
and that group stays the library's own communicator: every collective of the vendor runs on
it, not on the engine's device group (so a rank that runs another library for a call waits
for peers that never come, as with a real one). The handle counts every collective call made
through it, appends ``{"pid", "group", "rank", "op", "unique_id"}`` to
``$COLLECTIVE_VENDOR_OUT`` at each op's first call and, at teardown (``close()``), ``{"pid",
"group", "rank", "unique_id", "calls"}``. Its collectives are the reference math.

Switches (environment), for the failure paths:

- ``COLLECTIVE_VENDOR_INIT=raise``: the set-up raises on the group's last rank (only for
  groups whose name starts with ``COLLECTIVE_VENDOR_INIT_GROUP``, when set); ``hang``: it
  sleeps on every rank.
- ``COLLECTIVE_VENDOR_AVAILABLE_RANKS=0``: the collectives are available only on those global
  ranks (a probe that answers differently per rank).
- ``COLLECTIVE_VENDOR_DECLINE=all_reduce:1``: ``all_reduce`` declines every call
  (``Unsupported``) on those ranks in the group.
- ``COLLECTIVE_VENDOR_CLOSE=hang`` / ``raise``: ``close()`` never returns / raises.
- ``COLLECTIVE_VENDOR_SHARED=1``: one handle per process, handed to every group.

Built as a real wheel and pip-installed into a directory of its own.
"""

from __future__ import annotations

import os
from pathlib import Path

from sglang_processes import install_source

__all__ = ["collective_vendor_site", "on_path"]

MODULE = """
\"\"\"A vendor whose collectives run through a per-group communicator that counts its calls.\"\"\"
import dataclasses
import json
import os
import time

import torch.distributed as dist

from sglang_fl import Unsupported
from sglang_fl.types import BackendImplKind, OpImpl, hookimpl
from sglang_fl.ops import STANDARD_OPS

_SHARED = []


def _out(record):
    with open(os.environ["COLLECTIVE_VENDOR_OUT"], "a") as out:
        out.write(json.dumps(record) + "\\n")


class CountingCommunicator:
    def __init__(self, group):
        token = [f"uid-{os.getpid()}-{group.name}" if group.rank_in_group == 0 else None]
        dist.broadcast_object_list(token, src=group.ranks[0], group=group.cpu_group)
        self.group, self.unique_id, self.calls = group, token[0], {}
        self.link = group.cpu_group  # the library's own communicator from now on

    def call(self, op, fn, group, args, kwargs):
        if op not in self.calls:  # the first call: recorded at once (engines are killed)
            _out({"pid": os.getpid(), "group": group.name, "rank": group.rank_in_group,
                  "op": op, "unique_id": self.unique_id})
        self.calls[op] = self.calls.get(op, 0) + 1
        own = dataclasses.replace(group, device_group=self.link)
        return fn(own, *args, **kwargs)

    def close(self):
        how = os.environ.get("COLLECTIVE_VENDOR_CLOSE", "")
        if how == "hang":
            time.sleep(3600)
        if how == "raise":
            raise RuntimeError("cvendor: the link is already gone")
        _out({"pid": os.getpid(), "group": self.group.name, "rank": self.group.rank_in_group,
              "unique_id": self.unique_id, "calls": self.calls})


@hookimpl
def sglang_fl_communicator(group):
    how = os.environ.get("COLLECTIVE_VENDOR_INIT", "")
    if how == "hang":
        time.sleep(3600)
    last = group.rank_in_group == group.world_size - 1
    only = os.environ.get("COLLECTIVE_VENDOR_INIT_GROUP", "")
    if how == "raise" and last and group.name.startswith(only):
        raise RuntimeError(f"cvendor: no link to rank {group.rank_in_group}")
    if os.environ.get("COLLECTIVE_VENDOR_SHARED") == "1":
        if not _SHARED:
            _SHARED.append(CountingCommunicator(group))
        return _SHARED[0]
    return CountingCommunicator(group)


def _declines(op, group):
    wanted, _, ranks = os.environ.get("COLLECTIVE_VENDOR_DECLINE", "").partition(":")
    return wanted == op and str(group.rank_in_group) in ranks.split(",")


def _through_communicator(op):
    reference = STANDARD_OPS[op].reference

    def fn(group, *args, **kwargs):
        if group.communicator is None:
            raise RuntimeError(f"cvendor {op} called without its communicator")
        if _declines(op, group):
            raise Unsupported(f"cvendor: {op} declined on rank {group.rank_in_group}")
        return group.communicator.call(op, reference, group, args, kwargs)

    return fn


def _available():
    ranks = os.environ.get("COLLECTIVE_VENDOR_AVAILABLE_RANKS")
    if ranks is None:
        return True
    return str(dist.get_rank()) in ranks.split(",")


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register_many(
        OpImpl(op_name=name, impl_id=f"vendor.cvendor.{name}", kind=BackendImplKind.VENDOR,
               fn=_through_communicator(name), vendor="cvendor", available=_available)
        for name, contract in STANDARD_OPS.items() if contract.collective is not None
    )
"""

PYPROJECT = """
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang-fl-cvendor"
version = "0.0.1"
dependencies = ["sglang-fl"]

[project.entry-points."sglang_fl.backends"]
cvendor = "sglang_fl_cvendor"
"""


def collective_vendor_site(root: Path) -> Path:
    """Build the vendor as a real wheel under ``root``, pip-install it into a directory of its
    own and return that directory (put it on ``PYTHONPATH``)."""
    source = root / "src"
    (source / "sglang_fl_cvendor").mkdir(parents=True)
    (source / "sglang_fl_cvendor" / "__init__.py").write_text(MODULE)
    (source / "pyproject.toml").write_text(PYPROJECT)
    return install_source(source, root)


def on_path(site: Path) -> str:
    """``PYTHONPATH`` with the vendor's directory in front of this process's own entries (a
    checkout's sources shadowing the installed sglang-fl stay visible to the ranks)."""
    return os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
