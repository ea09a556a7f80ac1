"""The registry: every refusal is a RegistrationError naming what is wrong; scopes are atomic."""

from __future__ import annotations

import contextlib

import pytest

from sglang_fl import RegistrationError, UnknownOpError
from sglang_fl.dispatch.registry import DIRECT_PROVENANCE, OpRegistry
from sglang_fl.dispatch.types import BackendImplKind, BackendPriority, OpImpl, Provenance
from sglang_fl.ops import STANDARD_OPS

ACME = Provenance("acme", "sglang-fl-acme", "1.2.3")
ROGUE = Provenance("rogue", "sglang-fl-rogue", "0.0.1")


def silu(obj, x):
    return x


def rms(obj, x, residual=None):
    return x


def vendor_impl(op="silu_and_mul", impl_id="vendor.acme", fn=silu, **overrides):
    values = {
        "op_name": op,
        "impl_id": impl_id,
        "kind": BackendImplKind.VENDOR,
        "fn": fn,
        "vendor": "acme",
        "priority": BackendPriority.VENDOR,
    }
    values.update(overrides)
    return OpImpl(**values)


@pytest.fixture
def registry():
    return OpRegistry()


def test_empty_registry_knows_every_standard_op(registry):
    assert registry.ops() == tuple(STANDARD_OPS)
    for op in registry.ops():
        assert registry.implementations(op) == ()


def test_direct_registration_is_committed_with_direct_provenance(registry):
    impl = vendor_impl()
    registry.register(impl)
    (stored,) = registry.implementations("silu_and_mul")
    assert stored == impl
    assert stored.provenance == DIRECT_PROVENANCE
    assert stored.fn is silu
    assert registry.owner("vendor.acme") == DIRECT_PROVENANCE


def test_register_many_keeps_registration_order(registry):
    registry.register_many(
        [
            vendor_impl(impl_id="vendor.b"),
            vendor_impl(impl_id="vendor.a"),
            vendor_impl(op="rms_norm", fn=rms, impl_id="vendor.a"),
        ]
    )
    assert [i.impl_id for i in registry.implementations("silu_and_mul")] == [
        "vendor.b",
        "vendor.a",
    ]
    assert [i.impl_id for i in registry.implementations("rms_norm")] == ["vendor.a"]


def test_implementations_of_unknown_op_suggests(registry):
    with pytest.raises(UnknownOpError, match="did you mean 'silu_and_mul'"):
        registry.implementations("silu_and_mull")


# -- validation -----------------------------------------------------------------------------------


def refusal(registry, impl, provenance=ACME) -> str:
    with pytest.raises(RegistrationError) as info, registry.plugin_scope(provenance):
        registry.register(impl)
    return str(info.value)


def test_rejects_non_opimpl(registry):
    message = refusal(registry, {"op_name": "silu_and_mul"})
    assert "plugin 'acme' (sglang-fl-acme)" in message
    assert "registered 'dict'" in message
    assert "expected sglang_fl.dispatch.types.OpImpl" in message


def test_rejects_unknown_op_with_close_match(registry):
    message = refusal(registry, vendor_impl(op="rms_nrom", fn=rms))
    assert "unknown op 'rms_nrom' (did you mean 'rms_norm'?)" in message
    assert "'vendor.acme'" in message
    assert "Custom ops are not accepted" in message


@pytest.mark.parametrize("impl_id", ["", "   ", None, 3])
def test_rejects_empty_impl_id(registry, impl_id):
    message = refusal(registry, vendor_impl(impl_id=impl_id))
    assert f"impl_id={impl_id!r}" in message
    assert "non-empty string" in message


@pytest.mark.parametrize("kind", ["vendor", "cuda", 1])
def test_rejects_bad_kind(registry, kind):
    message = refusal(registry, vendor_impl(kind=kind))
    assert f"kind={kind!r}" in message
    assert "BackendImplKind.DEFAULT, BackendImplKind.VENDOR, BackendImplKind.REFERENCE" in message


@pytest.mark.parametrize("vendor", [None, ""])
def test_rejects_vendor_kind_without_vendor(registry, vendor):
    message = refusal(registry, vendor_impl(vendor=vendor))
    assert "vendor implementation 'vendor.acme' without a vendor name" in message


def test_non_vendor_kinds_need_no_vendor(registry):
    registry.register(vendor_impl(impl_id="flagos.x", kind=BackendImplKind.DEFAULT, vendor=None))
    registry.register(
        vendor_impl(impl_id="ref.x", kind=BackendImplKind.REFERENCE, vendor=None, priority=1)
    )
    kinds = [i.kind for i in registry.implementations("silu_and_mul")]
    assert kinds == [BackendImplKind.DEFAULT, BackendImplKind.REFERENCE]


