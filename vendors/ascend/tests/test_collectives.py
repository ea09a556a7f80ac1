"""The HCCL adapters against the HCCL double (``hccl_double.py``), on 2 and 4 spawned ranks.

The kit (``run_collective_checks``) spawns gloo ranks, puts the double in place in each
(``prepare``: the HCCL double and the torch_npu double of an Atlas A2), sets up this wheel's
communicator for the group (the real lifecycle of ``sglang_fl.communicators``) and checks
every case and dtype of every collective it serves; one hard timeout fails a hang. Uneven
gathers and scatters go through torch_npu's own uneven calls; ``gather`` is served only with
``TORCH_NPU_USE_COMPATIBLE_IMPL=1`` (declined, so the reference serves it, otherwise). Then:
the refusals (before anything is sent), per-kind dtypes, and the lifecycle's failure path (a
group not on HCCL).
"""

from __future__ import annotations

import pytest
import torch
from hccl_double import ASCEND_950, RELEASE_26, HcclDouble
from sglang_fl_ascend import plugin
from sglang_fl_ascend.impl.collectives import COMPATIBLE_IMPL, HCCL, LEFT_TO_SGLANG
from torch_npu_double import TorchNpuDouble

from sglang_fl import Unsupported
from sglang_fl.ops.collectives import COLLECTIVES
from sglang_fl.testing.collective_doubles import process_group_double_tests, world_of_one
from sglang_fl.testing.collectives import run_collective_checks
from sglang_fl.testing.doubles import ConstraintViolation, install_double
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
    """With the compatible implementation on, HCCL serves every case, uneven ones included."""
    results = run_collective_checks(
        world_size,
        dict.fromkeys(ALL, "vendor.ascend"),
        ops=ALL,
        plugin="ascend",
        prepare="hccl_double:install",
        timeout=KIT_TIMEOUT,
        env={COMPATIBLE_IMPL: "1"},
    )
    assert {r.op for r in results} == set(ALL)
    failed = [f"{r.case_id}: {r.message}" for r in results if not r.passed]
    assert failed == []
    assert [r.case_id for r in results if r.declined] == []


@pytest.mark.timeout(300)
def test_without_the_compatible_implementation_gather_is_left_to_the_reference() -> None:
    results = run_collective_checks(
        2,
        {"gather": "vendor.ascend"},
        ops=["gather"],
        dtypes=["float32"],
        plugin="ascend",
        prepare="hccl_double:install",
        timeout=KIT_TIMEOUT,
    )
    assert results
    assert all(r.passed and r.declined for r in results)
    assert all(f"needs {COMPATIBLE_IMPL}=1" in r.message for r in results)


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
        assert "torch_npu/csrc/distributed/" in str(info.value)
    assert hccl.calls == []


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bool, torch.float64])
def test_reductions_decline_what_checksupporteddatatype_rejects_on_a2(
    hccl: HcclDouble, torch_npu: TorchNpuDouble, dtype: torch.dtype
) -> None:
    """HCCL moves these dtypes but does not reduce them on an Atlas A2/A3."""
    adapters = HCCL.implementations()
    x = torch.zeros(4, 2, dtype=dtype)
    calls = {
        "all_reduce": lambda: adapters["all_reduce"](group(), x),
        "reduce_scatter_tensor": lambda: adapters["reduce_scatter_tensor"](group(), x[:2], x),
        "reduce_scatterv": lambda: adapters["reduce_scatterv"](group(), x, None, [1, 3]),
        "reduce_scatter": lambda: adapters["reduce_scatter"](group(), x[:2], [x[:2], x[2:]]),
    }
    for op, call in calls.items():
        with pytest.raises(Unsupported, match=f"dtype {dtype} is not one its reduction") as info:
            call()
        assert f"HCCL {op}:" in str(info.value)
        assert "checkSupportedDataType" in str(info.value)
    assert hccl.calls == []
    with world_of_one():  # moved, not reduced: a one-rank broadcast goes through
        adapters["broadcast"](CollectiveGroup("tp:0", (0,), 0, torch.device("cpu"), None, None), x)
    assert hccl.called == ["broadcast"]


