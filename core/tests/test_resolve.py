"""Policy and resolution: order, filters, availability, the decision record, STRICT."""

from __future__ import annotations

import logging

import pytest

from sglang_fl import NoImplementationError, StrictModeError, Unsupported
from sglang_fl.config import Settings
from sglang_fl.dispatch.availability import AvailabilityCache
from sglang_fl.dispatch.backends import Backend
from sglang_fl.dispatch.policy import SelectionPolicy
from sglang_fl.dispatch.registry import OpRegistry
from sglang_fl.dispatch.resolve import resolve
from sglang_fl.dispatch.types import (
    Availability,
    BackendImplKind,
    BackendPriority,
    OpImpl,
)


def make_fn(label, calls=None):
    def fn(obj, x):
        if calls is not None:
            calls.append(label)
        return label

    fn.__name__ = f"silu_{label}"
    return fn


def impl(impl_id, kind, *, vendor=None, priority=None, fn=None, available=None):
    if priority is None:
        priority = {
            BackendImplKind.DEFAULT: BackendPriority.DEFAULT,
            BackendImplKind.VENDOR: BackendPriority.VENDOR,
            BackendImplKind.REFERENCE: BackendPriority.REFERENCE,
        }[kind]
    return OpImpl(
        op_name="silu_and_mul",
        impl_id=impl_id,
        kind=kind,
        fn=fn or make_fn(impl_id),
        vendor=vendor,
        priority=priority,
        available=available,
    )


FLAGOS = BackendImplKind.DEFAULT
VENDOR = BackendImplKind.VENDOR
REFERENCE = BackendImplKind.REFERENCE


def standard_impls():
    return [
        impl("reference.silu", REFERENCE),
        impl("vendor.cuda", VENDOR, vendor="cuda"),
        impl("vendor.ascend", VENDOR, vendor="ascend"),
        impl("flagos.triton", FLAGOS),
    ]


def run(impls, op="silu_and_mul", availability=None, **env):
    registry = OpRegistry()
    # Registered directly: these are policy cases, with vendor names and impl ids free of the
    # plugin identity rule (test_identity covers it).
    registry.register_many(impls)
    settings = Settings.from_environment({f"SGLANG_FL_{k.upper()}": v for k, v in env.items()})
    return resolve(op, registry, SelectionPolicy(settings), availability or AvailabilityCache())


def verdicts(resolution):
    return {c.impl.impl_id: (c.outcome, c.reason) for c in resolution.decision.candidates}


# -- order ----------------------------------------------------------------------------------------


def test_default_order_flagos_vendor_reference():
    r = run(standard_impls())
    assert r.decision.chosen.impl_id == "flagos.triton"
    assert r.decision.order == ("flagos", "vendor", "reference")
    assert r.decision.order_source == "default"
    assert [c.impl.impl_id for c in r.decision.candidates] == [
        "flagos.triton",
        "vendor.ascend",  # same kind and priority as cuda: impl_id breaks the tie
        "vendor.cuda",
        "reference.silu",
    ]


def test_vendor_beats_reference_without_flagos():
    r = run(standard_impls()[:3])
    assert r.decision.chosen.impl_id == "vendor.ascend"
    assert r.fn(None, None) == "vendor.ascend"


def test_prefer_reference():
    r = run(standard_impls(), prefer="reference")
    assert r.decision.chosen.impl_id == "reference.silu"
    assert r.decision.order == ("reference", "flagos", "vendor")
    assert r.decision.order_source == "environment SGLANG_FL_PREFER"


def test_prefer_named_vendor():
    r = run(standard_impls(), prefer="vendor:cuda")
    assert r.decision.chosen.impl_id == "vendor.cuda"
    assert r.decision.order == ("vendor:cuda", "flagos", "vendor", "reference")
    outcome, reason = verdicts(r)["flagos.triton"]
    assert outcome == "fallback"
    assert "lower in the order: matches flagos (position 2)" in reason
    assert "vendor.cuda matches vendor:cuda (position 1)" in reason


def test_prefer_impl_id():
    r = run(standard_impls(), prefer="impl:reference.silu")
    assert r.decision.chosen.impl_id == "reference.silu"


def test_prefer_unmatched_falls_back_to_default_order():
    r = run(standard_impls(), prefer="vendor:nvidia")
    assert r.decision.chosen.impl_id == "flagos.triton"


