"""The collective ops: what SGLang's ``GroupCoordinator`` performs on device tensors.

One contract each, with ``collective`` set: its cases run on 2 and 4 ranks at once. Every
implementation takes a :class:`CollectiveGroup` first. The reference is what SGLang calls
today on a platform without pynccl (``torch.distributed`` on the group's device group).
What SGLang runs on the gloo CPU group (object broadcasts, barriers, tensor-dict metadata)
is not a collective op here: see ``docs/architecture.md``, "Collective communication".
"""

from __future__ import annotations

from .all_to_all import ALL_TO_ALL_SINGLE
from .broadcast import BROADCAST
from .gather import ALL_GATHER, ALL_GATHER_INTO_TENSOR, ALL_GATHERV, GATHER
from .group import CollectiveGroup
from .p2p import RECV, SEND
from .reduce import (
    ALL_REDUCE,
    QUANT_ALL_REDUCE,
    REDUCE_SCATTER,
    REDUCE_SCATTER_TENSOR,
    REDUCE_SCATTERV,
)

__all__ = ["COLLECTIVES", "CollectiveGroup"]

COLLECTIVES = (
    ALL_REDUCE,
    QUANT_ALL_REDUCE,
    ALL_GATHER,
    ALL_GATHER_INTO_TENSOR,
    ALL_GATHERV,
    GATHER,
    REDUCE_SCATTER_TENSOR,
    REDUCE_SCATTERV,
    REDUCE_SCATTER,
    BROADCAST,
    SEND,
    RECV,
    ALL_TO_ALL_SINGLE,
)
