"""The NCCL adapters against the NCCL double (``nccl_double.py``), on 2 and 4 spawned ranks.

The kit (``run_collective_checks``) spawns gloo ranks, puts the double in place in each
(``prepare``), sets up this wheel's communicator for the group (the real lifecycle of
``sglang_fl.communicators``) and checks every case and dtype of the served collectives; one
hard timeout fails a hang. Then: what is left to SGLang, the refusals (before anything is
sent), and the lifecycle's failure path (a group not on NCCL).
"""

from __future__ import annotations

import pytest
import torch
from nccl_double import NcclDouble
from sglang_fl_cuda import plugin
from sglang_fl_cuda.impl.collectives import FLOAT8, LEFT_TO_SGLANG, NCCL, SERVED

from sglang_fl import Unsupported
from sglang_fl.ops.collectives import COLLECTIVES
from sglang_fl.testing.collective_doubles import process_group_double_tests, world_of_one
from sglang_fl.testing.collectives import run_collective_checks
from sglang_fl.testing.vendor import VendorSuite
from sglang_fl.types import CollectiveGroup

SUITE = VendorSuite("cuda", plugin.sglang_fl_register_ops)
KIT_TIMEOUT = 240.0
SERVED_BY_CUDA = {op: "vendor.cuda" for op in SERVED}


def test_serves_the_single_call_collectives_and_leaves_the_rest_to_sglang() -> None:
    collectives = {contract.name for contract in COLLECTIVES}
    registered = {op for op in SUITE.ops if op in collectives}
    assert registered == {"broadcast", "send", "recv", "gather", "reduce_scatter"}
    assert set(LEFT_TO_SGLANG) == collectives - registered
    for op, reason in LEFT_TO_SGLANG.items():
        (gap,) = SUITE.registry.no_kernel(op)
        assert gap.reason == reason
        assert "SGLang's own CUDA path" in reason
        assert "GroupCoordinator." in reason


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world_size", [2, 4])
def test_adapters_pass_the_kit_on_the_double(world_size: int) -> None:
    results = run_collective_checks(
        world_size,
        SERVED_BY_CUDA,
        ops=SERVED,
        plugin="cuda",
        prepare="nccl_double:install",
        timeout=KIT_TIMEOUT,
    )
    assert results, "the kit ran no case"
    failed = [f"{r.case_id}: {r.message}" for r in results if not r.passed]
    assert failed == []
    assert {r.op for r in results} == set(SERVED)


def group(device: str = "cpu") -> CollectiveGroup:
    """A 2-rank group's description; refused calls never reach its (absent) process groups."""
    return CollectiveGroup("tp:0", (0, 1), 0, torch.device(device), None, None)


@pytest.fixture
def nccl(monkeypatch: pytest.MonkeyPatch) -> NcclDouble:
    double = NcclDouble()
    monkeypatch.setattr(NCCL, "api", double)
    return double


@pytest.mark.parametrize(
    ("tensor", "device", "why"),
    [
        (torch.zeros(4, 8)[:, ::2], "cpu", "non-contiguous"),
        (torch.zeros(4, dtype=torch.complex64), "cpu", "dtype torch.complex64"),
        (torch.zeros(4), "cuda:0", "not the communicator's device cuda:0"),
    ],
    ids=["strided", "complex", "host-tensor"],
)
def test_refusals_name_the_limit_and_its_source_before_sending(
    nccl: NcclDouble, tensor: torch.Tensor, device: str, why: str
) -> None:
    adapters = NCCL.implementations(SERVED)
    for call in (
        lambda: adapters["broadcast"](group(device), tensor, 0),
        lambda: adapters["send"](group(device), tensor, 1),
    ):
        with pytest.raises(Unsupported, match=why) as info:
            call()
        assert "ProcessGroupNCCL.cpp" in str(info.value)
    with pytest.raises(Unsupported, match=r"dtype torch\.complex64"):
        adapters["recv"](group(), torch.Size([2]), torch.complex64, 1)
    assert nccl.calls == []


@pytest.mark.parametrize("dtype", sorted(FLOAT8, key=str))
def test_float8_moves_but_is_not_reduced(nccl: NcclDouble, dtype: torch.dtype) -> None:
    """NCCL moves float8 (ncclFloat8 or bytes) in broadcast, send, recv, gather; its
    reductions refuse it (reduce_scatter: declined, the reference serves)."""
    one = CollectiveGroup("tp:0", (0,), 0, torch.device("cpu"), None, None)
    adapters = NCCL.implementations(SERVED)
    x = torch.arange(6, dtype=torch.float32).to(dtype) if dtype.itemsize == 1 else None
    assert x is not None
    wire = dtype in (torch.float8_e4m3fn, torch.float8_e5m2)  # what gloo itself can carry
    with world_of_one():
        if wire:
            assert (
                adapters["broadcast"](one, x.clone(), 0)
                .view(torch.uint8)
                .equal(x.view(torch.uint8))
            )
            gathered = adapters["gather"](one, x, 0, 0)
            assert gathered is not None
            assert gathered.view(torch.uint8).equal(x.view(torch.uint8))
        else:  # accepted by the adapter's checks (the double's gloo world cannot carry fnuz)
            NCCL.check_tensors("send", one, x)
        with pytest.raises(Unsupported, match=rf"dtype {dtype} is not one its reduction"):
            adapters["reduce_scatter"](one, x.clone(), [x])
    assert all(name != "reduce_scatter" for name in nccl.called)


def test_uneven_gathers_would_be_served() -> None:
    """NCCL itself takes uneven gathers (ProcessGroupNCCL coalesces broadcasts): the library
    declines none; this wheel leaves them to SGLang's pynccl instead."""
    assert NCCL.uneven is None
    NCCL.check_even("all_gatherv", [1, 0, 3])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strict", [False, True], ids=["fallback", "strict"])
def test_a_group_not_on_nccl_keeps_the_reference_or_fails_strictly(strict: bool) -> None:
    """Without the double the kit's device group is what it is, gloo: this wheel's
    communicator hook refuses it on every rank (the engine's lifecycle, core's machinery)."""
    results = run_collective_checks(
        2,
        SERVED_BY_CUDA,
        ops=["broadcast"],
        plugin="cuda",
        timeout=KIT_TIMEOUT,
        env={"SGLANG_FL_STRICT": "1"} if strict else {},
    )
    assert results
    assert not any(r.passed for r in results)
    message = results[0].message
    assert "NCCL: group 'kit:2'" in message
    assert "has a 'gloo' device group" in message
    if strict:
        assert "StrictModeError: SGLANG_FL_STRICT=1: plugin 'cuda': communicator for group" in (
            message
        )
    else:
        assert "the communicator could not be set up: sglang_fl_communicator raised" in message


# The double refuses what ProcessGroupNCCL refuses, one constraint at a time
# (sources in nccl_double.py).
FP8 = torch.float8_e5m2
test_valid_calls_pass, test_rejects_what_the_library_rejects, test_every_constraint_is_covered = (
    process_group_double_tests(
        NcclDouble,
        valid=[
            lambda d: d.broadcast(torch.zeros(3, dtype=torch.float8_e4m3fn), 0),
            lambda d: d.gather(
                torch.zeros(3, dtype=torch.float8_e5m2),
                [torch.zeros(3, dtype=torch.float8_e5m2)],
                0,
            ),
        ],
    )
)