def test_per_op_excludes_unmatched_candidates():
    r = run(standard_impls(), per_op="silu_and_mul=vendor:cuda|reference")
    assert r.decision.chosen.impl_id == "vendor.cuda"
    assert r.decision.order == ("vendor:cuda", "reference")
    assert r.decision.order_source == "environment SGLANG_FL_PER_OP"
    v = verdicts(r)
    assert v["flagos.triton"] == (
        "rejected",
        "matches no token of the order [vendor:cuda, reference]",
    )
    assert v["vendor.ascend"][0] == "rejected"
    assert v["reference.silu"][0] == "fallback"
    # Only matched candidates are in the fallback chain.
    assert [i.impl_id for i in r.decision.fallbacks] == ["reference.silu"]


def test_per_op_only_applies_to_its_op():
    impls = [*standard_impls(), *[rms(i) for i in standard_impls()]]
    r = run(impls, op="rms_norm", per_op="silu_and_mul=reference")
    assert r.decision.chosen.impl_id == "flagos.triton"
    assert r.decision.order_source == "default"


def rms(i: OpImpl) -> OpImpl:
    from dataclasses import replace

    def fn(obj, x, residual=None):
        return i.impl_id

    return replace(i, op_name="rms_norm", fn=fn)


def test_per_op_wins_over_prefer():
    r = run(standard_impls(), prefer="reference", per_op="silu_and_mul=vendor:ascend")
    assert r.decision.chosen.impl_id == "vendor.ascend"


def test_priority_orders_within_a_kind():
    impls = [
        impl("vendor.low", VENDOR, vendor="a", priority=10),
        impl("vendor.high", VENDOR, vendor="b", priority=300),
        impl("vendor.mid", VENDOR, vendor="c", priority=100),
    ]
    r = run(impls)
    assert [c.impl.impl_id for c in r.decision.candidates] == [
        "vendor.high",
        "vendor.mid",
        "vendor.low",
    ]
    v = verdicts(r)
    assert v["vendor.mid"] == ("fallback", "lower priority: 100 < 300 of vendor.high")
    assert v["vendor.low"] == ("fallback", "lower priority: 10 < 300 of vendor.high")


def test_priority_never_crosses_the_order():
    impls = [
        impl("reference.huge", REFERENCE, priority=10_000),
        impl("vendor.tiny", VENDOR, vendor="a", priority=1),
    ]
    assert run(impls).decision.chosen.impl_id == "vendor.tiny"


# -- vendor lists ---------------------------------------------------------------------------------


def test_deny_vendors():
    r = run(standard_impls(), deny_vendors="ascend", prefer="vendor")
    assert r.decision.chosen.impl_id == "vendor.cuda"
    assert verdicts(r)["vendor.ascend"] == (
        "rejected",
        "vendor 'ascend' is denied (environment SGLANG_FL_DENY_VENDORS)",
    )


def test_allow_vendors():
    r = run(standard_impls(), allow_vendors="cuda", prefer="vendor")
    assert r.decision.chosen.impl_id == "vendor.cuda"
    outcome, reason = verdicts(r)["vendor.ascend"]
    assert outcome == "rejected"
    assert reason == (
        "vendor 'ascend' is not in the allow list ['cuda'] (environment SGLANG_FL_ALLOW_VENDORS)"
    )
    # Non-vendor implementations are never filtered by vendor lists.
    assert verdicts(r)["reference.silu"][0] == "fallback"
    assert verdicts(r)["flagos.triton"][0] == "fallback"


def test_empty_allow_list_excludes_every_vendor():
    r = run(standard_impls()[:3], allow_vendors="")
    assert r.decision.chosen.impl_id == "reference.silu"


def test_deny_wins_over_allow():
    r = run(standard_impls()[:3], allow_vendors="cuda", deny_vendors="cuda")
    assert "denied" in verdicts(r)["vendor.cuda"][1]
    assert r.decision.chosen.impl_id == "reference.silu"


# -- availability ---------------------------------------------------------------------------------


def test_unavailable_bool_probe():
    r = run([impl("vendor.cuda", VENDOR, vendor="cuda", available=lambda: False), *ref()])
    assert r.decision.chosen.impl_id == "reference.silu"
    c = candidate(r, "vendor.cuda")
    assert (c.outcome, c.reason) == ("rejected", "unavailable: probe reported unavailable")
    assert c.availability == Availability(False, "probe reported unavailable")


