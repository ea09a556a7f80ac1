"""The shared header of a vendor wheel's own test suite: discovery, and the adapter harness.

Every vendor's tests ask the same questions of the installed wheel (is it discovered, what does
it register, does every op resolve to it or say why not) and run the same contract grid
through its adapters against its SDK double. :class:`VendorSuite` answers them once, for one
plugin; a vendor's test module builds one at its top::

    from sglang_fl.testing.vendor import VendorSuite

    SUITE = VendorSuite("my_chip", plugin.sglang_fl_register_ops, doubles=Path(__file__).parent)

    @pytest.mark.parametrize(("op", "case", "dtype"), SUITE.contract_cases())
    def test_contract_case(my_sdk, op, case, dtype):
        outcome = check_case(SUITE.implementations[op], case, dtype)
        ...

    @pytest.mark.parametrize(("op", "case"), SUITE.plan_cases())
    def test_plan(my_sdk, op, case):  # the attention ops' planner, graph-mode plans included
        assert check_plan(SUITE.implementations[op], case).status == PASSED

    def test_every_op_says_why_my_chip_is_not_used():
        decisions = SUITE.cli("ops", "--json")["ops"]
        SUITE.assert_unused(decisions, NO_KERNEL, because="no my_chip device visible")

The ``cli``/``python`` runs start a fresh interpreter, as a user meets the plugin: no
``SGLANG_FL_*`` setting of the test process leaks in, the folders given (the SDK double's,
a broken SDK's) come first on its path, and a hung child fails the test after
:data:`SUBPROCESS_TIMEOUT` seconds instead of holding the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from ..dispatch.types import OpImpl
from ..ops import STANDARD_OPS
from .checks import contract_grid, registered_by

if TYPE_CHECKING:
    from _pytest.mark import ParameterSet

    from ..dispatch.registry import OpRegistry

__all__ = ["SUBPROCESS_TIMEOUT", "VendorSuite", "fresh_env", "topk_config"]

# Seconds one CLI or ``python -c`` child may take: loading core, the plugin and torch is a few.
SUBPROCESS_TIMEOUT = 120.0
Decision = Mapping[str, Any]


def fresh_env(*paths: Path) -> dict[str, str]:
    """This process's environment less every ``SGLANG_FL_*`` setting, ``paths`` as PYTHONPATH.

    A setting left over from the test runner (``SGLANG_FL_PREFER``, a plugin list) would change
    which implementation a child selects, so none is inherited.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_FL_")}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    return env


def topk_config(top_k: int, **options: object) -> SimpleNamespace:
    """A stand-in for SGLang's ``TopKConfig``, the ``obj`` of ``topk``: every attribute the
    contract reads (:mod:`sglang_fl.ops.moe`), plain softmax routing with renormalization unless
    ``options`` say otherwise."""
    config: dict[str, object] = {
        "top_k": top_k,
        "renormalize": True,
        "scoring_func": "softmax",
        "use_grouped_topk": False,
        "num_expert_group": None,
        "topk_group": None,
        "correction_bias": None,
        "routed_scaling_factor": None,
        "apply_routed_scaling_factor_on_output": False,
    }
    unknown = set(options) - set(config)
    if unknown:
        raise TypeError(
            f"topk_config: unknown attribute(s) {sorted(unknown)}; allowed: {list(config)}"
        )
    return SimpleNamespace(**{**config, **options})


