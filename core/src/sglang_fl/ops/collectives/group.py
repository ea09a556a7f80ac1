"""The group a collective runs on: what every collective implementation receives first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["CollectiveGroup"]


@dataclass(frozen=True)
class CollectiveGroup:
    """One process group as a collective implementation sees it (the ``obj`` of its call).

    ``ranks`` are global ranks, in group order; a ``src``/``dst`` argument is an index into it
    (a rank *in the group*, as SGLang's ``GroupCoordinator`` takes them). ``device_group`` is
    the torch.distributed group of the platform's backend (gloo on the CPU, nccl, hccl, ...),
    ``cpu_group`` the gloo group SGLang keeps next to it for coordination. ``communicator`` is
    what this implementation's vendor returned from ``sglang_fl_communicator`` for this group
    (``None`` for the reference and for a vendor that needs none).
    """

    name: str
    ranks: tuple[int, ...]
    rank_in_group: int
    device: torch.device
    device_group: Any
    cpu_group: Any
    communicator: Any = None

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def describe(self) -> str:
        """``group 'tp:0' (ranks 0, 1; this is rank 1)`` for messages."""
        ranks = ", ".join(map(str, self.ranks))
        return f"group {self.name!r} (ranks {ranks}; this is rank {self.rank_in_group})"
