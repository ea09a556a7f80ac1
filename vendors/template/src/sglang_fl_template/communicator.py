"""template's collective library: one communicator per process group (FlagCX-style).

A collective library with communicators of its own (FlagCX: ``flagcxGetUniqueId``,
``flagcxCommInitRank``, ``flagcxAllReduce`` ..., ``flagcxCommDestroy``) is set up per group by
the ``sglang_fl_communicator`` hook (plugin.py), on every rank of the group: rank 0 makes a
unique id, the others receive it over ``group.cpu_group`` (a gloo group sglang-fl made for
this set-up), every rank creates its communicator from it, and ``close()`` destroys it (called
once per handle when the engine tears the group down, bounded by SGLANG_FL_PLUGIN_TIMEOUT; a
rank killed outright runs no close(), so rely on it for nothing outside the process). The
collectives (impl/collectives.py) reach the handle as
``group.communicator``. If the set-up raises or hangs on any rank, every rank of the group
keeps the reference collectives (reported; an error under ``SGLANG_FL_STRICT=1``).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from sglang_fl.types import CollectiveGroup


def load_library() -> Any:
    """The C library, loaded on the first set-up, never at import (``ctypes.CDLL`` and the
    argument types of its unique-id, init, collective and destroy functions)."""
    raise RuntimeError("template: no collective library is loaded yet (communicator.py)")


class Communicator:
    """This rank's communicator for one group: created from the group's unique id."""

    def __init__(self, library: Any, group: CollectiveGroup) -> None:
        unique_id = [library.get_unique_id() if group.rank_in_group == 0 else None]
        dist.broadcast_object_list(unique_id, src=group.ranks[0], group=group.cpu_group)
        self.library = library
        self.comm = library.comm_init_rank(group.world_size, unique_id[0], group.rank_in_group)

    def close(self) -> None:
        """The teardown: called once, when the engine destroys the group (or at exit)."""
        self.library.comm_destroy(self.comm)


def open_communicator(group: CollectiveGroup) -> Communicator:
    return Communicator(load_library(), group)
