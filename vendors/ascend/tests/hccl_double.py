"""A TEST DOUBLE of HCCL as torch.distributed drives it (torch_npu's ``ProcessGroupHCCL``).

Not HCCL. It stands in for the ``torch.distributed`` functions the Ascend wheel's collective
adapters call on the engine's ``hccl`` device group, so they run here without an NPU: the
calls go to the gloo group the test ranks share (CPU tensors stand for the rank's NPU tensors),
after every check ``ProcessGroupHCCL`` makes, each a
:class:`~sglang_fl.testing.doubles.Constraint` naming its source: torch_npu's
``torch_npu/csrc/distributed/ProcessGroupHCCL.cpp`` and the HCCL API reference (``hccl.h``).
``install()`` puts it in place in a rank (``run_collective_checks(prepare=...)``).
"""

from __future__ import annotations

import torch
from sglang_fl_ascend.impl.collectives import HCCL

from sglang_fl.testing.collective_doubles import ProcessGroupDouble
from sglang_fl.testing.doubles import Constraint

PG = "torch_npu/csrc/distributed/ProcessGroupHCCL.cpp"
API = "HCCL API reference (CANN), hccl.h"


class HcclDouble(ProcessGroupDouble):
    """``ProcessGroupHCCL``'s collectives, checked as torch_npu checks them, run on gloo."""

    BACKEND = "hccl"
    # kScalarTypeToHcclDataType in ProcessGroupHCCL.cpp (bool travels as HCCL_DATA_TYPE_UINT8).
    DTYPES = frozenset(
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
    )

    DTYPE = Constraint(
        "HCCL collectives",
        "a dtype in kScalarTypeToHcclDataType",
        f"{PG}, getHcclDataType ('Unsupported data type for HCCL process group')",
        "raises RuntimeError",
    )
    CONTIGUOUS = Constraint(
        "HCCL collectives",
        "contiguous tensors",
        f"{PG}, check_npu_single_tensor ('Tensors must be contiguous')",
        "raises RuntimeError",
    )
    DEVICE = Constraint(
        "HCCL collectives",
        "tensors on the rank's NPU",
        f"{PG}, check_npu_single_tensor ('Tensors must be NPU and dense'); {API}: device buffers",
        "raises RuntimeError",
    )
    SAME_DTYPE = Constraint(
        "all_gather_into_tensor/reduce_scatter_tensor/all_to_all_single",
        "output and input of one dtype",
        f"{PG}, _allgather_base / _reduce_scatter_base; {API}: one dataType per call",
        "raises RuntimeError",
    )
    GATHER_SIZE = Constraint(
        "all_gather_into_tensor",
        "output of world size x input elements",
        f"{PG}, _allgather_base (output size = world size x input size); {API}, HcclAllGather: "
        "recvBuf holds rankSize x sendCount",
        "raises RuntimeError",
    )
    SCATTER_SIZE = Constraint(
        "reduce_scatter_tensor",
        "input of world size x output elements",
        f"{PG}, _reduce_scatter_base; {API}, HcclReduceScatter: sendBuf holds rankSize x recvCount",
        "raises RuntimeError",
    )
    ALL_TO_ALL_SIZE = Constraint(
        "all_to_all_single",
        "equal splits: input and output of one size, divisible by the world size",
        f"{PG}, alltoall_base (c10d check_split_sizes); {API}, HcclAlltoAll: one count per peer",
        "raises RuntimeError",
    )


def install() -> HcclDouble:
    """In a spawned rank: the Ascend adapters call this double instead of torch.distributed."""
    double = HcclDouble()
    HCCL.api = double
    return double