def test_available_bool_probe():
    r = run([impl("vendor.cuda", VENDOR, vendor="cuda", available=lambda: True), *ref()])
    assert r.decision.chosen.impl_id == "vendor.cuda"
    assert candidate(r, "vendor.cuda").availability.reason == "probe reported available"
    assert candidate(r, "reference.silu").availability.reason == (
        "no availability probe: always available"
    )


def test_availability_object_reason():
    probe = lambda: Availability(False, "no device: 0 chips visible")  # noqa: E731
    r = run([impl("vendor.cuda", VENDOR, vendor="cuda", available=probe), *ref()])
    assert candidate(r, "vendor.cuda").reason == "unavailable: no device: 0 chips visible"


def test_raising_probe_is_unavailable_and_logged(caplog):
    def probe():
        raise ImportError("libchip.so not found")

    with caplog.at_level(logging.WARNING, logger="sglang_fl.dispatch.availability"):
        r = run([impl("vendor.cuda", VENDOR, vendor="cuda", available=probe), *ref()])
    assert r.decision.chosen.impl_id == "reference.silu"
    assert candidate(r, "vendor.cuda").reason == (
        "unavailable: availability probe raised ImportError: libchip.so not found"
    )
    assert "libchip.so not found" in caplog.text


def test_non_bool_probe_is_unavailable(caplog):
    with caplog.at_level(logging.WARNING, logger="sglang_fl.dispatch.availability"):
        r = run([impl("vendor.cuda", VENDOR, vendor="cuda", available=lambda: 1), *ref()])
    assert candidate(r, "vendor.cuda").reason == (
        "unavailable: availability probe returned 1, not a bool"
    )
    assert "not a bool" in caplog.text


def test_seed_is_available_attribute_is_the_probe():
    def fn(obj, x):
        return "seed"

    fn._is_available = lambda: Availability(False, "seed probe says no")
    r = run([impl("vendor.seed", VENDOR, vendor="seed", fn=fn), *ref()])
    assert candidate(r, "vendor.seed").reason == "unavailable: seed probe says no"


def test_backend_subclass_probe_and_implementations():
    calls = []

    class Chip(Backend):
        @property
        def name(self):
            return "chip"

        def is_available(self):
            calls.append(1)
            return True

    def rms_fn(obj, x, residual=None):
        return "chip"

    chip_impls = Chip().implementations({"silu_and_mul": make_fn("chip"), "rms_norm": rms_fn})
    assert [i.impl_id for i in chip_impls] == ["vendor.chip", "vendor.chip"]
    assert all(i.vendor == "chip" and i.priority == BackendPriority.VENDOR for i in chip_impls)
    assert chip_impls[1].fn is rms_fn
    cache = AvailabilityCache()
    registry = OpRegistry()
    registry.register_many(chip_impls)
    policy = SelectionPolicy(Settings())
    assert resolve("silu_and_mul", registry, policy, cache).decision.chosen.impl_id == "vendor.chip"
    assert resolve("rms_norm", registry, policy, cache).decision.chosen.impl_id == "vendor.chip"
    # Two bound methods of one backend share one cache entry: probed once for both ops.
    assert calls == [1]


def test_backend_abstract_members():
    with pytest.raises(TypeError):
        Backend()  # type: ignore[abstract]


def test_probe_runs_at_most_once_per_process():
    calls = []

    def probe():
        calls.append(1)
        return Availability(False, "nope")

    cache = AvailabilityCache()
    impls = [impl("vendor.cuda", VENDOR, vendor="cuda", available=probe), *ref()]
    for _ in range(3):
        run(impls, availability=cache)
    assert calls == [1]


def test_unhashable_probe_object_is_probed_once():
    """A callable dataclass instance (``eq`` without ``hash``) is a valid probe."""
    from dataclasses import dataclass, field

    @dataclass
    class DeviceProbe:
        device: str
        calls: list = field(default_factory=list)

        def __call__(self):
            self.calls.append(1)
            return Availability(False, f"{self.device}: not found")

    probe = DeviceProbe("npu0")
    cache = AvailabilityCache()
    impls = [impl("vendor.npu", VENDOR, vendor="npu", available=probe), *ref()]
    for _ in range(2):
        r = run(impls, availability=cache)
        assert candidate(r, "vendor.npu").reason == "unavailable: npu0: not found"
    assert probe.calls == [1]


