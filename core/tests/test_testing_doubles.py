"""The base of vendors' SDK test doubles: constraints, recorded calls, installing, coverage."""

from __future__ import annotations

import sys

import pytest

from sglang_fl.dispatch.probes import ChipSdk
from sglang_fl.testing.doubles import (
    DOUBLE_VERSION,
    Call,
    Constraint,
    ConstraintViolation,
    SdkDouble,
    assert_rejects,
    constraint_tests,
    constraints_of,
    install_double,
)

NAME = "sglang_fl_test_double_sdk"


class WidgetSdk(SdkDouble):
    """A double with two operators and three constraints, one inherited."""

    EVEN = Constraint("twice", "an even count", "widget.h: assert(n % 2 == 0)")
    POSITIVE = Constraint("twice", "a positive count", "widget docs", "crashes the process")

    def __init__(self) -> None:
        super().__init__(NAME)

    def twice(self, n: int, *, label: str = "") -> int:
        self.record("twice", n, label=label)
        self.POSITIVE.check(n > 0, f"n={n}")
        self.EVEN.check(n % 2 == 0, f"n={n}")
        return 2 * n


class NewerWidgetSdk(WidgetSdk):
    SMALL = Constraint("twice", "a count below 100", "widget 2.0 release notes")

    def twice(self, n: int, *, label: str = "") -> int:
        self.SMALL.check(n < 100)
        return super().twice(n, label=label)


def test_a_violation_names_operator_rule_input_reaction_and_source() -> None:
    with pytest.raises(ConstraintViolation) as info:
        WidgetSdk().twice(-2)
    assert info.value.constraint is WidgetSdk.POSITIVE
    assert isinstance(info.value, RuntimeError)
    assert str(info.value) == (
        "twice: requires a positive count; got n=-2 (the real operator crashes the process; "
        "source: widget docs)"
    )


def test_calls_are_recorded_as_passed() -> None:
    sdk = WidgetSdk()
    assert sdk.twice(4, label="x") == 8
    assert sdk.calls == [Call("twice", (4,), {"label": "x"})]
    assert sdk.called == ["twice"]
    assert (sdk.__name__, sdk.__version__) == (NAME, DOUBLE_VERSION)


def test_constraints_of_a_double_include_inherited_ones_in_order() -> None:
    assert constraints_of(WidgetSdk) == [WidgetSdk.EVEN, WidgetSdk.POSITIVE]
    assert constraints_of(NewerWidgetSdk()) == [
        WidgetSdk.EVEN,
        WidgetSdk.POSITIVE,
        NewerWidgetSdk.SMALL,
    ]


def test_install_double_stands_in_for_the_sdk_for_one_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sdk = ChipSdk(NAME, device="Widget", count_devices=lambda: 1, devices_need_sdk=True)
    double = install_double(monkeypatch, WidgetSdk(), sdk)
    assert sdk.require() is double
    assert sys.modules[NAME] is double
    monkeypatch.undo()
    assert sdk.module is None
    assert NAME not in sys.modules


def test_install_double_refuses_a_double_of_another_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    sdk = ChipSdk("other_sdk", device="Widget", count_devices=lambda: 1, devices_need_sdk=True)
    with pytest.raises(ValueError, match=f"named '{NAME}' cannot stand in for 'other_sdk'"):
        install_double(monkeypatch, WidgetSdk(), sdk)


def test_constraint_tests_pass_for_a_complete_table() -> None:
    valid, rejects, covered = constraint_tests(
        WidgetSdk,
        [lambda sdk: sdk.twice(2)],
        {WidgetSdk.EVEN: lambda sdk: sdk.twice(3), WidgetSdk.POSITIVE: lambda sdk: sdk.twice(0)},
    )
    valid(lambda sdk: sdk.twice(2))
    rejects(WidgetSdk.EVEN, lambda sdk: sdk.twice(3))
    covered()


def test_constraint_tests_catch_a_wrong_or_missing_rejection() -> None:
    _, rejects, covered = constraint_tests(
        NewerWidgetSdk, [], {WidgetSdk.EVEN: lambda sdk: sdk.twice(-1)}
    )
    with pytest.raises(AssertionError, match="requires a positive count"):
        rejects(WidgetSdk.EVEN, lambda sdk: sdk.twice(-1))  # refused, but for another rule
    with pytest.raises(AssertionError, match=r"without a rejecting call: \['twice: a posit"):
        covered()


def test_assert_rejects_needs_that_constraint_refused() -> None:
    assert_rejects(WidgetSdk(), WidgetSdk.EVEN, lambda sdk: sdk.twice(3))
    with pytest.raises(AssertionError, match="requires a positive count"):
        assert_rejects(WidgetSdk(), WidgetSdk.EVEN, lambda sdk: sdk.twice(-2))
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        assert_rejects(WidgetSdk(), WidgetSdk.EVEN, lambda sdk: sdk.twice(2))