def on_release(monkeypatch: pytest.MonkeyPatch, version: str, soc: int = 220) -> HcclDouble:
    """The torch_npu double and the HCCL double of one release and SoC, in place."""
    from sglang_fl_ascend.backend import TORCH_NPU

    install_double(monkeypatch, TorchNpuDouble(version=version, soc_version=soc), TORCH_NPU)
    double = HcclDouble(version=version, soc_version=soc)
    monkeypatch.setattr(HCCL, "api", double)
    return double


ONE = CollectiveGroup("tp:0", (0,), 0, torch.device("cpu"), None, None)


def test_float64_reductions_run_on_ascend_950_from_2_14(monkeypatch: pytest.MonkeyPatch) -> None:
    """checkSupportedDataType's a5ExtraDataTypes: master 779d1de6c, no tag up to 2.13.0."""
    x = torch.ones(3, dtype=torch.float64)
    older = on_release(monkeypatch, "2.13.0", ASCEND_950)
    with pytest.raises(Unsupported, match=r"float64 is not one its reduction.*2\.14\.0\+"):
        HCCL.implementations()["all_reduce"](ONE, x)
    with pytest.raises(ConstraintViolation, match="checkSupportedDataType"):
        older.all_reduce(x)
    double = on_release(monkeypatch, "2.14.0", ASCEND_950)
    with world_of_one():
        HCCL.implementations()["all_reduce"](ONE, x)
    assert double.called == ["all_reduce"]
    with pytest.raises(Unsupported, match=r"dtype torch\.uint8"):
        HCCL.implementations()["all_reduce"](ONE, torch.ones(3, dtype=torch.uint8))


def test_float8_moves_but_is_not_reduced(monkeypatch: pytest.MonkeyPatch) -> None:
    hccl = on_release(monkeypatch, RELEASE_26)
    x = torch.zeros(4, dtype=torch.float8_e4m3fn)
    with world_of_one():
        HCCL.implementations()["all_gather_into_tensor"](ONE, x.clone(), x)
    assert hccl.called == ["all_gather_into_tensor"]
    with pytest.raises(Unsupported, match="float8_e4m3fn is not one its reduction"):
        HCCL.implementations()["all_reduce"](ONE, x)


@pytest.mark.parametrize("dtype", [torch.float8_e5m2, torch.uint16, torch.uint64])
@pytest.mark.parametrize("version", ["2.7.1.post3", "2.8.0.post3", "2.9.0.post1", "2.6.0.post6"])
def test_before_26_0_0_float8_and_wide_unsigned_do_not_move(
    monkeypatch: pytest.MonkeyPatch, version: str, dtype: torch.dtype
) -> None:
    """The v7.3.1 builds' kScalarTypeToHcclDataType has neither: getHcclDataType raises."""
    double = on_release(monkeypatch, version)
    x = torch.zeros(4, dtype=dtype)
    with pytest.raises(
        Unsupported, match=r"from the Ascend Extension for PyTorch 26\.0\.0"
    ) as info:
        HCCL.implementations()["broadcast"](group(), x, 0)
    assert "v7.3.1-pytorch2.x (without)" in str(info.value)
    assert double.calls == []
    with pytest.raises(ConstraintViolation, match="kScalarTypeToHcclDataType"):
        double.broadcast(x, 0)