def test_probe_not_called_for_denied_or_unordered_candidates():
    calls = []

    def probe():
        calls.append(1)
        return True

    run(
        [impl("vendor.cuda", VENDOR, vendor="cuda", available=probe), *ref()],
        deny_vendors="cuda",
    )
    run(
        [impl("vendor.cuda", VENDOR, vendor="cuda", available=probe), *ref()],
        per_op="silu_and_mul=reference",
    )
    assert calls == []


def ref():
    return [impl("reference.silu", REFERENCE)]


def candidate(resolution, impl_id):
    (c,) = [c for c in resolution.decision.candidates if c.impl.impl_id == impl_id]
    return c


# -- decision record ------------------------------------------------------------------------------


def test_decision_record_lists_every_candidate_with_reason():
    impls = [
        impl("flagos.triton", FLAGOS, available=lambda: Availability(False, "no triton")),
        impl("vendor.denied", VENDOR, vendor="bad"),
        impl("vendor.high", VENDOR, vendor="a", priority=200),
        impl("vendor.low", VENDOR, vendor="b", priority=100),
        impl("reference.silu", REFERENCE),
    ]
    r = run(impls, deny_vendors="bad")
    d = r.decision
    assert d.chosen.impl_id == "vendor.high"
    assert {c.impl.impl_id for c in d.candidates} == {i.impl_id for i in impls}
    v = verdicts(r)
    assert v["vendor.high"] == (
        "chosen",
        "first available candidate: matches vendor (position 2 of the order)",
    )
    assert v["vendor.low"] == ("fallback", "lower priority: 100 < 200 of vendor.high")
    assert v["reference.silu"] == (
        "fallback",
        "lower in the order: matches reference (position 3), "
        "vendor.high matches vendor (position 2)",
    )
    assert v["flagos.triton"] == ("rejected", "unavailable: no triton")
    assert v["vendor.denied"] == (
        "rejected",
        "vendor 'bad' is denied (environment SGLANG_FL_DENY_VENDORS)",
    )
    assert [i.impl_id for i in d.fallbacks] == ["vendor.low", "reference.silu"]

    data = d.to_dict()
    assert data["op"] == "silu_and_mul"
    assert data["chosen"] == "vendor.high"
    assert data["order"] == ["flagos", "vendor", "reference"]
    assert data["order_source"] == "default"
    first = data["candidates"][0]
    assert first == {
        "impl_id": "vendor.high",
        "kind": "vendor",
        "vendor": "a",
        "priority": 200,
        "plugin": "<direct>",
        "distribution": "<none>",
        "version": "",
        "available": True,
        "availability_reason": "no availability probe: always available",
        "outcome": "chosen",
        "reason": "first available candidate: matches vendor (position 2 of the order)",
    }
    denied = next(c for c in data["candidates"] if c["impl_id"] == "vendor.denied")
    assert denied["available"] is None  # never probed
    flagos = next(c for c in data["candidates"] if c["impl_id"] == "flagos.triton")
    assert flagos["available"] is False
    assert flagos["availability_reason"] == "no triton"


def test_no_implementation_error_names_op_and_reasons():
    impls = [
        impl("vendor.cuda", VENDOR, vendor="cuda", available=lambda: False),
        impl("vendor.bad", VENDOR, vendor="bad"),
    ]
    with pytest.raises(NoImplementationError) as info:
        run(impls, deny_vendors="bad")
    message = str(info.value)
    assert "no usable implementation of op 'silu_and_mul'" in message
    assert "vendor.cuda: unavailable: probe reported unavailable" in message
    assert "vendor.bad: vendor 'bad' is denied" in message
    assert isinstance(info.value, LookupError)


def test_no_implementation_when_nothing_registered():
    with pytest.raises(NoImplementationError, match=r"'rms_norm' \(none registered\)"):
        run([], op="rms_norm")


# -- STRICT ---------------------------------------------------------------------------------------


