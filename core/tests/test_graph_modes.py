"""Which implementations a graph runner can replay: declared per implementation, checked as
they bind once a runner has started (``OpImpl.graph_problems``, ``Runtime.bound``)."""

from __future__ import annotations

import pytest

from sglang_fl.config import Settings
from sglang_fl.dispatch.registry import OpRegistry
from sglang_fl.dispatch.types import BackendImplKind, OpImpl
from sglang_fl.errors import GraphModeRefused, RegistrationError
from sglang_fl.ops import STANDARD_OPS
from sglang_fl.ops.attention.plan import GraphMode
from sglang_fl.runtime import Runtime

SILU = STANDARD_OPS["silu_and_mul"].reference


def vendor(op: str = "silu_and_mul", **fields: object) -> OpImpl:
    fn = STANDARD_OPS[op].reference
    return OpImpl(op, "vendor.acme", BackendImplKind.VENDOR, fn, vendor="acme", **fields)


def registered(impl: OpImpl) -> OpImpl:
    registry = OpRegistry()
    registry.register(impl)
    (kept,) = registry.implementations(impl.op_name)
    return kept


def test_declared_problems_are_kept_per_mode() -> None:
    kept = registered(vendor(graph_problems={"captured": "syncs with the host"}))
    assert kept.graph_problem(GraphMode.CAPTURED) == "syncs with the host"
    assert kept.graph_problem(GraphMode.COMPILED) is None


@pytest.mark.parametrize(
    "declared", [{"cuda": "x"}, {"captured": ""}, ["captured"], {"captured": 3}]
)
def test_a_wrong_declaration_is_refused(declared: object) -> None:
    with pytest.raises(RegistrationError, match="graph_problems"):
        registered(vendor(graph_problems=declared))


def test_a_planned_ops_planner_answers_for_its_calls() -> None:
    kept = registered(vendor("decode_attention"))
    assert "declares nothing about device graphs" in str(kept.graph_problem(GraphMode.CAPTURED))
    assert kept.graph_problem(GraphMode.COMPILED) is None


def test_references_reading_values_on_the_host_declare_device_graphs() -> None:
    declared = {
        name: contract.reference_graph_problems
        for name, contract in STANDARD_OPS.items()
        if contract.reference_graph_problems
    }
    assert set(declared) == {
        "fused_moe",
        "causal_conv1d_update",
        "fused_recurrent_gated_delta_rule_packed_decode",
        "fused_sigmoid_gating_delta_rule_update",
        "track_mamba_states",
    }
    assert all(set(problems) == {"captured"} for problems in declared.values())


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Runtime:
    monkeypatch.setenv("SGLANG_FL_PLUGINS", "")  # the reference backend only
    return Runtime(Settings.from_environment())


def test_once_a_runner_started_a_binding_it_cannot_replay_is_refused(runtime: Runtime) -> None:
    moe = runtime.resolve("fused_moe").decision.chosen
    silu = runtime.resolve("silu_and_mul").decision.chosen
    runtime.bound("silu_and_mul", silu)
    assert runtime.graph_problems(GraphMode.CAPTURED) == []
    runtime.bound("fused_moe", moe)  # no runner yet: bound
    problems = runtime.graph_problems(GraphMode.CAPTURED)
    assert problems == [f"fused_moe: reference.fused_moe: {moe.graph_problem('captured')}"]
    assert runtime.graph_problems(GraphMode.COMPILED) == []
    runtime.enter_graph_mode(GraphMode.CAPTURED)
    runtime.bound("silu_and_mul", silu)
    with pytest.raises(GraphModeRefused, match=r"fused_moe: reference\.fused_moe cannot run"):
        runtime.bound("fused_moe", moe)
