"""The check every pooled-state implementation makes before it reads or writes a pool slot.

SGLang keeps the GDN/Mamba states of all requests in pools (``[N, ...]``) and hands each kernel
one index per request (``cache_indices``, ``ssm_state_indices``, ...); ``PAD_SLOT_ID`` (-1)
marks a padding row that touches no state. An index past the pool makes a kernel read or write
another request's state, or memory outside the tensor, so it is refused, never clamped. The
references raise ``IndexError`` (the contracts say so); a vendor adapter declines the call
with :class:`~sglang_fl.errors.Unsupported` before its kernel, which does not check the bound,
runs. Both use :func:`check_state_indices`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch

__all__ = ["HOST_INDICES", "PAD_SLOT_ID", "check_state_indices"]

# SGLang's ``PAD_SLOT_ID``: a state index meaning "padding row, touch no state".
PAD_SLOT_ID = -1

# The references of the pooled-state decode functions read and check the indices on the host:
# a device graph replays the kernels one step launched, with the capture's slots.
HOST_INDICES: Mapping[str, str] = MappingProxyType(
    {
        "captured": "the reference reads the state indices on the host (.tolist()) to check "
        "and gather them: a device graph would replay the capture's slots"
    }
)


def check_state_indices(
    op: str,
    indices: torch.Tensor,
    pool_slots: int,
    *,
    pad_slot_id: int | None = PAD_SLOT_ID,
    error: type[Exception] = IndexError,
    why: str = "",
) -> None:
    """Raise ``error`` naming ``op`` unless every index is a slot of a ``pool_slots`` pool.

    ``pad_slot_id`` is the one value outside the pool that is allowed (a padding row); ``None``
    allows none. The message names the first bad index, its position, what is allowed and,
    when given, ``why`` (the consequence a vendor's kernel would have).

    The test is one reduction on the indices' device and one read of its verdict on the host
    (a second read only to name a bad index). While a CUDA graph is being captured no value
    can be read: the check is then skipped and the indices are trusted, as SGLang trusts them.
    """
    if indices.numel() == 0 or (indices.is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    flat = indices.reshape(-1)
    inside = (flat >= 0) & (flat < pool_slots)
    if pad_slot_id is not None:
        inside |= flat == pad_slot_id
    if bool(inside.all()):
        return
    position = int((~inside).nonzero()[0, 0])
    value = int(flat[position])
    allowed = f"0..{pool_slots - 1}" if pool_slots > 0 else "none (the pool is empty)"
    padding = f", or {pad_slot_id} for a padding row" if pad_slot_id is not None else ""
    consequence = f"; {why}" if why else ""
    raise error(
        f"{op}: state index {value} at position {position} is outside the state pool of "
        f"{pool_slots} slots (allowed: {allowed}{padding}){consequence}"
    )