def test_strict_explicit_prefer_falling_through_raises():
    impls = [impl("vendor.cuda", VENDOR, vendor="cuda", available=lambda: False), *ref()]
    with pytest.raises(StrictModeError) as info:
        run(impls, prefer="vendor:cuda", strict="1")
    message = str(info.value)
    assert "SGLANG_FL_STRICT=1" in message
    assert (
        "op 'silu_and_mul' was asked to use vendor:cuda (environment SGLANG_FL_PREFER)" in message
    )
    assert "vendor.cuda: unavailable: probe reported unavailable" in message


def test_strict_per_op_with_no_match_raises():
    with pytest.raises(StrictModeError, match="no implementation matches it"):
        run(ref(), per_op="silu_and_mul=vendor:cuda|reference", strict="1")


def test_strict_denied_explicit_choice_raises():
    impls = [impl("vendor.cuda", VENDOR, vendor="cuda"), *ref()]
    with pytest.raises(StrictModeError, match="vendor 'cuda' is denied"):
        run(impls, prefer="vendor:cuda", deny_vendors="cuda", strict="1")


def test_strict_without_explicit_choice_falls_back_silently_in_the_default_order():
    impls = [impl("vendor.cuda", VENDOR, vendor="cuda", available=lambda: False), *ref()]
    r = run(impls, strict="1")
    assert r.decision.chosen.impl_id == "reference.silu"


def test_non_strict_explicit_choice_falls_through_with_a_warning(caplog):
    impls = [impl("vendor.cuda", VENDOR, vendor="cuda", available=lambda: False), *ref()]
    with caplog.at_level(logging.WARNING, logger="sglang_fl.dispatch.resolve"):
        assert run(impls, prefer="vendor:cuda").decision.chosen.impl_id == "reference.silu"
    (record,) = caplog.records
    assert record.getMessage() == (
        "op 'silu_and_mul' was asked to use vendor:cuda (environment SGLANG_FL_PREFER) but "
        "cannot (vendor.cuda: unavailable: probe reported unavailable); using reference.silu "
        "instead (SGLANG_FL_STRICT=1 makes this an error)"
    )


def test_default_order_falling_through_is_silent(caplog):
    impls = [impl("vendor.cuda", VENDOR, vendor="cuda", available=lambda: False), *ref()]
    with caplog.at_level(logging.WARNING, logger="sglang_fl.dispatch.resolve"):
        assert run(impls).decision.chosen.impl_id == "reference.silu"
        assert run(impls, prefer="reference").decision.chosen.impl_id == "reference.silu"
    assert caplog.records == []


def test_strict_binds_the_chosen_fn_alone_and_a_decline_is_an_error():
    def declines(obj, x):
        raise Unsupported("fp8 only")

    impls = [impl("vendor.cuda", VENDOR, vendor="cuda", fn=declines), *ref()]
    r = run(impls, strict="1")
    assert [i.impl_id for i in r.chain] == ["vendor.cuda"]
    assert [i.impl_id for i in r.decision.fallbacks] == ["reference.silu"]
    message = r"SGLANG_FL_STRICT=1: vendor\.cuda declined a call of silu_and_mul \(fp8 only\)"
    with pytest.raises(StrictModeError, match=message) as caught:
        r.fn(None, None)
    assert isinstance(caught.value.__cause__, Unsupported)
    with pytest.raises(StrictModeError, match=message):  # a binding of its own: the same rule
        r.bind().fn(None, None)


def test_strict_without_a_fallback_to_cut_binds_the_fn_itself():
    def declines(obj, x):
        raise Unsupported("fp8 only")

    r = run([impl("vendor.cuda", VENDOR, vendor="cuda", fn=declines)], strict="1")
    assert r.fn is declines  # no candidate was cut off: its decline is the caller's
    with pytest.raises(Unsupported, match="fp8 only"):
        r.fn(None, None)


def test_strict_satisfied_explicit_choice_binds_the_choice_alone():
    calls = []
    fn = make_fn("cuda", calls)
    r = run([impl("vendor.cuda", VENDOR, vendor="cuda", fn=fn), *ref()], prefer="vendor:cuda")
    assert r.decision.chosen.impl_id == "vendor.cuda"
    r = run(
        [impl("vendor.cuda", VENDOR, vendor="cuda", fn=fn), *ref()],
        prefer="vendor:cuda",
        strict="1",
    )
    assert [i.impl_id for i in r.chain] == ["vendor.cuda"]
    assert r.fn(None, None) == "cuda"
    assert calls == ["cuda"]
