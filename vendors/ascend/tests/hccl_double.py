"""A TEST DOUBLE of HCCL as torch.distributed drives it (torch_npu's ``ProcessGroupHCCL``).

Not HCCL. It stands in for the ``torch.distributed`` functions the Ascend wheel's collective
adapters call on the engine's ``hccl`` device group, and for torch_npu's own uneven ones
(``torch_npu.distributed.all_gather_into_tensor_uneven`` / ``reduce_scatter_tensor_uneven``),
so they run here without an NPU: the calls go to the gloo group the test ranks share (CPU
tensors stand for the rank's NPU tensors), after every check ``ProcessGroupHCCL`` makes, each a
:class:`~sglang_fl.testing.doubles.Constraint` naming its source: torch_npu's source (``master``,
which builds 2.14.0/2.15.0), the release tags of Ascend/pytorch where a check changed between
releases, and the HCCL API reference (``hccl.h``). It emulates one torch_npu release
(``version``, as ``torch_npu.__version__`` reads) on one SoC (``soc_version``, as
``torch_npu.npu.get_soc_version()`` reports it) and reads ``TORCH_NPU_USE_COMPATIBLE_IMPL``
when built, as torch_npu does at start-up. Its dtype tables and release rules are read from
the sources here, not taken from the adapters.
``install()`` puts it in place in a rank (``run_collective_checks(prepare=...)``).
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

import torch
from sglang_fl_ascend.backend import TORCH_NPU
from sglang_fl_ascend.impl.collectives import COMPATIBLE_IMPL
from torch_npu_double import A2_SOC, DOUBLE_RELEASE, TorchNpuDouble

from sglang_fl.testing.collective_doubles import ProcessGroupDouble
from sglang_fl.testing.doubles import Constraint

PG = "torch_npu/csrc/distributed/ProcessGroupHCCL.cpp"
C10D = "torch_npu/distributed/distributed_c10d.py"
API = "HCCL API reference (CANN), hccl.h"
ASCEND_950 = 260  # SocVersion::Ascend950; A2 is 220-225 and A3 250-255 (IsCompatibleSoc)
TAGS = "Ascend/pytorch tags v7.3.1-pytorch2.7.1/2.8.0/2.9.0 and v26.0.0-pytorch2.7.1/.../2.10.0"

# kScalarTypeToHcclDataType (HCCLUtils.cpp) in the v7.3.1 tags (and every earlier one read):
# bool travels as HCCL_DATA_TYPE_UINT8.
MAPPED = frozenset(
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
# The entries the v26.0.0 tags' map adds (master 6002c111d "[950] Add 950 support": float8;
# 89aa5d16a "add datatypes for HCCLUtils": the unsigned ones); HCCLUtils.cpp:49-65 on master.
MAPPED_FROM_26 = frozenset(
    {torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32, torch.uint64}
)
# A 26.0.0 build (v26.0.0-pytorch2.7.1): what the kit's ranks emulate, so gather is served.
RELEASE_26 = "2.7.1.post4+double"
# The first 26.0.0 build of each line (version.txt of the v26.0.0 tags); 2.10.0 and later lines
# were first built by 26.0.0.
FIRST_26_POST = {"2.7.1": 4, "2.8.0": 4, "2.9.0": 2}
# checkSupportedDataType's supportedDataTypes (ProcessGroupHCCL.cpp:170-178, the same set in
# the v7.2.0 and v7.3.0 tags) and a5ExtraDataTypes (:180-182, master 779d1de6c of 2026-08-20,
# absent from every tag up to v26.2.0-beta.1, whose torch_npu is 2.13.0).
CHECKED = frozenset(
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
A5_EXTRA = frozenset({torch.uint64, torch.float64})


def _release(version: str) -> tuple[tuple[int, int, int], int]:
    """``((major, minor, patch), post)`` of a torch_npu version string."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?", version)
    assert match, version
    return (int(match[1]), int(match[2]), int(match[3])), int(match[4] or 0)


def is_26_build(version: str) -> bool:
    """Whether ``version`` is an Ascend Extension for PyTorch 26.0.0 build or later."""
    release, post = _release(version)
    line = ".".join(map(str, release))
    return release >= (2, 10, 0) or (line in FIRST_26_POST and post >= FIRST_26_POST[line])


