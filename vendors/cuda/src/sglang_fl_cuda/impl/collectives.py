"""Collectives on CUDA: NCCL through torch.distributed, and what stays SGLang's own.

SGLang 0.5.23's ``GroupCoordinator`` on CUDA (``srt/distributed/parallel_state.py``) keeps
communicators of its own next to the ``nccl`` device group: pynccl (``PyNcclCommunicator``,
NCCL through ctypes, enabled inside CUDA-graph capture and for the uneven gathers), the custom
all-reduce / all-gather over IPC buffers (``ca_comm``), torch symmetric memory, mscclpp and
FlashInfer's fused all-reduce. They are per-coordinator state a wheel cannot reach through a
:class:`~sglang_fl.types.CollectiveGroup`, and they beat one ``torch.distributed`` call. So this
wheel registers NCCL adapters only for the collectives whose CUDA path in SGLang is that one
call on the device group (``broadcast``, ``send``, ``recv``: pynccl only inside graph capture,
where pipeline and speculative state are not moved; ``gather`` and the list ``reduce_scatter``:
always that call), and declares the others left to SGLang:
with only the reference registered, sglang-fl keeps SGLang's own method on a CUDA group.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.types import CollectiveGroup, DtypeSet, ProcessGroupLibrary

_PG_NCCL = "torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp"
_NCCL_UTILS = "torch/csrc/distributed/c10d/NCCLUtils.hpp"
_NCCL_TYPES = (
    "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/types.html#ncldatatype-t"
)
FLOAT8 = frozenset(
    {torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz}
)
# What NCCL reduces: the ncclDataType map less float8, which every reduction refuses.
REDUCED = frozenset(
    {
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int8,
        torch.uint8,
        torch.int32,
        torch.int64,
        torch.bool,
    }
)
# What NCCL moves: every dtype of the ncclDataType map getNcclDataType reads. float8 e4m3fn /
# e5m2 travel as ncclFloat8e4m3 / ncclFloat8e5m2 (NCCL >= 2.24, NCCL_SUPPORTS_FP8) or as bytes
# (ncclUint8), the fnuz variants as bytes; bool as ncclUint8.
MOVED = REDUCED | FLOAT8
NCCL = ProcessGroupLibrary(
    name="NCCL",
    backend="nccl",
    dtypes=MOVED,
    dtypes_source=(
        f"{_NCCL_UTILS}, the ncclDataType map read by getNcclDataType ({_PG_NCCL}); {_NCCL_TYPES}"
    ),
    reduce_dtypes=DtypeSet(
        REDUCED,
        f"{_PG_NCCL}, allreduce and reduce_scatter: TORCH_CHECK(!isFloat8Type(...), 'Float8 "
        "dtypes are not currenlty supported for NCCL reductions')",
    ),
    layout_source=(
        f"{_PG_NCCL}, check_gpu_single_tensor: 'Tensors must be CUDA and dense', "
        "'Tensors must be contiguous'"
    ),
)

# SGLang's CUDA path for the collectives itself: the reason each is not registered.
_OWN = "SGLang's own CUDA path"
LEFT_TO_SGLANG = {
    "all_reduce": f"{_OWN} stays: custom all-reduce, pynccl (symmetric memory, graph "
    "capture), torch symm-mem, mscclpp, FlashInfer fusion (GroupCoordinator.all_reduce)",
    "all_gather": f"{_OWN} stays: custom all-gather (ca_comm.should_custom_ag) and pynccl "
    "in graph capture (GroupCoordinator._all_gather_into_tensor)",
    "all_gather_into_tensor": f"{_OWN} stays: custom all-gather and pynccl in graph capture "
    "(GroupCoordinator._all_gather_into_tensor)",
    "all_gatherv": f"{_OWN} stays: pynccl's grouped broadcasts (GroupCoordinator.all_gatherv)",
    "reduce_scatter_tensor": f"{_OWN} stays: pynccl in graph capture, aiter and the "
    "registered custom op (GroupCoordinator.reduce_scatter_tensor)",
    "reduce_scatterv": f"{_OWN} stays: pynccl's grouped reduces (GroupCoordinator.reduce_scatterv)",
    "all_to_all_single": f"{_OWN} stays: the registered reg_all_to_all_single custom op "
    "(symmetric-memory buffers) (GroupCoordinator.all_to_all_single)",
    "quant_all_reduce": f"{_OWN} stays: without torch_npu it is SGLang's in-place all-reduce "
    "custom op, with the all-reduce paths above (GroupCoordinator.quant_all_reduce)",
}

SERVED = ("broadcast", "send", "recv", "gather", "reduce_scatter")
COLLECTIVES = NCCL.implementations(SERVED)


def communicator(group: CollectiveGroup) -> Any:
    """The lifecycle on NCCL: ``ProcessGroupNCCL`` is the engine's device group, created and
    destroyed by SGLang, so there is no per-group state; a group on another backend is
    refused here (the group keeps the reference collectives, or strict mode fails)."""
    NCCL.check_group(group)
    return None
