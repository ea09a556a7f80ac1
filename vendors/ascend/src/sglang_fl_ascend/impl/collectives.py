"""Collectives on Ascend: HCCL through torch_npu's process group (the ``hccl`` backend).

On an NPU, SGLang 0.5.23's ``GroupCoordinator`` has no communicator of its own (pynccl, the
custom all-reduce and symmetric memory are CUDA-only; ``srt/distributed/parallel_state.py``):
every collective is one ``torch.distributed`` call on the ``hccl`` device group, which ``import
torch_npu`` registers (``ProcessGroupHCCL``). This wheel serves every collective but
``quant_all_reduce`` that way (``ProcessGroupHCCL`` implements ``gather`` and the list
``reduce_scatter`` too: Ascend op-plugin, ``docs/context/c10d_npu-ProcessGroupHCCL.md``), so the
kit checks them and ``sglang-fl ops`` names HCCL. vllm-ascend drives HCCL the same way: its
``NPUCommunicator`` (``vllm_ascend/distributed/device_communicators/npu_communicator.py``)
keeps vLLM's base-class collectives, ``torch.distributed`` calls on the device group, adding
only its own all-to-all. Uneven gathers and scatters are declined (the reference pads and serves
them): SGLang has them on pynccl only, and torch.distributed's tensor collectives take one count
for every rank.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.types import CollectiveGroup, ProcessGroupLibrary

_PG_HCCL = "torch_npu/csrc/distributed/ProcessGroupHCCL.cpp"
HCCL = ProcessGroupLibrary(
    name="HCCL",
    backend="hccl",
    dtypes=frozenset(
        {
            torch.uint8,
            torch.int8,
            torch.int16,
            torch.int32,
            torch.int64,
            torch.float16,
            torch.float32,
            torch.float64,
            torch.bool,
            torch.bfloat16,
        }
    ),
    dtypes_source=f"{_PG_HCCL}, kScalarTypeToHcclDataType read by getHcclDataType",
    layout_source=(
        f"{_PG_HCCL}, check_npu_single_tensor (dense NPU tensors, contiguous); HCCL API "
        "reference: sendBuf/recvBuf are device memory of the communicator's device"
    ),
    uneven=(
        "torch.distributed all_gather_into_tensor / reduce_scatter_tensor pass one count for "
        "every rank (HcclAllGather sendCount, HcclReduceScatter recvCount: hccl.h); SGLang "
        "0.5.23 has uneven gathers on pynccl only (GroupCoordinator.all_gatherv)"
    ),
)

COLLECTIVES = HCCL.implementations()
# SGLang's NPU quant_all_reduce all-gathers int8 from torch_npu.npu_dynamic_quant and sums in
# the input dtype (GroupCoordinator.quant_all_reduce): a kernel, not one HCCL call; it stays.
LEFT_TO_SGLANG = {
    "quant_all_reduce": "SGLang's own NPU path stays: torch_npu.npu_dynamic_quant, an int8 "
    "all-gather on HCCL, dequantised and summed (GroupCoordinator.quant_all_reduce)",
}


def communicator(group: CollectiveGroup) -> Any:
    """The lifecycle on HCCL: ``ProcessGroupHCCL`` is the engine's device group (created by
    SGLang on the ``hccl`` backend, destroyed with it): no per-group state; a group on another
    backend is refused here (it keeps the reference collectives, or strict mode fails)."""
    HCCL.check_group(group)
    return None
