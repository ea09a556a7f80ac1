"""``ProcessGroupLibrary``: the collective adapters core builds for NCCL, HCCL and the like.

The argument checks are the references' own (one validator, ``ops.collectives.arguments``),
the dtypes are checked per kind of collective (what a library moves vs what it reduces),
runtime requirements and missing uneven calls decline before anything is sent, and a library
without uneven calls of its own serves uneven sizes through its even ones: checked against
the contracts on 2 real ranks by the kit, with a throwaway plugin that registers the adapters
of gloo itself.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from sglang_fl import Unsupported
from sglang_fl.collective_library import (
    KINDS,
    CollectiveKind,
    DtypeSet,
    ProcessGroupLibrary,
    UnevenCalls,
)
from sglang_fl.ops import get_contract
from sglang_fl.ops.collectives import COLLECTIVES
from sglang_fl.testing.collectives import run_collective_checks
from sglang_fl.types import CollectiveGroup

FLOATS = frozenset({torch.float32, torch.float16, torch.bfloat16})


class Recorder:
    """``torch.distributed`` stand-in for refusal tests: records, never communicates."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> None:
            self.calls.append((name, args))

        return call


def library(**options: Any) -> ProcessGroupLibrary:
    base: dict[str, Any] = {
        "name": "LIB",
        "backend": "lib",
        "dtypes": FLOATS | {torch.uint8},
        "dtypes_source": "lib.h, the dtype table",
        "layout_source": "lib.h, dense buffers",
    }
    return ProcessGroupLibrary(**{**base, **options})


def group(world_size: int = 2, rank: int = 0) -> CollectiveGroup:
    return CollectiveGroup("tp:0", tuple(range(world_size)), rank, torch.device("cpu"), None, None)


def test_every_collective_but_the_quantised_all_reduce_has_a_kind() -> None:
    assert set(KINDS) == {c.name for c in COLLECTIVES} - {"quant_all_reduce"}
    reductions = {op for op, kind in KINDS.items() if kind is CollectiveKind.REDUCE}
    assert reductions == {
        "all_reduce",
        "reduce_scatter_tensor",
        "reduce_scatterv",
        "reduce_scatter",
    }


def test_reductions_take_their_own_dtypes_moves_take_the_library_s() -> None:
    api = Recorder()
    lib = library(reduce_dtypes=DtypeSet(FLOATS, "lib.h, reduction types"), api=api)
    adapters = lib.implementations()
    byte = torch.zeros(4, dtype=torch.uint8)
    with pytest.raises(Unsupported, match=r"LIB all_reduce: dtype torch.uint8 is not one its "
                       r"reduction collectives take \(bfloat16, float16, float32\) "
                       r"\(source: lib.h, reduction types\)"):  # fmt: skip
        adapters["all_reduce"](group(), byte)
    adapters["broadcast"](group(), byte, 1)
    assert [name for name, _ in api.calls] == ["broadcast"]


def test_moves_of_release_dependent_dtypes_follow_the_release() -> None:
    api = Recorder()
    newer = [False]
    moves = DtypeSet(FLOATS, "lib.h, 2.x", frozenset({torch.float8_e5m2}), lambda: newer[0], "2.x+")
    lib = library(move_dtypes=moves, api=api)
    adapters = lib.implementations()
    eight = torch.zeros(4, dtype=torch.float8_e5m2)
    with pytest.raises(Unsupported, match=r"float8_e5m2 is not one its data movement .*2\.x\+"):
        adapters["broadcast"](group(), eight, 1)
    newer[0] = True
    adapters["broadcast"](group(), eight, 1)
    with pytest.raises(Unsupported, match=r"dtype torch.uint8 is not one its data movement"):
        adapters["broadcast"](group(), torch.zeros(4, dtype=torch.uint8), 1)  # not in move_dtypes
    assert [name for name, _ in api.calls] == ["broadcast"]


def test_device_dependent_dtypes_are_asked_only_for_those_dtypes() -> None:
    asked: list[bool] = []

    def on_this_device() -> bool:
        asked.append(True)
        return True

    dtypes = DtypeSet(FLOATS, "lib.h", frozenset({torch.float64}), on_this_device, "on X only")
    assert dtypes.allows(torch.float16)
    assert not dtypes.allows(torch.complex64)
    assert not asked
    assert dtypes.allows(torch.float64)
    assert asked == [True]
    assert dtypes.describe() == "bfloat16, float16, float32; float64 on X only"


def test_a_requirement_that_does_not_hold_declines_before_sending() -> None:
    api = Recorder()
    lib = library(api=api, requirements={"gather": lambda: "needs LIB_GATHER=1 (lib.cpp:10)"})
    with pytest.raises(Unsupported, match=r"LIB gather: needs LIB_GATHER=1 \(lib.cpp:10\)"):
        lib.implementations()["gather"](group(), torch.zeros(3))
    assert api.calls == []
    holds = library(api=api, requirements={"gather": lambda: None})
    holds.implementations()["gather"](group(), torch.zeros(3), 1)
    assert [name for name, _ in api.calls] == ["gather"]


