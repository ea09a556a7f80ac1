"""Collectives on Ascend: HCCL through torch_npu's process group (the ``hccl`` backend).

On an NPU, SGLang 0.5.23's ``GroupCoordinator`` has no communicator of its own (pynccl, the
custom all-reduce and symmetric memory are CUDA-only; ``srt/distributed/parallel_state.py``):
every collective is one ``torch.distributed`` call on the ``hccl`` device group, which ``import
torch_npu`` registers (``ProcessGroupHCCL``). This wheel serves every collective but
``quant_all_reduce`` that way, so the kit checks them and ``sglang-fl ops`` names HCCL.
vllm-ascend drives HCCL the same way: its ``NPUCommunicator``
(``vllm_ascend/distributed/device_communicators/npu_communicator.py``) keeps vLLM's base-class
collectives, ``torch.distributed`` calls on the device group, adding only its own all-to-all.

What ``ProcessGroupHCCL`` takes, read in torch_npu's source (``master``, the tree that builds
2.14.0 and 2.15.0: ``version.txt``), each limit below with its line, and in the release tags
of Ascend/pytorch where a limit changed between releases:

- every dtype of ``kScalarTypeToHcclDataType`` moves; float8 and uint16/32/64 only from the
  Ascend Extension for PyTorch 26.0.0 builds (2.7.1.post4, 2.8.0.post4, 2.9.0.post2, 2.10.0
  and later: the v7.3.1 tags' map lacks them, and ``getHcclDataType`` raises); reductions take
  only ``checkSupportedDataType``'s (no uint8, bool or float64; float64 and uint64 on Ascend
  950 from torch_npu 2.14.0: master 779d1de6c, in no tag up to v26.2.0-beta.1);
- ``gather`` raises unless ``TORCH_NPU_USE_COMPATIBLE_IMPL=1`` on an Atlas A2/A3
  (``IsCompatibleSoc``) with a 26.0.0 build or later (before, it always raises): declined
  otherwise, so the reference serves it;
- uneven ``all_gatherv``/``reduce_scatterv`` go through torch_npu's own
  ``torch_npu.distributed.all_gather_into_tensor_uneven`` / ``reduce_scatter_tensor_uneven``
  (``HcclAllGatherV``/``HcclReduceScatterV``, split sizes in rows of dim 0); a release
  without them declines those calls.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from sglang_fl.types import CollectiveGroup, DtypeSet, ProcessGroupLibrary, UnevenCalls

from ..backend import AscendSoc, platform

_PG_HCCL = "torch_npu/csrc/distributed/ProcessGroupHCCL.cpp"
_UTILS = "torch_npu/csrc/distributed/HCCLUtils.cpp"
_C10D = "torch_npu/distributed/distributed_c10d.py"
# The env option ProcessGroupHCCL::gather reads (EnvVariables.cpp: REGISTER_OPTION_INIT_BY_ENV,
# CheckCompatibleImpl true for "1" only).
COMPATIBLE_IMPL = "TORCH_NPU_USE_COMPATIBLE_IMPL"

_TAGS = "Ascend/pytorch tags v7.3.1-pytorch2.x (without) and v26.0.0-pytorch2.x (with)"
# checkSupportedDataType (ProcessGroupHCCL.cpp:170-188), called by allreduce (:4765),
# reduce_scatter (:5982) and _reduce_scatter_base (:6234): what HCCL reduces everywhere...
REDUCED = frozenset(
    {
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.float32,
        torch.bfloat16,
    }
)
# kScalarTypeToHcclDataType (HCCLUtils.cpp:49-65): what getHcclDataType maps, i.e. what HCCL
# moves: in every release the reduced dtypes and these (bool travels as HCCL_DATA_TYPE_UINT8)...
MOVED_EVERYWHERE = REDUCED | {torch.uint8, torch.float64, torch.bool}
# ...and these from the Ascend Extension for PyTorch 26.0.0 builds on (the map's float8 entries
# came with "[950] Add 950 support", the unsigned ones with "add datatypes for HCCLUtils").
MOVED_SINCE_26 = frozenset(
    {torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2}
)
MOVED = MOVED_EVERYWHERE | MOVED_SINCE_26
# ...and what it reduces on Ascend 950 only (a5ExtraDataTypes), added to master by 779d1de6c
# (2026-08-20) after every tagged release (v26.2.0-beta.1, torch_npu 2.13.0, lacks it): taken
# from 2.14.0, the first release published after it (PyPI, 2026-10).
REDUCED_ON_950 = frozenset({torch.uint64, torch.float64})
REDUCED_ON_950_SINCE = (2, 14, 0)


def _moves_since_26() -> bool:
    return platform().extension_26


def _reduces_on_ascend_950() -> bool:
    found = platform()
    return (
        found.soc is AscendSoc.A5
        and found.release is not None
        and found.release >= REDUCED_ON_950_SINCE
    )


def gather_unavailable() -> str | None:
    """Why ``ProcessGroupHCCL::gather`` would raise here, or ``None``: it runs only with
    ``TORCH_NPU_USE_COMPATIBLE_IMPL=1`` on an Atlas A2/A3 (``ProcessGroupHCCL.cpp``:6535-6540,
    ``IsCompatibleSoc`` :505-512: 910B1 <= SoC < 310B1 or 910_9391 <= SoC < Ascend950)."""
    source = f"{_PG_HCCL}:6535-6540, 'ProcessGroupHCCL does not support gather'"
    found = platform()
    if not found.extension_26:
        return (
            f"ProcessGroupHCCL::gather always raises before the Ascend Extension for PyTorch "
            f"26.0.0 builds (2.7.1.post4, 2.8.0.post4, 2.9.0.post2, 2.10.0+), not "
            f"{found.describe()} (source: {source}; {_TAGS})"
        )
    if os.environ.get(COMPATIBLE_IMPL) != "1":
        return f"ProcessGroupHCCL::gather needs {COMPATIBLE_IMPL}=1 (source: {source})"
    if not found.a2_or_a3:
        return (
            f"ProcessGroupHCCL::gather runs on Atlas A2/A3 only (IsCompatibleSoc), not "
            f"{found.describe()} (source: {source})"
        )
    return None


HCCL = ProcessGroupLibrary(
    name="HCCL",
    backend="hccl",
    dtypes=MOVED_EVERYWHERE,
    dtypes_source=f"{_UTILS}:49-65, kScalarTypeToHcclDataType read by getHcclDataType",
    move_dtypes=DtypeSet(
        MOVED_EVERYWHERE,
        f"{_UTILS}:49-65, kScalarTypeToHcclDataType read by getHcclDataType ('Unsupported "
        f"data type for HCCL process group'); float8 and uint16/32/64 from 26.0.0 ({_TAGS})",
        only_where=MOVED_SINCE_26,
        where=_moves_since_26,
        where_text="from the Ascend Extension for PyTorch 26.0.0 builds only",
    ),
    reduce_dtypes=DtypeSet(
        REDUCED,
        f"{_PG_HCCL}:170-188, checkSupportedDataType ('HCCL <op>: Unsupported data type'; "
        "uint64/float64 on Ascend 950 only, master 779d1de6c), called by allreduce, "
        "reduce_scatter and _reduce_scatter_base",
        only_where=REDUCED_ON_950,
        where=_reduces_on_ascend_950,
        where_text="on Ascend 950 with torch_npu 2.14.0+ only",
    ),
    layout_source=(
        f"{_PG_HCCL}, check_npu_single_tensor (dense NPU tensors, contiguous); HCCL API "
        "reference: sendBuf/recvBuf are device memory of the communicator's device"
    ),
    uneven=UnevenCalls(
        module="torch_npu.distributed",
        all_gather="all_gather_into_tensor_uneven",
        reduce_scatter="reduce_scatter_tensor_uneven",
        source=(
            f"{_C10D}:406-462 (_reduce_scatter_tensor_uneven, _all_gather_into_tensor_uneven); "
            f"{_PG_HCCL}:5301-5540 (HcclReduceScatterV/HcclAllGatherV, check_split_sizes)"
        ),
    ),
    requirements={"gather": gather_unavailable},
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
