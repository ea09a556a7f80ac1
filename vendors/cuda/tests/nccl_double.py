"""A TEST DOUBLE of NCCL as torch.distributed drives it (``ProcessGroupNCCL``), over gloo.

Not NCCL. It stands in for the ``torch.distributed`` functions the CUDA wheel's collective
adapters call on the engine's ``nccl`` device group, so the adapters run here without a GPU:
the calls go to the gloo group the test ranks share (CPU tensors stand for the rank's CUDA
tensors), after every check ``ProcessGroupNCCL`` makes, each a
:class:`~sglang_fl.testing.doubles.Constraint` naming its source: torch's
``torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp`` and ``NCCLUtils.hpp`` (torch 2.x) and the
NCCL user guide.
``install()`` puts it in place in a rank (``run_collective_checks(prepare=...)``).
"""

from __future__ import annotations

import torch
from sglang_fl_cuda.impl.collectives import NCCL

from sglang_fl.testing.collective_doubles import ProcessGroupDouble
from sglang_fl.testing.doubles import Constraint

PG = "torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp"
UTILS = "torch/csrc/distributed/c10d/NCCLUtils.hpp"
TYPES = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/types.html"
COLLS = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/colls.html"


class NcclDouble(ProcessGroupDouble):
    """``ProcessGroupNCCL``'s collectives, checked as torch checks them, run on gloo."""

    BACKEND = "nccl"
    # The ncclDataType map (NCCLUtils.hpp), read independently of the adapters' sets: bool and
    # the fnuz float8 variants travel as ncclUint8, bf16 with NCCL >= 2.10, float8 e4m3fn/e5m2
    # as ncclFloat8 from NCCL 2.24 (else as bytes).
    DTYPES = frozenset(
        {torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8,
         torch.int32, torch.int64, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2,
         torch.float8_e4m3fnuz, torch.float8_e5m2fnuz}
    )  # fmt: skip

    DTYPE = Constraint(
        "NCCL collectives",
        "a dtype NCCL has (ncclDataType_t)",
        f"{UTILS}, the ncclDataType map; {PG}, getNcclDataType ('Input tensor data type is not "
        f"supported for NCCL process group'); {TYPES}",
        "raises TypeError",
    )
    REDUCE_DTYPE = Constraint(
        "NCCL all_reduce/reduce_scatter",
        "a dtype other than float8",
        f"{PG}, allreduce and reduce_scatter: TORCH_CHECK(!isFloat8Type(...), 'Float8 dtypes are "
        "not currenlty supported for NCCL reductions')",
        "raises RuntimeError",
    )
    CONTIGUOUS = Constraint(
        "NCCL collectives",
        "contiguous tensors",
        f"{PG}, check_gpu_single_tensor ('Tensors must be contiguous')",
        "raises ValueError",
    )
    DEVICE = Constraint(
        "NCCL collectives",
        "tensors on the rank's CUDA device",
        f"{PG}, check_gpu_single_tensor ('Tensors must be CUDA and dense')",
        "raises ValueError",
    )
    SAME_DTYPE = Constraint(
        "all_gather_into_tensor/reduce_scatter_tensor/all_to_all_single",
        "output and input of one dtype",
        f"{PG}, _allgather_base / _reduce_scatter_base ('output tensor must have the same type "
        "as input tensor'); ncclAllGather takes one datatype for both buffers, " + COLLS,
        "raises TypeError",
    )
    GATHER_SIZE = Constraint(
        "all_gather_into_tensor",
        "output of world size x input elements",
        f"{PG}, _allgather_base ('output tensor size must be equal to world_size times input "
        f"tensor size'); ncclAllGather recvbuff holds nranks*sendcount, {COLLS}",
        "raises ValueError",
    )
    SCATTER_SIZE = Constraint(
        "reduce_scatter_tensor",
        "input of world size x output elements",
        f"{PG}, _reduce_scatter_base ('input tensor must be the same size as output size times "
        f"world size'); ncclReduceScatter sendbuff holds nranks*recvcount, {COLLS}",
        "raises ValueError",
    )
    ALL_TO_ALL_SIZE = Constraint(
        "all_to_all_single",
        "equal splits: input and output of one size, divisible by the world size",
        f"{PG}, alltoall_base (check_split_sizes: 'Tensor's dim 0 does not divide equally "
        "across group size')",
        "raises ValueError",
    )

    def reduce_dtypes(self) -> frozenset[torch.dtype]:
        """NCCL's reductions: every dtype it moves but float8 (isFloat8Type)."""
        return frozenset(d for d in self.DTYPES if d.itemsize != 1 or not d.is_floating_point)


def install() -> NcclDouble:
    """In a spawned rank: the CUDA adapters call this double instead of torch.distributed."""
    double = NcclDouble()
    NCCL.api = double
    return double