@pytest.mark.parametrize("priority", ["100", 1.5, True])
def test_rejects_bad_priority(registry, priority):
    message = refusal(registry, vendor_impl(priority=priority))
    assert f"priority={priority!r}" in message
    assert "expected an int" in message


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        (BackendImplKind.DEFAULT, BackendPriority.DEFAULT),
        (BackendImplKind.VENDOR, BackendPriority.VENDOR),
        (BackendImplKind.REFERENCE, BackendPriority.REFERENCE),
    ],
)
def test_priority_defaults_to_the_kinds_priority(kind, expected):
    impl = OpImpl("silu_and_mul", "x.y", kind, lambda obj, x: x, vendor="acme")
    assert impl.priority == expected
    assert OpImpl("silu_and_mul", "x.y", kind, lambda obj, x: x, priority=None).priority == expected


def test_accepts_plain_int_priority(registry):
    registry.register(vendor_impl(priority=7))
    assert registry.implementations("silu_and_mul")[0].priority == 7


def test_rejects_non_callable(registry):
    message = refusal(registry, vendor_impl(fn="silu"))
    assert "'vendor.acme' with a non-callable fn" in message


def test_rejects_bad_signature_naming_op_and_expected_signature(registry):
    def wrong(obj, x, res=None):
        return x

    message = refusal(registry, vendor_impl(op="rms_norm", fn=wrong))
    assert "for op 'rms_norm'" in message
    assert "expected rms_norm(obj, x, residual=None)" in message
    assert "plugin 'acme' (sglang-fl-acme)" in message


def test_rejects_wrong_arity_for_rotary(registry):
    message = refusal(registry, vendor_impl(op="rotary_embedding", fn=rms))
    assert "for op 'rotary_embedding'" in message
    assert "cannot be called with 8 positional arguments" in message
    assert (
        "expected rotary_embedding(obj, query, key, cos, sin, position_ids, "
        "rotary_interleaved=False, inplace=True)"
    ) in message


def test_refusal_outside_a_scope_raises_and_registers_nothing(registry):
    with pytest.raises(RegistrationError, match="non-callable"):
        registry.register(vendor_impl(fn=None))
    assert registry.implementations("silu_and_mul") == ()


# -- ownership and duplicates ---------------------------------------------------------------------


def test_impl_id_owned_by_another_distribution(registry):
    with registry.plugin_scope(ACME):
        registry.register(vendor_impl())
    message = refusal(registry, vendor_impl(op="rms_norm", fn=rms, vendor="rogue"), ROGUE)
    assert "impl_id 'vendor.acme'" in message
    assert "plugin 'rogue' (sglang-fl-rogue)" in message
    assert "already owned by plugin 'acme' (sglang-fl-acme)" in message
    assert registry.owner("vendor.acme") == ACME
    assert registry.implementations("rms_norm") == ()


def test_another_plugin_of_the_same_distribution_cannot_take_an_impl_id(registry):
    """Impl ids follow the entry point, not the distribution (dispatch/identity.py)."""
    with registry.plugin_scope(ACME):
        registry.register(vendor_impl())
    same_dist_other_plugin = Provenance("acme2", "sglang-fl-acme", "1.2.3")
    message = refusal(
        registry, vendor_impl(op="rms_norm", fn=rms, vendor="acme2"), same_dist_other_plugin
    )
    assert "registered impl_id 'vendor.acme' (vendor)" in message
    assert "must be 'vendor.acme2' or start with 'vendor.acme2.'" in message
    assert registry.implementations("rms_norm") == ()


def in_scope(registry, provenance, *impls, then=None):
    """Register ``impls`` inside one plugin scope, then run ``then`` (still inside)."""
    with registry.plugin_scope(provenance):
        for impl in impls:
            registry.register(impl)
        if then is not None:
            then()


def test_duplicate_registration_in_one_scope(registry):
    with pytest.raises(RegistrationError) as info:
        in_scope(registry, ACME, vendor_impl(), vendor_impl())
    assert "registered 'vendor.acme' for op 'silu_and_mul' twice" in str(info.value)
    assert registry.implementations("silu_and_mul") == ()
    assert registry.owner("vendor.acme") is None


def test_duplicate_registration_of_committed_impl(registry):
    registry.register(vendor_impl())
    with pytest.raises(RegistrationError, match="twice"):
        registry.register(vendor_impl())
    assert len(registry.implementations("silu_and_mul")) == 1


