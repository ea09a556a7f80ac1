"""Hardening III: what the report and the logs carry from a plugin is bounded (issue 33).

A plugin's text (a decline's reason, a probe's reason, a name) reaches every report record and
log line; on 4ee63c2 a 50 MB string went through whole, and a kernel giving a new decline
reason per call logged and recorded every call.
"""

from __future__ import annotations

import logging

import pytest

from sglang_fl import Unsupported
from sglang_fl.dispatch.binder import REASONS_REPORTED, FallbackChain
from sglang_fl.dispatch.registry import OpRegistry
from sglang_fl.dispatch.types import Availability, BackendImplKind, OpImpl
from sglang_fl.errors import RegistrationError
from sglang_fl.guard import PLUGIN_TEXT_LIMIT, capped, describe_exception
from sglang_fl.runtime import get_runtime

MARK = "... [sglang-fl: cut {} more characters]"


def reference(obj, x):
    return "reference"


def chain_of(decline):
    impls = [
        OpImpl("silu_and_mul", "vendor.acme", BackendImplKind.VENDOR, decline, vendor="acme"),
        OpImpl("silu_and_mul", "reference.silu", BackendImplKind.REFERENCE, reference),
    ]
    seen = []
    return FallbackChain("silu_and_mul", impls, on_decline=seen.append), seen


def test_capped_keeps_short_text_and_marks_a_cut():
    assert capped("short") == "short"
    long = "x" * (PLUGIN_TEXT_LIMIT + 5)
    assert capped(long) == "x" * PLUGIN_TEXT_LIMIT + MARK.format(5)


def test_a_huge_decline_reason_is_cut_in_the_record_and_the_log(caplog):
    def decline(obj, x):
        raise Unsupported("y" * 50_000_000)

    chain, seen = chain_of(decline)
    with caplog.at_level(logging.WARNING):
        assert chain.fn(None, None) == "reference"
    (record,) = seen
    assert record.reason == "y" * PLUGIN_TEXT_LIMIT + MARK.format(50_000_000 - PLUGIN_TEXT_LIMIT)
    assert max(len(r.getMessage()) for r in caplog.records) < 3 * PLUGIN_TEXT_LIMIT


def test_a_new_reason_per_call_is_reported_a_bounded_number_of_times(caplog):
    calls = iter(range(10_000))

    def decline(obj, x):
        raise Unsupported(f"call {next(calls)} of shape {x}")

    chain, seen = chain_of(decline)
    with caplog.at_level(logging.WARNING):
        for _ in range(500):
            chain.fn(None, 1)
    assert len(seen) == REASONS_REPORTED
    assert len(caplog.records) == REASONS_REPORTED + 1
    assert "further ones are handed on without a log line or record" in caplog.messages[-1]


def test_a_decline_whose_str_raises_is_still_handed_on():
    class Unprintable(Unsupported):
        def __str__(self):
            raise SystemExit("no text for you")

    def decline(obj, x):
        raise Unprintable()

    chain, seen = chain_of(decline)
    assert chain.fn(None, None) == "reference"
    assert seen[0].reason == "<str() of the exception raised SystemExit>"
    assert describe_exception(Unprintable()) == (
        "Unprintable: <str() of the exception raised SystemExit>"
    )


LONG_NAME = """
from sglang_fl.types import BackendImplKind, OpImpl, hookimpl

def silu_and_mul(obj, x):
    return x

@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl("silu_and_mul", "vendor.longname." + "z" * 5_000_000,
                             BackendImplKind.VENDOR, silu_and_mul, "longname"))
"""

HUGE_REASON = """
from sglang_fl.types import Availability, BackendImplKind, OpImpl, hookimpl

def silu_and_mul(obj, x):
    return x

@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl("silu_and_mul", "vendor.hugereason", BackendImplKind.VENDOR,
                             silu_and_mul, "hugereason",
                             available=lambda: Availability(False, "r" * 5_000_000)))
    registry.declare_no_kernel("gelu_new", "n" * 5_000_000)
"""


def test_an_impl_id_too_long_is_refused_and_the_refusal_is_short(plugin_site):
    plugin_site.plugin("longname", LONG_NAME)
    (record,) = [p for p in get_runtime().plugins if p.name == "longname"]
    assert record.status == "failed"
    assert "5000016 characters, at most 200 allowed" in record.error
    assert len(record.error) < 1000


def test_a_probe_reason_and_a_no_kernel_reason_are_cut(plugin_site):
    plugin_site.plugin("hugereason", HUGE_REASON)
    runtime = get_runtime()
    decision = runtime.resolve("silu_and_mul").decision
    (verdict,) = [c for c in decision.candidates if c.impl.vendor == "hugereason"]
    assert verdict.availability == Availability(
        False, "r" * PLUGIN_TEXT_LIMIT + MARK.format(5_000_000 - PLUGIN_TEXT_LIMIT)
    )
    (gap,) = [
        g for g in runtime.registry.no_kernel("gelu_new") if g.provenance.plugin == "hugereason"
    ]
    assert gap.reason.endswith(MARK.format(5_000_000 - PLUGIN_TEXT_LIMIT))


def test_a_registration_error_names_the_field():
    impl = OpImpl("silu_and_mul", "vendor.x." + "q" * 300, BackendImplKind.VENDOR, reference, "x")
    with pytest.raises(RegistrationError, match=r"impl_id='vendor\.x\.qqq.*at most 200 allowed"):
        OpRegistry().register(impl)