def test_uneven_sizes_go_to_the_library_s_own_calls() -> None:
    api = Recorder()
    calls = UnevenCalls("lib.distributed", "gather_v", "scatter_v", "lib/distributed.py:10")
    lib = library(api=api, uneven=calls)
    x = torch.zeros(3, 4)
    (out,) = lib.implementations()["all_gatherv"](group(), x, [3, 1])
    scattered = lib.implementations()["reduce_scatterv"](group(), torch.zeros(4, 4), None, [1, 3])
    (name, (output, input, splits)), (name2, (output2, _, splits2)) = api.calls
    assert (name, splits, name2, splits2) == ("gather_v", [3, 1], "scatter_v", [1, 3])
    assert output is out
    assert out.shape == (4, 4)
    assert input is x
    assert output2 is scattered
    assert scattered.shape == (1, 4)


def test_a_release_without_the_uneven_calls_declines_uneven_sizes_only() -> None:
    calls = UnevenCalls("sglang_fl_no_such_module", "gather_v", "scatter_v", "lib/d.py:10")
    lib = library(uneven=calls)
    with pytest.raises(
        Unsupported,
        match=r"LIB all_gatherv: uneven sizes \[3, 1\]: sglang_fl_no_such_module.gather_v needed, "
        r"it has none \(source: lib/d.py:10\)",
    ):
        lib.implementations()["all_gatherv"](group(), torch.zeros(3, 4), [3, 1])
    refused = library(uneven="lib.h: one count for every rank")
    with pytest.raises(Unsupported, match=r"uneven sizes \[1, 3\] \(source: lib.h: one count"):
        refused.implementations()["reduce_scatterv"](group(), torch.zeros(4, 4), None, [1, 3])


@pytest.mark.parametrize(
    ("op", "args", "message"),
    [
        ("all_gather", (torch.zeros(2, 3), 2), r"all_gather: dim=2 is out of range for shape"),
        ("gather", (torch.zeros(2, 3), 2), r"gather: dst=2 is not a rank of the 2-rank group"),
        ("broadcast", (torch.zeros(2), -1), r"broadcast: src=-1 is not a rank of the 2-rank"),
        ("all_gatherv", ([torch.zeros(1, 2)], None, torch.zeros(2, 2)), r"requires a single-"),
        ("all_gatherv", (torch.zeros(2, 3), [2]), r"sizes=\[2\] must have one entry per rank"),
        ("all_gatherv", (torch.zeros(2, 3), [1, 2]), r"input has 2 rows, sizes says 1"),
        ("all_gatherv", (torch.zeros(2, 3), None, torch.zeros(3, 3)), r"output shape \(3, 3\)"),
        ("reduce_scatterv", (torch.zeros(3, 2),), r"3 rows do not split into 2 ranks"),
        ("reduce_scatterv", (torch.zeros(3, 2), None, [1, 1]), r"2 entries summing to"),
        ("reduce_scatterv", (torch.zeros(4, 2), torch.zeros(1, 2)), r"output shape \(1, 2\) !="),
        ("reduce_scatter", (torch.zeros(2), [torch.zeros(2)]), r"input_list has 1 tensors"),
    ],
)
def test_the_library_refuses_bad_arguments_as_the_reference_does(
    op: str, args: tuple[Any, ...], message: str
) -> None:
    api = Recorder()
    with pytest.raises(ValueError, match=message):
        library(api=api).implementations()[op](group(), *args)
    with pytest.raises(ValueError, match=message):
        get_contract(op).reference(group(), *args)
    assert api.calls == []


GLOO_LIBRARY = """
import torch
from sglang_fl import hookimpl
from sglang_fl.collective_library import ProcessGroupLibrary

GLOO = ProcessGroupLibrary(
    name="GLOO", backend="gloo",
    dtypes=frozenset({torch.float32, torch.float16, torch.bfloat16}),
    dtypes_source="gloo", layout_source="gloo",
)

@hookimpl
def sglang_fl_register_ops(registry):
    from sglang_fl.dispatch.backends import Backend

    class Gloo(Backend):
        name = "padded"

        def is_available(self):
            return True

    registry.register_many(Gloo().implementations(GLOO.implementations(
        ["all_gatherv", "reduce_scatterv"])))
"""


@pytest.mark.timeout(300)
def test_a_library_without_uneven_calls_serves_uneven_sizes_through_its_even_ones(
    plugin_site: Any,
) -> None:
    """``uneven=None``: every case of both contracts on 2 ranks, none declined, uneven ones
    included (padded gathers, an all-reduce of which each rank keeps its rows)."""
    plugin_site.plugin("padded", GLOO_LIBRARY)
    ops = ["all_gatherv", "reduce_scatterv"]
    results = run_collective_checks(
        2, dict.fromkeys(ops, "vendor.padded"), ops=ops, dtypes=["float32"], plugin="padded",
        timeout=240,
    )  # fmt: skip
    assert {r.op for r in results} == set(ops)
    assert [f"{r.case_id}: {r.message}" for r in results if not r.passed or r.declined] == []
    assert any("uneven" in r.case for r in results)
