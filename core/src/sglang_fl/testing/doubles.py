"""Test doubles of chip SDKs: strict stand-ins for the kernels a test machine cannot run.

A vendor's adapters call an SDK (``sgl_kernel``, ``torch_npu``, ...) that needs its chip. On a
machine without one, the adapters are tested against a *double*: a module that implements the
SDK operators' documented semantics in PyTorch and rejects every input the real operator
rejects, so that a call that passes against the double also passes on the chip. What every
double shares lives here:

- :class:`SdkDouble`, the base of a double: a module object named like the SDK that records
  every operator call in :attr:`SdkDouble.calls`;
- :class:`Constraint`, one documented precondition of one operator with the source that
  documents it; :meth:`Constraint.check` raises :class:`ConstraintViolation` naming the
  operator, the rule, the source and what was passed. A double declares its constraints as
  class attributes, so :func:`constraints_of` lists them and a vendor's test can prove that
  each one rejects what the real operator rejects;
- :func:`install_double`, which puts a double in place of the SDK for one test: in
  ``sys.modules`` and as the vendor's :class:`~sglang_fl.dispatch.probes.ChipSdk` module;
- :func:`assert_rejects`, one such proof: the call must be refused for that constraint;
- :func:`constraint_tests`, the tests proving that a double rejects what the real SDK rejects:
  one call per declared constraint, valid but for that constraint.

Usage in a vendor's ``tests/conftest.py`` and ``tests/test_double_constraints.py``::

    @pytest.fixture
    def my_sdk(monkeypatch):
        return install_double(monkeypatch, MySdkDouble(), MY_SDK)

    test_valid_calls_pass, test_rejects_what_the_sdk_rejects, test_every_constraint_is_covered = (
        constraint_tests(MySdkDouble, valid=[...], rejected={MySdkDouble.SOME_RULE: call, ...})
    )
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

if TYPE_CHECKING:
    import pytest

    from ..dispatch.probes import ChipSdk

__all__ = [
    "Call",
    "Constraint",
    "ConstraintViolation",
    "SdkDouble",
    "assert_rejects",
    "constraint_tests",
    "constraints_of",
    "install_double",
]

DOUBLE_VERSION = "0.0.0+double"


class Call(NamedTuple):
    """One recorded operator call: its name and the arguments exactly as passed."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Constraint:
    """A precondition of one SDK operator, and where the SDK documents it.

    ``rule`` says what the real operator requires (``"input is contiguous"``); ``source`` names
    the document a reader can check it against (the wheel's wrapper or op schema, the vendor's
    API page). ``reaction`` says what the real operator does otherwise (raises, reads garbage,
    crashes the process), which is why the double refuses the call.
    """

    operator: str
    rule: str
    source: str
    reaction: str = field(default="raises")

    def check(self, holds: bool, passed: str = "") -> None:
        """Raise :class:`ConstraintViolation` unless ``holds``; ``passed`` describes the input."""
        if not holds:
            raise ConstraintViolation(self, passed)


class ConstraintViolation(RuntimeError):
    """A double refused a call the real operator would reject (a ``RuntimeError``, as the
    operators' own argument checks raise)."""

    def __init__(self, constraint: Constraint, passed: str = "") -> None:
        self.constraint = constraint
        detail = f"; got {passed}" if passed else ""
        super().__init__(
            f"{constraint.operator}: requires {constraint.rule}{detail} (the real operator "
            f"{constraint.reaction}; source: {constraint.source})"
        )


class SdkDouble(types.ModuleType):
    """Base of an SDK double: a module named like the SDK that records its operator calls.

    Subclasses define the SDK's operators as methods; each starts with :meth:`record` and then
    checks its :class:`Constraint` class attributes before computing anything.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__version__ = DOUBLE_VERSION
        self.calls: list[Call] = []

    def record(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Note one call of operator ``name`` with its arguments, as passed."""
        self.calls.append(Call(name, args, kwargs))

    @property
    def called(self) -> list[str]:
        """The operator names called so far, in order."""
        return [call.name for call in self.calls]


DoubleT = TypeVar("DoubleT", bound=SdkDouble)


def constraints_of(double: type[SdkDouble] | SdkDouble) -> list[Constraint]:
    """Every :class:`Constraint` a double's class (and its bases) declares, in order."""
    cls = double if isinstance(double, type) else type(double)
    found: list[Constraint] = []
    for klass in reversed(cls.__mro__):
        found += [v for v in vars(klass).values() if isinstance(v, Constraint) and v not in found]
    return found


def install_double(monkeypatch: pytest.MonkeyPatch, double: DoubleT, sdk: ChipSdk) -> DoubleT:
    """Make ``double`` the SDK for one test: ``sys.modules[sdk.name]`` and ``sdk.module``.

    ``monkeypatch`` restores both when the test ends, so the next test gets a fresh double.
    """
    if double.__name__ != sdk.name:
        raise ValueError(f"a double named {double.__name__!r} cannot stand in for {sdk.name!r}")
    monkeypatch.setitem(sys.modules, sdk.name, double)
    monkeypatch.setattr(sdk, "module", double)
    return double


def assert_rejects(
    double: DoubleT, constraint: Constraint, call: Callable[[DoubleT], object]
) -> None:
    """``call(double)`` must be refused for ``constraint``, the refusal naming its source."""
    import pytest

    with pytest.raises(ConstraintViolation) as info:
        call(double)
    assert info.value.constraint is constraint, str(info.value)
    assert constraint.source in str(info.value)


def constraint_tests(
    make_double: Callable[[], DoubleT],
    valid: Sequence[Callable[[DoubleT], object]],
    rejected: Mapping[Constraint, Callable[[DoubleT], object]],
) -> tuple[Callable[..., None], Callable[..., None], Callable[..., None]]:
    """Three pytest tests for a double; bind them to ``test_*`` names in a test module.

    ``valid`` are calls the real SDK accepts: each must pass (so every refusal below is
    specific). ``rejected`` maps each constraint to a call that violates it alone: the double
    must refuse it naming that constraint and its source. The third test fails when the double
    declares a constraint that ``rejected`` does not exercise.
    """
    import pytest

    @pytest.mark.parametrize("call", valid)
    def test_valid_calls_pass(call: Callable[[DoubleT], object]) -> None:
        call(make_double())

    @pytest.mark.parametrize(
        ("constraint", "call"),
        list(rejected.items()),
        ids=[f"{c.operator}: {c.rule}" for c in rejected],
    )
    def test_rejects_what_the_sdk_rejects(
        constraint: Constraint, call: Callable[[DoubleT], object]
    ) -> None:
        assert_rejects(make_double(), constraint, call)

    def test_every_constraint_is_covered() -> None:
        declared = constraints_of(make_double())
        missing = [f"{c.operator}: {c.rule}" for c in declared if c not in rejected]
        assert not missing, f"constraints without a rejecting call: {missing}"

    return (
        test_valid_calls_pass,
        test_rejects_what_the_sdk_rejects,
        test_every_constraint_is_covered,
    )