@dataclass(frozen=True)
class VendorSuite:
    """One vendor plugin as its own tests see it.

    ``plugin`` is the entry-point name (``cuda``), ``register_ops`` the plugin's registration
    (its ``sglang_fl_register_ops`` hook function or seed ``register_builtins``), ``doubles``
    the folder of its SDK test doubles, put on every child's path.
    """

    plugin: str
    register_ops: Callable[[OpRegistry], object]
    doubles: Path | None = None
    timeout: float = SUBPROCESS_TIMEOUT

    @property
    def impl_id(self) -> str:
        """The impl id the identity rule gives a vendor plugin's kernels: ``vendor.<plugin>``."""
        return f"vendor.{self.plugin}"

    @property
    def distribution(self) -> str:
        """The vendor wheel's distribution name, as ``new-vendor`` names it."""
        return f"sglang-fl-{self.plugin}"

    # -- what the plugin registers, without loading any other plugin ------------------------

    @cached_property
    def registry(self) -> OpRegistry:
        """A fresh registry filled by this plugin's registration alone."""
        return registered_by(self.register_ops)

    @cached_property
    def implementations(self) -> Mapping[str, OpImpl]:
        """op -> the implementation the plugin registers for it (standard-op order)."""
        return {op: impl for op in STANDARD_OPS for impl in self.registry.implementations(op)}

    @property
    def ops(self) -> frozenset[str]:
        """The standard ops this plugin implements."""
        return frozenset(self.implementations)

    def contract_cases(self) -> list[ParameterSet]:
        """``(op, case, dtype)`` pytest params: every case and dtype of every op implemented,
        with ids ``<op>/<dtype>/<case>`` as the conformance kit names them. Collectives are
        not among them: their cases run on several ranks at once
        (:func:`~sglang_fl.testing.collectives.run_collective_checks`)."""
        import pytest

        return [
            pytest.param(op, case, dtype, id=f"{op}/{case_id}")
            for op in self.implementations
            if STANDARD_OPS[op].collective is None
            for case, dtype, case_id in contract_grid(op)
        ]

    def plan_cases(self) -> list[ParameterSet]:
        """``(op, case)`` pytest params for :func:`~sglang_fl.testing.checks.check_plan`: every
        case of every planned op implemented (the attention ops), ids ``<op>/plan/<case>``."""
        import pytest

        return [
            pytest.param(op, case, id=f"{op}/plan/{case.name}")
            for op in self.implementations
            if STANDARD_OPS[op].plan_stage is not None
            for case in STANDARD_OPS[op].cases
        ]

    # -- the installed wheel, met in a fresh interpreter ------------------------------------

    def run(self, command: Sequence[str], *paths: Path) -> Any:
        """Run ``command`` (``paths``, then the doubles, first on its path); parse its JSON.

        A non-zero exit fails with the child's standard error, a hang after ``timeout``.
        """
        search = (*paths, self.doubles) if self.doubles is not None else paths
        done = subprocess.run(
            list(command),
            capture_output=True,
            text=True,
            env=fresh_env(*search),
            check=False,
            timeout=self.timeout,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def cli(self, *args: str) -> Any:
        """The installed ``sglang-fl`` command (``python -m sglang_fl`` without its script)."""
        script = Path(sys.executable).with_name("sglang-fl")
        command = [str(script)] if script.exists() else [sys.executable, "-m", "sglang_fl"]
        return self.run([*command, *args])

    def python(self, code: str, *paths: Path) -> Any:
        """Run ``code`` (dedented) with ``python -c``; it prints one JSON document."""
        return self.run([sys.executable, "-c", textwrap.dedent(code)], *paths)

    # -- reading decision records (``explain --json``, ``Decision.to_dict()``) --------------

    def candidate(self, decision: Decision) -> Mapping[str, Any]:
        """This plugin's one candidate in a decision record."""
        mine: list[Mapping[str, Any]] = [
            c for c in decision["candidates"] if c["plugin"] == self.plugin
        ]
        assert len(mine) == 1, f"{self.plugin}: {len(mine)} candidates in {decision['op']}"
        return mine[0]

    def assert_unused(
        self, decisions: Mapping[str, Decision], no_kernel: Mapping[str, str], because: str
    ) -> None:
        """Every op resolved to the reference; this plugin's candidate says why, starting with
        ``because``; an op it does not implement has no candidate, and the reason it declared
        (``no_kernel``: op -> reason) where it declared one."""
        for op, decision in decisions.items():
            assert decision["chosen"] == f"reference.{op}", op
            if op not in self.ops:
                candidates = [c for c in decision["candidates"] if c["plugin"] == self.plugin]
                assert not candidates, op
                if op in no_kernel:
                    gaps = [g for g in decision["no_kernel"] if g["plugin"] == self.plugin]
                    assert [g["reason"] for g in gaps] == [no_kernel[op]], op
                continue
            mine = self.candidate(decision)
            assert mine["impl_id"] == self.impl_id, op
            assert mine["distribution"] == self.distribution, op
            assert mine["outcome"] == "rejected", op
            assert mine["available"] is False, op
            assert mine["availability_reason"].startswith(because), mine["availability_reason"]
            assert mine["reason"] == f"unavailable: {mine['availability_reason']}", op

    def assert_routed(
        self,
        decisions: Mapping[str, Decision],
        availability: str,
        *,
        reasons: Mapping[str, str] | None = None,
    ) -> None:
        """Every op this plugin implements resolved to it, its probe saying ``availability``
        (``reasons``: op -> what another probe of the plugin says, e.g. its collectives');
        every other op to the reference."""
        assert set(decisions) >= self.ops, sorted(self.ops - set(decisions))
        for op, decision in decisions.items():
            if op not in self.ops:
                assert decision["chosen"] == f"reference.{op}", op
                continue
            assert decision["chosen"] == self.impl_id, op
            want = (reasons or {}).get(op, availability)
            assert self.candidate(decision)["availability_reason"] == want, op
