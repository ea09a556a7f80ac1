"""The HCCL adapters against the HCCL double (``hccl_double.py``), on 2 and 4 spawned ranks.

The kit (``run_collective_checks``) spawns gloo ranks, puts the double in place in each
(``prepare``), sets up this wheel's communicator for the group (the real lifecycle of
``sglang_fl.communicators``) and checks every case and dtype of every collective it serves; one hard
timeout fails a hang. Uneven gathers and scatters are declined and served by the reference,
so those cases pass too. Then: the refusals (before anything is sent) and the lifecycle's
failure path (a group not on HCCL).
"""

from __future__ import annotations

import pytest
import torch
from hccl_double import HcclDouble
from sglang_fl_ascend import plugin
from sglang_fl_ascend.impl.collectives import HCCL, LEFT_TO_SGLANG

from sglang_fl import Unsupported
from sglang_fl.ops.collectives import COLLECTIVES
from sglang_fl.testing.collective_doubles import process_group_double_tests
from sglang_fl.testing.collectives import run_collective_checks
from sglang_fl.testing.vendor import VendorSuite
from sglang_fl.types import CollectiveGroup

SUITE = VendorSuite("ascend", plugin.sglang_fl_register_ops)
KIT_TIMEOUT = 400.0
ALL = [contract.name for contract in COLLECTIVES if contract.name not in LEFT_TO_SGLANG]


def test_registers_every_collective_but_the_quantised_all_reduce() -> None:
    assert set(LEFT_TO_SGLANG) == {"quant_all_reduce"}
    assert {op for op in SUITE.ops if op in ALL} == set(ALL)
    for op in ALL:
        assert SUITE.implementations[op].impl_id == "vendor.ascend"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("world_size", [2, 4])
def test_adapters_pass_the_kit_on_the_double(world_size: int) -> None:
    results = run_collective_checks(
        world_size,
        dict.fromkeys(ALL, "vendor.ascend"),
        ops=ALL,
        plugin="ascend",
        prepare="hccl_double:install",
        timeout=KIT_TIMEOUT,
    )
    assert {r.op for r in results} == set(ALL)
    failed = [f"{r.case_id}: {r.message}" for r in results if not r.passed]
    assert failed == []
    # Declined on every rank alike, before sending: the uneven counts, nothing else (the
    # gatherv contract's list and into-output forms have uneven counts too).
    declined = {(r.op, r.case) for r in results if r.declined}
    assert declined == {
        (r.op, r.case)
        for r in results
        if (r.op == "all_gatherv" and not r.case.endswith(",even"))
        or (r.op == "reduce_scatterv" and ",uneven" in r.case)
    }
    assert all("HcclAllGather sendCount" in r.message for r in results if r.declined)


def group(device: str = "cpu", world_size: int = 2) -> CollectiveGroup:
    """A group's description; refused calls never reach its (absent) process groups."""
    return CollectiveGroup("tp:0", tuple(range(world_size)), 0, torch.device(device), None, None)


@pytest.fixture
def hccl(monkeypatch: pytest.MonkeyPatch) -> HcclDouble:
    double = HcclDouble()
    monkeypatch.setattr(HCCL, "api", double)
    return double


@pytest.mark.parametrize(
    ("tensor", "device", "why"),
    [
        (torch.zeros(4, 8)[:, ::2], "cpu", "non-contiguous"),
        (torch.zeros(4, dtype=torch.complex64), "cpu", r"dtype torch\.complex64"),
        # without torch_npu, torch names the NPU device type privateuseone
        (torch.zeros(4), "privateuseone:0", "not the communicator.s device privateuseone:0"),
    ],
    ids=["strided", "complex", "host-tensor"],
)
def test_refusals_name_the_limit_and_its_source_before_sending(
    hccl: HcclDouble, tensor: torch.Tensor, device: str, why: str
) -> None:
    adapters = HCCL.implementations()
    calls = {
        "all_reduce": lambda: adapters["all_reduce"](group(device), tensor),
        "broadcast": lambda: adapters["broadcast"](group(device), tensor, 0),
        "all_gather": lambda: adapters["all_gather"](group(device), tensor, 0),
        "send": lambda: adapters["send"](group(device), tensor, 1),
    }
    for op, call in calls.items():
        with pytest.raises(Unsupported, match=why) as info:
            call()
        assert f"HCCL {op}:" in str(info.value)
        assert "ProcessGroupHCCL.cpp" in str(info.value)
    assert hccl.calls == []


def test_uneven_gathers_and_scatters_are_declined_with_the_reason(hccl: HcclDouble) -> None:
    adapters = HCCL.implementations()
    x = torch.zeros(3, 4)
    with pytest.raises(Unsupported, match=r"uneven sizes \[3, 1\].*HcclAllGather sendCount"):
        adapters["all_gatherv"](group(), x, [3, 1])
    with pytest.raises(Unsupported, match=r"uneven sizes \[1, 3\].*pynccl only"):
        adapters["reduce_scatterv"](group(), torch.zeros(4, 4), None, [1, 3])
    assert hccl.calls == []


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strict", [False, True], ids=["fallback", "strict"])
def test_a_group_not_on_hccl_keeps_the_reference_or_fails_strictly(strict: bool) -> None:
    """Without the double the kit's device group is what it is, gloo: this wheel's
    communicator hook refuses it on every rank (the engine's lifecycle, core's machinery)."""
    results = run_collective_checks(
        2,
        {"all_reduce": "vendor.ascend"},
        ops=["all_reduce"],
        plugin="ascend",
        timeout=KIT_TIMEOUT,
        env={"SGLANG_FL_STRICT": "1"} if strict else {},
    )
    assert results
    assert not any(r.passed for r in results)
    message = results[0].message
    assert "HCCL: group 'kit:2'" in message
    assert "has a 'gloo' device group" in message
    if strict:
        assert "StrictModeError: SGLANG_FL_STRICT=1: plugin 'ascend': communicator for" in message
    else:
        assert "the communicator could not be set up: sglang_fl_communicator raised" in message


# The double refuses what ProcessGroupHCCL refuses, one constraint at a time
# (sources in hccl_double.py).
test_valid_calls_pass, test_rejects_what_the_library_rejects, test_every_constraint_is_covered = (
    process_group_double_tests(HcclDouble)
)