class HcclDouble(ProcessGroupDouble):
    """``ProcessGroupHCCL``'s collectives, checked as torch_npu checks them, run on gloo."""

    BACKEND = "hccl"
    # Every dtype any release maps; :meth:`moved_dtypes` is the emulated release's.
    DTYPES = MAPPED | MAPPED_FROM_26

    DTYPE = Constraint(
        "HCCL collectives",
        "a dtype in the release's kScalarTypeToHcclDataType: float8 and uint16/32/64 only from "
        "the Ascend Extension for PyTorch 26.0.0 builds (2.7.1.post4, 2.8.0.post4, 2.9.0.post2, "
        "2.10.0+)",
        "torch_npu/csrc/distributed/HCCLUtils.cpp:49-65, 85-91, getHcclDataType ('Unsupported data "
        f"type for HCCL process group'); {TAGS}",
        "raises RuntimeError",
    )
    REDUCE_DTYPE = Constraint(
        "HCCL all_reduce/reduce_scatter",
        "a dtype checkSupportedDataType takes: int8/16/32/64, float16/32, bfloat16 (uint64 and "
        "float64 on Ascend 950 only, from torch_npu 2.14.0)",
        f"{PG}:170-188, checkSupportedDataType ('HCCL <op>: Unsupported data type'), called by "
        "allreduce (:4765), reduce_scatter (:5982), _reduce_scatter_base (:6234); master "
        "779d1de6c added a5ExtraDataTypes; HCCL API reference, HcclReduceScatterV: dataType of "
        "the reduction",
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
        "all_gather_into_tensor/reduce_scatter_tensor/all_to_all_single and the uneven forms",
        "output and input of one dtype",
        f"{PG}, _allgather_base / _reduce_scatter_base / :5308-5311 ('output tensor must have "
        f"the same type as input tensor'); {API}: one dataType per call",
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
    GATHER_RELEASE = Constraint(
        "gather",
        "an Ascend Extension for PyTorch 26.0.0 build or later",
        f"{PG} ProcessGroupHCCL::gather of the v7.3.1 tags (:5170-5176 in v7.3.0-pytorch2.7.1): "
        f"'ProcessGroupHCCL does not support gather' for every call; {TAGS}",
        "raises RuntimeError",
    )
    GATHER_COMPATIBLE = Constraint(
        "gather",
        "TORCH_NPU_USE_COMPATIBLE_IMPL=1 on an Atlas A2/A3",
        f"{PG}:6535-6540 ('ProcessGroupHCCL does not support gather'), IsCompatibleSoc "
        "(:505-512); torch_npu/csrc/framework/interface/EnvVariables.cpp:293-294 "
        "(CheckCompatibleImpl: the env value '1')",
        "raises RuntimeError",
    )
    UNEVEN_SPLITS = Constraint(
        "all_gather_into_tensor_uneven/reduce_scatter_tensor_uneven",
        "one split size per rank summing to dim 0 of the output (gather) or input (scatter), "
        "or none when dim 0 splits evenly",
        f"{PG}:397-411 (check_split_sizes: 'Number of tensor splits not equal to group size', "
        "'Split sizes doesn't match total dim 0 size'), :381-395 "
        "(fill_equal_split_sizes_when_empty)",
        "raises RuntimeError",
    )
    UNEVEN_OWN_ROWS = Constraint(
        "all_gather_into_tensor_uneven/reduce_scatter_tensor_uneven",
        "this rank's input (gather) or output (scatter) holds exactly its split's rows",
        f"{API}, HcclAllGatherV (sendCount = recvCounts[rank]) and HcclReduceScatterV "
        "(recvCount = sendCounts[rank]); ProcessGroupHCCL.cpp:5301-5540 passes the counts "
        "unchecked",
        "reads or writes the wrong rows",
    )
    UNEVEN_NPU = Constraint(
        "all_gather_into_tensor_uneven/reduce_scatter_tensor_uneven",
        "NPU tensors",
        f"{C10D}:418-420, 446-448 ('Support for Tensors is limited to those of type npu')",
        "warns and returns without communicating",
    )

    def __init__(
        self,
        device: torch.device | None = None,
        *,
        version: str = DOUBLE_RELEASE,
        soc_version: int = A2_SOC,
        compatible_impl: bool | None = None,
    ) -> None:
        super().__init__(device)
        self.torch_npu_version = version
        self.soc_version = soc_version
        self.compatible_impl = (
            os.environ.get(COMPATIBLE_IMPL) == "1" if compatible_impl is None else compatible_impl
        )

    def moved_dtypes(self) -> frozenset[torch.dtype]:
        return MAPPED | (MAPPED_FROM_26 if is_26_build(self.torch_npu_version) else frozenset())

    def reduce_dtypes(self) -> frozenset[torch.dtype]:
        a5 = self.soc_version >= ASCEND_950 and _release(self.torch_npu_version)[0] >= (2, 14, 0)
        return CHECKED | (A5_EXTRA if a5 else frozenset())

    def gather(
        self,
        tensor: torch.Tensor,
        gather_list: list[torch.Tensor] | None = None,
        dst: int = 0,
        group: Any = None,
    ) -> None:
        self.GATHER_RELEASE.check(
            is_26_build(self.torch_npu_version), f"torch_npu {self.torch_npu_version}"
        )
        a2_or_a3 = 220 <= self.soc_version < 240 or 250 <= self.soc_version < ASCEND_950
        self.GATHER_COMPATIBLE.check(
            self.compatible_impl and a2_or_a3,
            f"{COMPATIBLE_IMPL}={'1' if self.compatible_impl else 'unset'}, SoC {self.soc_version}",
        )
        super().gather(tensor, gather_list, dst, group)

    def _uneven(
        self,
        whole: torch.Tensor,
        part: torch.Tensor,
        splits: list[int] | None,
        group: Any,
    ) -> list[int]:
        """The checks of both uneven forms; ``whole`` is split into ``part``s by ``splits``."""
        self.UNEVEN_NPU.check(self.device == whole.device == part.device, str(whole.device))
        self._pair(whole, part)
        dist = self._gloo()
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        rows = int(whole.shape[0])
        if not splits:
            self.UNEVEN_SPLITS.check(rows % n == 0, f"{rows} rows over {n} ranks, no splits")
            splits = [rows // n] * n
        self.UNEVEN_SPLITS.check(
            len(splits) == n and sum(splits) == rows, f"{splits} over {rows} rows, {n} ranks"
        )
        row = whole[0].numel() if rows else 1
        self.UNEVEN_OWN_ROWS.check(
            part.numel() == splits[rank] * row, f"{tuple(part.shape)} for split {splits[rank]}"
        )
        return splits

    def all_gather_into_tensor_uneven(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int] | None = None,
        group: Any = None,
        async_op: bool = False,
    ) -> None:
        self.record("all_gather_into_tensor_uneven", output, input, output_split_sizes, group=group)
        splits = self._uneven(output, input, output_split_sizes, group)
        widest = max(splits)
        padded = input.new_zeros((widest, *input.shape[1:]))
        padded[: input.shape[0]] = input
        everyone = input.new_empty((len(splits) * widest, *input.shape[1:]))
        self._gloo().all_gather_into_tensor(everyone, padded, group=group)
        parts = [everyone[r * widest : r * widest + k] for r, k in enumerate(splits)]
        output.copy_(torch.cat(parts))

    def reduce_scatter_tensor_uneven(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        input_split_sizes: list[int] | None = None,
        op: Any = None,
        group: Any = None,
        async_op: bool = False,
    ) -> None:
        self.record("reduce_scatter_tensor_uneven", output, input, input_split_sizes, group=group)
        self._reduced(output, input)
        splits = self._uneven(input, output, input_split_sizes, group)
        reduced = input.clone()
        self._gloo().all_reduce(reduced, group=group)
        rank = self._gloo().get_rank(group)
        start = sum(splits[:rank])
        output.copy_(reduced[start : start + splits[rank]])


def install() -> HcclDouble:
    """In a spawned rank: the Ascend adapters call this double instead of torch.distributed
    and torch_npu.distributed, with the torch_npu double (a 26.0.0 build on an Atlas A2) as
    ``torch_npu``."""
    from sglang_fl_ascend.impl.collectives import HCCL

    sdk = TorchNpuDouble(version=RELEASE_26)
    sys.modules[TORCH_NPU.name] = sdk
    TORCH_NPU.module = sdk
    double = HcclDouble(version=RELEASE_26)
    HCCL.api = double
    return double