def test_before_26_0_0_gather_is_declined_even_when_compatible(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ProcessGroupHCCL::gather raised for every call before the 26.0.0 builds."""
    monkeypatch.setenv(COMPATIBLE_IMPL, "1")
    double = on_release(monkeypatch, "2.9.0.post1")
    with pytest.raises(Unsupported, match=r"always raises before .*2\.9\.0\.post2"):
        HCCL.implementations()["gather"](group(), torch.zeros(2, 3), 0)
    assert double.calls == []
    for version in ("2.9.0.post2", "2.10.0", "2.12.0"):
        on_release(monkeypatch, version)
        with world_of_one():
            HCCL.implementations()["gather"](ONE, torch.zeros(2, 3), 0)


@pytest.mark.parametrize(
    ("env", "soc", "why"),
    [
        (None, 220, f"needs {COMPATIBLE_IMPL}=1"),
        ("0", 220, f"needs {COMPATIBLE_IMPL}=1"),
        ("1", ASCEND_950, "Atlas A2/A3 only"),
    ],
    ids=["unset", "off", "ascend-950"],
)
def test_gather_is_declined_where_processgrouphccl_gather_raises(
    monkeypatch: pytest.MonkeyPatch, env: str | None, soc: int, why: str
) -> None:
    if env is None:
        monkeypatch.delenv(COMPATIBLE_IMPL, raising=False)
    else:
        monkeypatch.setenv(COMPATIBLE_IMPL, env)
    double = on_release(monkeypatch, RELEASE_26, soc)
    with pytest.raises(Unsupported, match=why) as info:
        HCCL.implementations()["gather"](group(), torch.zeros(2, 3), 0)
    assert "ProcessGroupHCCL.cpp:6535-6540" in str(info.value)
    assert double.calls == []


def test_a_release_without_the_uneven_calls_declines_them(
    monkeypatch: pytest.MonkeyPatch, torch_npu: TorchNpuDouble
) -> None:
    """torch_npu releases before the uneven collectives: uneven sizes are declined by name
    (the reference pads and serves them); even ones still go through HCCL."""

    class OlderHccl(HcclDouble):
        all_gather_into_tensor_uneven = None
        reduce_scatter_tensor_uneven = None

    old = OlderHccl()
    monkeypatch.setattr(HCCL, "api", old)
    adapters = HCCL.implementations()
    with pytest.raises(Unsupported, match=r"uneven sizes \[3, 1\].*all_gather_into_tensor_uneven"):
        adapters["all_gatherv"](group(), torch.zeros(3, 4), [3, 1])
    with pytest.raises(Unsupported, match=r"uneven sizes \[1, 3\].*reduce_scatter_tensor_uneven"):
        adapters["reduce_scatterv"](group(), torch.zeros(4, 4), None, [1, 3])
    assert old.calls == []


def test_arguments_are_checked_as_the_references_check_them(hccl: HcclDouble) -> None:
    """One validator (core's ``ops.collectives.arguments``) for references and libraries."""
    adapters = HCCL.implementations()
    with pytest.raises(
        ValueError, match=r"all_gatherv: this rank's input has 3 rows, sizes says 1"
    ):
        adapters["all_gatherv"](group(), torch.zeros(3, 4), [1, 3])
    with pytest.raises(ValueError, match=r"reduce_scatterv: sizes=\[1, 2\] must have 2 entries"):
        adapters["reduce_scatterv"](group(), torch.zeros(4, 4), None, [1, 2])
    with pytest.raises(ValueError, match=r"broadcast: src=2 is not a rank of the 2-rank group"):
        adapters["broadcast"](group(), torch.zeros(4), 2)
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
# (sources in hccl_double.py); gather needs the compatible implementation.
FLOAT8 = torch.float8_e5m2


def _z(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


def _before_26(d: HcclDouble) -> None:
    d.torch_npu_version = "2.8.0.post3"
    d.gather(_z(3), [_z(3)], 0)


def _incompatible(d: HcclDouble) -> None:
    d.compatible_impl = False
    d.gather(_z(3), [_z(3)], 0)


test_valid_calls_pass, test_rejects_what_the_library_rejects, test_every_constraint_is_covered = (
    process_group_double_tests(
        lambda: HcclDouble(version=RELEASE_26, compatible_impl=True),
        valid=[
            lambda d: d.all_gather_into_tensor_uneven(_z(3, 2), _z(3, 2), [3]),
            lambda d: d.all_gather_into_tensor_uneven(_z(0, 2), _z(0, 2)),
            lambda d: d.reduce_scatter_tensor_uneven(_z(2), _z(2), [2]),
            lambda d: d.all_gather_into_tensor(_z(2, dtype=FLOAT8), _z(2, dtype=FLOAT8)),
        ],
        rejected={
            HcclDouble.GATHER_RELEASE: _before_26,
            HcclDouble.GATHER_COMPATIBLE: _incompatible,
            HcclDouble.UNEVEN_SPLITS: lambda d: d.all_gather_into_tensor_uneven(
                _z(3, 2), _z(3, 2), [3, 0]
            ),
            HcclDouble.UNEVEN_OWN_ROWS: lambda d: d.reduce_scatter_tensor_uneven(
                _z(1), _z(2), [2]
            ),
            HcclDouble.UNEVEN_NPU: lambda d: d.all_gather_into_tensor_uneven(
                torch.zeros(2, device="meta"), torch.zeros(2, device="meta"), [2]
            ),
        },
    )
)  # fmt: skip