# -- plugin scopes --------------------------------------------------------------------------------


def test_scope_commits_with_provenance(registry):
    with registry.plugin_scope(ACME):
        registry.register(vendor_impl())
        registry.register(vendor_impl(op="rms_norm", fn=rms))
        # Staged, not visible until the scope succeeds.
        assert registry.implementations("silu_and_mul") == ()
    assert [i.provenance for i in registry.implementations("silu_and_mul")] == [ACME]
    assert [i.provenance for i in registry.implementations("rms_norm")] == [ACME]


def test_exception_inside_scope_rolls_back_everything(registry):
    def boom():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        in_scope(registry, ACME, vendor_impl(), vendor_impl(op="rms_norm", fn=rms), then=boom)
    assert registry.implementations("silu_and_mul") == ()
    assert registry.implementations("rms_norm") == ()
    assert registry.owner("vendor.acme") is None
    # The scope is closed: the same plugin may load cleanly afterwards.
    with registry.plugin_scope(ACME):
        registry.register(vendor_impl())
    assert len(registry.implementations("silu_and_mul")) == 1


def test_plugin_that_swallows_a_refusal_is_still_rolled_back(registry):
    def careless_plugin():
        registry.register(vendor_impl())
        try:
            registry.register(vendor_impl(op="rms_norm", impl_id="vendor.acme.bad", fn=silu))
        except RegistrationError as exc:  # a careless plugin carries on
            assert "vendor.acme.bad" in str(exc)  # noqa: PT017
        registry.register(vendor_impl(op="rotary_embedding", impl_id="vendor.acme.ok", fn=silu_rot))

    with pytest.raises(RegistrationError) as info:
        in_scope(registry, ACME, then=careless_plugin)
    assert "'vendor.acme.bad' for op 'rms_norm'" in str(info.value)
    for op in registry.ops():
        assert registry.implementations(op) == ()
    assert registry.owner("vendor.acme") is None


def silu_rot(obj, query, key, cos, sin, position_ids, rotary_interleaved=False, inplace=True):
    return query, key


def test_failed_scope_does_not_poison_the_next_one(registry):
    with pytest.raises(RegistrationError), registry.plugin_scope(ROGUE):
        registry.register(vendor_impl(fn=None))
    with registry.plugin_scope(ACME):
        registry.register(vendor_impl())
    assert [i.provenance for i in registry.implementations("silu_and_mul")] == [ACME]


def test_scopes_do_not_nest(registry):
    with registry.plugin_scope(ACME), pytest.raises(RuntimeError, match="still open"):  # noqa: SIM117
        with registry.plugin_scope(ROGUE):
            pass


def test_conflict_with_a_staged_impl_of_the_same_scope_is_duplicate(registry):
    with pytest.raises(RegistrationError, match="twice"):
        in_scope(
            registry,
            ACME,
            vendor_impl(op="rms_norm", fn=rms),
            vendor_impl(op="rms_norm", fn=rms, priority=5),
        )
    assert registry.implementations("rms_norm") == ()


# -- ops a plugin has no kernel for ---------------------------------------------------------------


def test_a_declared_gap_is_kept_with_its_provenance(registry):
    provenance = Provenance("acme", "sglang-fl-acme", "1.0")
    with registry.plugin_scope(provenance):
        registry.declare_no_kernel("layer_norm", "no layer norm in the acme SDK")
        assert registry.no_kernel("layer_norm") == ()  # staged until the hook returns
    (gap,) = registry.no_kernel("layer_norm")
    assert (gap.op_name, gap.reason, gap.provenance) == (
        "layer_norm",
        "no layer norm in the acme SDK",
        provenance,
    )
    assert registry.implementations("layer_norm") == ()


@pytest.mark.parametrize(
    ("op", "reason", "message"),
    [
        ("layer_nrom", "x", "did you mean 'layer_norm'"),
        ("layer_norm", " ", "without a reason"),
    ],
)
def test_a_bad_gap_fails_the_plugin_and_drops_its_registrations(registry, op, reason, message):
    provenance = Provenance("acme", "sglang-fl-acme", "1.0")

    def hook() -> None:
        registry.register(vendor_impl())
        with contextlib.suppress(RegistrationError):  # swallowed: the plugin fails as a whole
            registry.declare_no_kernel(op, reason)

    with pytest.raises(RegistrationError, match=message), registry.plugin_scope(provenance):
        hook()
    assert all(registry.implementations(name) == () for name in registry.ops())
    assert all(registry.no_kernel(name) == () for name in registry.ops())
