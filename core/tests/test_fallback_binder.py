"""The one fallback binder (``dispatch.binder``) and the layer router's seam that uses it.

What every binding of a chosen implementation shares: a decline hands the call on and is
reported once per implementation and reason, through the log and the binder's callback;
strict mode keeps the chosen implementation alone and turns its decline into an error naming
the op and the implementation; verify mode is served by the same chain.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from sglang_fl import StrictModeError, Unsupported
from sglang_fl.config import Settings
from sglang_fl.dispatch.binder import Decline, FallbackChain
from sglang_fl.dispatch.types import BackendImplKind, OpImpl
from sglang_fl.dispatch_report import DispatchReport, Runner, read_log
from sglang_fl.integrations.routing import Bridge, Forward, Handoff, LayerRouter, rows_forward
from sglang_fl.ops import get_contract
from sglang_fl.runtime import Runtime

SILU = get_contract("silu_and_mul")


def declining_wide_rows(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """A kernel for rows of at most 8 values; it declines wider ones (the width in the reason)."""
    if x.shape[-1] > 8:
        raise Unsupported(f"rows of {x.shape[-1]} values; this kernel takes at most 8")
    return SILU.reference(obj, x)


def impl(impl_id: str, fn: Any, kind: BackendImplKind = BackendImplKind.VENDOR) -> OpImpl:
    vendor = "acme" if kind is BackendImplKind.VENDOR else None
    return OpImpl(SILU.name, impl_id, kind, fn, vendor=vendor)


CHAIN = (
    impl("vendor.acme.silu", declining_wide_rows),
    impl("reference.silu_and_mul", SILU.reference, BackendImplKind.REFERENCE),
)


def test_one_candidate_binds_the_implementation_itself() -> None:
    assert FallbackChain(SILU.name, CHAIN[1:]).fn is SILU.reference


def test_a_chain_needs_a_candidate() -> None:
    with pytest.raises(ValueError, match="'silu_and_mul': a fallback chain needs at least one"):
        FallbackChain(SILU.name, ())


def test_each_decline_is_reported_once_per_implementation_and_reason(caplog) -> None:
    declines: list[Decline] = []
    fn = FallbackChain(SILU.name, CHAIN, on_decline=declines.append).fn
    with caplog.at_level(logging.WARNING, logger="sglang_fl.dispatch.binder"):
        for width in (20, 20, 40, 8, 20):
            x = torch.randn(3, width)
            torch.testing.assert_close(fn(None, x), SILU.reference(None, x), rtol=0, atol=0)
    assert declines == [
        Decline(SILU.name, "vendor.acme.silu", "reference.silu_and_mul", reason)
        for reason in (
            "rows of 20 values; this kernel takes at most 8",
            "rows of 40 values; this kernel takes at most 8",
        )
    ]
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2
    assert logged[0] == (
        "silu_and_mul: vendor.acme.silu declined a call (rows of 20 values; this kernel takes "
        "at most 8); handing it to reference.silu_and_mul (warned once per process)"
    )


def test_serve_names_the_implementation_whose_result_it_is() -> None:
    declines: list[Decline] = []
    chain = FallbackChain(SILU.name, CHAIN, on_decline=declines.append)
    served, _ = chain.serve((None, torch.randn(2, 20)), {})
    assert served.impl_id == "reference.silu_and_mul"
    served, _ = chain.serve((None, torch.randn(2, 8)), {})
    assert served.impl_id == "vendor.acme.silu"
    assert [d.impl_id for d in declines] == ["vendor.acme.silu"]  # serve reports as fn does


def test_the_first_call_is_reported_once_naming_the_implementation_that_served_it() -> None:
    """What was called, not only what was bound: the first call's server, a fallback when the
    chosen implementation declined it; later calls and serve() report nothing more."""
    served: list[OpImpl] = []
    chain = FallbackChain(SILU.name, CHAIN, on_first_call=served.append)
    assert chain.fn is not chain.impls[0].fn
    x = torch.randn(3, 20)
    torch.testing.assert_close(chain.fn(None, x), SILU.reference(None, x))
    assert [impl.impl_id for impl in served] == ["reference.silu_and_mul"]
    chain.fn(None, torch.randn(3, 8))
    chain.serve((None, torch.randn(3, 8)), {})
    assert len(served) == 1
    # Through serve() first (verify mode's path), with the chosen one accepting.
    served.clear()
    chain = FallbackChain(SILU.name, CHAIN, on_first_call=served.append)
    impl_served, _ = chain.serve((None, torch.randn(3, 8)), {})
    assert served == [impl_served] == [CHAIN[0]]
    chain.fn(None, torch.randn(3, 20))
    assert served == [CHAIN[0]]


def test_a_first_call_that_raises_is_not_reported_and_one_candidate_is_observed_too() -> None:
    served: list[OpImpl] = []

    def broken(obj: Any, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 0:
            raise RuntimeError("acme: the device went away")
        return SILU.reference(obj, x)

    only = (impl("vendor.acme.silu", broken),)
    chain = FallbackChain(SILU.name, only, on_first_call=served.append)
    with pytest.raises(RuntimeError, match="went away"):
        chain.fn(None, torch.randn(0, 8))
    assert served == []
    chain.fn(None, torch.randn(2, 8))
    assert [i.impl_id for i in served] == ["vendor.acme.silu"]


def test_a_traced_call_is_not_observed_and_the_graph_has_no_break() -> None:
    """Under torch.compile the observer steps aside before reading its flag: a fullgraph trace
    succeeds, reports nothing, and the eager call after it is still the first reported."""
    served: list[OpImpl] = []
    chain = FallbackChain(SILU.name, CHAIN[1:], on_first_call=served.append)
    compiled = torch.compile(lambda x: chain.fn(None, x), fullgraph=True, backend="eager")
    x = torch.randn(2, 8)
    torch.testing.assert_close(compiled(x), SILU.reference(None, x))
    assert served == []
    chain.fn(None, x)
    assert [i.impl_id for i in served] == ["reference.silu_and_mul"]


def test_strict_keeps_the_chosen_alone_and_its_decline_is_an_error() -> None:
    fallback_calls = []

    def fallback(obj: Any, x: torch.Tensor) -> torch.Tensor:
        fallback_calls.append(x)
        return SILU.reference(obj, x)

    declines: list[Decline] = []
    chain = FallbackChain(
        SILU.name, (CHAIN[0], impl("vendor.acme.other", fallback)), strict=True,
        on_decline=declines.append,
    )  # fmt: skip
    assert [i.impl_id for i in chain.impls] == ["vendor.acme.silu"]
    x = torch.randn(2, 4)
    torch.testing.assert_close(chain.fn(None, x), SILU.reference(None, x))  # accepted: runs
    with pytest.raises(
        StrictModeError,
        match=r"SGLANG_FL_STRICT=1: vendor\.acme\.silu declined a call of silu_and_mul "
        r"\(rows of 20 values; this kernel takes at most 8\); without strict mode the next "
        "candidate would run it",
    ):
        chain.fn(None, torch.randn(2, 20))
    with pytest.raises(StrictModeError, match=r"vendor\.acme\.silu declined a call"):
        chain.serve((None, torch.randn(2, 20)), {})
    assert (fallback_calls, declines) == ([], [])


# -- the layer router's seam: one chain per op, declines as `fallback` records ------------------


class RowsBridge(Bridge):
    """Binds ``silu_and_mul`` to a layer whose forward takes ``x`` (the engines' signature)."""

    op_name = SILU.name
    engine = "Test"

    def bind(self, layer: Any, fn: Forward, engine_forward: Forward, handoff: Handoff) -> Forward:
        return rows_forward(layer, fn, halves=True)


class Activation:
    pass


class OtherActivation:
    pass


def engine_forward(x: torch.Tensor) -> torch.Tensor:
    raise AssertionError("the bridge never hands a call back")


# A real installed plugin (a throwaway distribution the loader discovers) whose kernel ranks
# above the reference and declines wide rows.
ACME = """
from sglang_fl import BackendImplKind, OpImpl, Unsupported, hookimpl
from sglang_fl.ops import get_contract


def silu(obj, x):
    if x.shape[-1] > 8:
        raise Unsupported(f"rows of {x.shape[-1]} values; this kernel takes at most 8")
    return get_contract("silu_and_mul").reference(obj, x)


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl("silu_and_mul", "vendor.acme.silu", BackendImplKind.VENDOR, silu,
                             "acme"))
"""


@pytest.fixture
def acme(plugin_site: Any) -> None:
    plugin_site.plugin("acme", ACME)


def router(tmp_path: Path, **env: str) -> tuple[LayerRouter, Path]:
    settings = Settings.from_environment({f"SGLANG_FL_{k.upper()}": v for k, v in env.items()})
    log = tmp_path / "dispatch.jsonl"
    return LayerRouter({}, {}, Runtime(settings), DispatchReport(log), Runner.SGLANG, "Test"), log


@pytest.mark.usefixtures("acme")
def test_the_router_reports_each_decline_once_per_process_across_layers(tmp_path: Path) -> None:
    routing, log = router(tmp_path)
    resolution = routing.runtime.resolve(SILU.name)
    assert resolution.decision.chosen.impl_id == "vendor.acme.silu"
    forwards = [
        routing.bind(layer, RowsBridge(), resolution, engine_forward)
        for layer in (Activation(), Activation(), OtherActivation())
    ]
    assert {f.sglang_fl_impl_id for f in forwards} == {"vendor.acme.silu"}
    for forward in forwards:
        for width in (4, 20):
            x = torch.randn(2, width)
            torch.testing.assert_close(forward(x), SILU.reference(None, x), rtol=0, atol=0)
    fallbacks = [r for r in read_log(log) if r["event"] == "fallback"]
    assert [
        (r["op"], r["impl_id"], r["next_impl_id"], r["reason"], r["runner"]) for r in fallbacks
    ] == [
        (
            SILU.name,
            "vendor.acme.silu",
            resolution.decision.fallbacks[0].impl_id,
            "rows of 20 values; this kernel takes at most 8",
            "sglang-fl",
        )
    ]


@pytest.mark.usefixtures("acme")
def test_the_router_under_strict_raises_on_a_decline(tmp_path: Path) -> None:
    routing, log = router(tmp_path, strict="1")
    resolution = routing.runtime.resolve(SILU.name)
    forward = routing.bind(Activation(), RowsBridge(), resolution, engine_forward)
    forward(torch.randn(2, 4))
    with pytest.raises(StrictModeError, match=r"vendor\.acme\.silu declined a call of silu_and"):
        forward(torch.randn(2, 20))
    assert not [r for r in read_log(log) if r["event"] == "fallback"]


@pytest.mark.usefixtures("acme")
def test_verify_records_name_who_served_and_the_decline_is_reported(tmp_path: Path) -> None:
    routing, log = router(tmp_path, verify="4")
    resolution = routing.runtime.resolve(SILU.name)
    forward = routing.bind(Activation(), RowsBridge(), resolution, engine_forward)
    for width in (4, 20):
        forward(torch.randn(2, width))
    records = read_log(log)
    verified = [(r["impl_id"], r["verdict"]) for r in records if r["event"] == "verify"]
    fallback = resolution.decision.fallbacks[0].impl_id
    assert verified == [("vendor.acme.silu", "pass"), (fallback, "pass")]
    assert [r["impl_id"] for r in records if r["event"] == "fallback"] == ["vendor.acme.silu"]
