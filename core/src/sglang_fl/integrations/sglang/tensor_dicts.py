"""``send_tensor_dict`` / ``recv_tensor_dict`` over the bound ``send`` / ``recv``.

SGLang's pipeline parallelism moves each stage's activations with these two methods. SGLang's
own versions pickle the dict's metadata over the gloo CPU group (``send_object`` /
``recv_object``) and then call ``torch.distributed`` on the device group for the tensors,
bypassing the ``send``/``recv`` methods sglang-fl routes. The versions here keep the metadata
exactly as SGLang sends it (its own ``send_object``/``recv_object``, its ``TensorMetadata``,
so the wire format is SGLang's) and move every tensor on the group's device type through the
routed ``send``/``recv`` (the vendor's library). Tensors on another device (CPU tensors of a
GPU group) stay on the CPU group, as SGLang does. The send-then-all-gather split over
``all_gather_group`` is SGLang's: a rank sends its slice, the receiver all-gathers.

The routed ``send`` returns when the tensor may be reused (its contract), so with
``async_send=True`` the tensors are sent before returning; the returned works are the
metadata's, as SGLang's ``P2PWork`` list, so the caller's ``wait()`` loop is unchanged.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["recv_tensor_dict", "send_tensor_dict"]


def _sglang_module(coordinator: Any) -> Any:
    """``parallel_state``, where SGLang defines ``_split_tensor_dict`` and ``TensorMetadata``."""
    return importlib.import_module(type(coordinator).__module__)


def _peer(coordinator: Any, peer: int | None, step: int, what: str) -> int:
    n, me = int(coordinator.world_size), int(coordinator.rank_in_group)
    peer = (me + step) % n if peer is None else peer
    if not 0 <= peer < n or peer == me:
        raise ValueError(f"{what}={peer} is not another rank of the {n}-rank group (this is {me})")
    return peer


def _splits(numel: int, all_gather_group: Any) -> bool:
    """SGLang's send-allgather: a tensor that splits evenly over ``all_gather_group`` travels
    as one share per rank, all-gathered by the receiver."""
    return all_gather_group is not None and numel % all_gather_group.world_size == 0


def _share(tensor: torch.Tensor, all_gather_group: Any) -> torch.Tensor:
    if not _splits(tensor.numel(), all_gather_group):
        return tensor
    return tensor.reshape(all_gather_group.world_size, -1)[all_gather_group.rank_in_group]


def _share_size(size: torch.Size, all_gather_group: Any) -> tuple[torch.Size, bool]:
    if not _splits(size.numel(), all_gather_group):
        return size, False
    return torch.Size([size.numel() // all_gather_group.world_size]), True


def send_tensor_dict(
    coordinator: Any, send: Callable[..., Any], device_type: str
) -> Callable[..., Any]:
    """The routed ``send_tensor_dict`` of ``coordinator`` (``send``: its routed ``send``)."""
    split = _sglang_module(coordinator)._split_tensor_dict

    def routed(
        tensor_dict: dict[str, Any],
        dst: int | None = None,
        all_gather_group: Any = None,
        async_send: bool = False,
    ) -> list[Any]:
        dst = _peer(coordinator, dst, 1, "send_tensor_dict: dst")
        if not isinstance(tensor_dict, dict):
            raise TypeError(f"send_tensor_dict: expected a dict, got {type(tensor_dict).__name__}")
        metadata, tensors = split(tensor_dict)
        works: list[Any] = coordinator.send_object(metadata, dst=dst, async_send=async_send)
        for tensor in tensors:
            if tensor.numel() == 0:  # SGLang sends no bytes for an empty tensor
                continue
            share = _share(tensor, all_gather_group)
            if share.device.type == device_type:
                send(share.contiguous(), dst)
            else:
                dist.send(share, int(coordinator.ranks[dst]), group=coordinator.cpu_group)
        return works

    routed.__name__ = routed.__qualname__ = "send_tensor_dict"
    return routed


def recv_tensor_dict(
    coordinator: Any, recv: Callable[..., Any], device_type: str
) -> Callable[..., Any]:
    """The routed ``recv_tensor_dict`` of ``coordinator`` (``recv``: its routed ``recv``)."""
    tensor_metadata = _sglang_module(coordinator).TensorMetadata

    def routed(src: int | None = None, all_gather_group: Any = None) -> dict[str, Any]:
        src = _peer(coordinator, src, -1, "recv_tensor_dict: src")
        received: dict[str, Any] = {}
        for key, value in coordinator.recv_object(src=src):
            if not isinstance(value, tensor_metadata):
                received[key] = value
                continue
            size = torch.Size(value.size)
            if size.numel() == 0:
                received[key] = torch.empty(size, dtype=value.dtype, device=value.device)
                continue
            share_size, gathered = _share_size(size, all_gather_group)
            if torch.device(value.device).type == device_type:
                share = recv(share_size, value.dtype, src)
            else:
                share = torch.empty(share_size, dtype=value.dtype, device=value.device)
                dist.recv(share, int(coordinator.ranks[src]), group=coordinator.cpu_group)
            if gathered:
                share = all_gather_group.all_gather(share, dim=0)
            received[key] = share.reshape(value.size)
        return received

    routed.__name__ = routed.__qualname__ = "recv_tensor_dict"
    return routed
