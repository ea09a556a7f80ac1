"""The Unsupported hand-off: declined calls go to the next candidate; failures never re-run."""

from __future__ import annotations

import logging

import pytest

from sglang_fl import Unsupported
from sglang_fl.config import Settings
from sglang_fl.dispatch.availability import AvailabilityCache
from sglang_fl.dispatch.policy import SelectionPolicy
from sglang_fl.dispatch.registry import OpRegistry
from sglang_fl.dispatch.resolve import resolve
from sglang_fl.dispatch.types import BackendImplKind, OpImpl


class Counter:
    """An op implementation that counts its calls and behaves as told."""

    def __init__(self, label, behaviour="return"):
        self.label = label
        self.behaviour = behaviour
        self.calls = 0

    def __call__(self, obj, x):
        self.calls += 1
        if self.behaviour == "unsupported":
            raise Unsupported(f"{self.label} does not take this")
        if self.behaviour == "fail":
            raise RuntimeError(f"{self.label} kernel crashed")
        if self.behaviour == "unsupported-odd" and x % 2:
            raise Unsupported(f"{self.label}: odd sizes only elsewhere")
        return (self.label, x)


def bind(*fns):
    """Register ``fns`` as flagos, vendor, reference (in that order) and resolve."""
    kinds = [BackendImplKind.DEFAULT, BackendImplKind.VENDOR, BackendImplKind.REFERENCE]
    registry = OpRegistry()
    for fn, kind in zip(fns, kinds, strict=False):
        registry.register(
            OpImpl(
                op_name="silu_and_mul",
                impl_id=f"{kind.value}.{fn.label}",
                kind=kind,
                fn=fn,
                vendor="v" if kind is BackendImplKind.VENDOR else None,
            )
        )
    return resolve("silu_and_mul", registry, SelectionPolicy(Settings()), AvailabilityCache())


def test_single_candidate_binds_the_implementation_itself():
    only = Counter("only")
    assert bind(only).fn is only


def test_unsupported_hands_the_call_to_the_next_candidate_and_warns_once(caplog):
    first, second = Counter("first", "unsupported"), Counter("second")
    r = bind(first, second)
    assert r.fn is not first
    with caplog.at_level(logging.WARNING, logger="sglang_fl.dispatch.binder"):
        assert r.fn(None, 3) == ("second", 3)
        assert r.fn(None, 4) == ("second", 4)
    assert (first.calls, second.calls) == (2, 2)
    warnings = [rec for rec in caplog.records if "declined a call" in rec.getMessage()]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    assert "flagos.first declined a call (first does not take this)" in text
    assert "handing it to vendor.second" in text


def test_unsupported_only_for_some_calls():
    first, second = Counter("first", "unsupported-odd"), Counter("second")
    r = bind(first, second)
    assert r.fn(None, 2) == ("first", 2)
    assert r.fn(None, 3) == ("second", 3)
    assert (first.calls, second.calls) == (2, 1)


def test_unsupported_walks_the_whole_chain():
    a, b, c = Counter("a", "unsupported"), Counter("b", "unsupported"), Counter("c")
    r = bind(a, b, c)
    assert r.fn(None, 1) == ("c", 1)
    assert (a.calls, b.calls, c.calls) == (1, 1, 1)


def test_last_candidate_unsupported_propagates():
    a, b = Counter("a", "unsupported"), Counter("b", "unsupported")
    r = bind(a, b)
    with pytest.raises(Unsupported, match="b does not take this"):
        r.fn(None, 1)


def test_other_exception_propagates_and_fallback_is_not_called():
    first, second = Counter("first", "fail"), Counter("second")
    r = bind(first, second)
    with pytest.raises(RuntimeError, match="first kernel crashed"):
        r.fn(None, 1)
    assert first.calls == 1
    assert second.calls == 0


def test_failure_after_a_handoff_is_not_retried():
    first, second, third = Counter("a", "unsupported"), Counter("b", "fail"), Counter("c")
    r = bind(first, second, third)
    with pytest.raises(RuntimeError, match="b kernel crashed"):
        r.fn(None, 1)
    assert (first.calls, second.calls, third.calls) == (1, 1, 0)


def test_unsupported_is_not_an_sglang_fl_error():
    """Vendors raise it freely; ``except SglangFlError`` handlers must not swallow it."""
    from sglang_fl import SglangFlError

    assert not issubclass(Unsupported, SglangFlError)


def test_fallback_wrapper_is_named_for_debugging():
    first, second = Counter("first", "unsupported"), Counter("second")
    fn = bind(first, second).fn
    assert fn.__name__ == "silu_and_mul_via_flagos.first"
    assert "vendor.second" in fn.__doc__
