"""A vendor's decode graph runner as a policy selection against the platform's own runner.

Real plugins (throwaway distributions with entry points) offer runners through
``sglang_fl_graph_runner``; :func:`build_graph_runner` is called as SGLang builds the class a
platform names (``get_graph_runner_cls()(model_runner)``). The model runner is a stand-in whose
attention backend answers ``graph_problem`` as sglang-fl's backend does (SGLang itself is not
installed in this env).
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from sglang_fl import GraphMode, SglangGraphRunnerOffer, cli
from sglang_fl.config import Settings
from sglang_fl.dispatch_report import DispatchReport, read_log
from sglang_fl.errors import StrictModeError
from sglang_fl.integrations.sglang.backend_selection import GRAPH_RUNNER, select
from sglang_fl.integrations.sglang.graph_runner import build_graph_runner, selected_graph_runner
from sglang_fl.ops.graph_runner import SGLANG_GRAPH_RUNNER
from sglang_fl.runtime import Runtime

OFFERING = """
import os
from sglang_fl import GraphMode, SglangGraphRunnerOffer, hookimpl

def build(model_runner):
    if os.environ.get("OFFER_MODE") == "raise":
        raise RuntimeError("NPU graph capture failed")
    return ("npu graphs", model_runner.name)

@hookimpl
def sglang_fl_graph_runner():
    mode = os.environ.get("OFFER_GRAPH_MODE", "captured")
    if mode == "not-a-mode":
        return SglangGraphRunnerOffer(factory=build, mode="captured")  # a plain string
    return SglangGraphRunnerOffer(factory=build, mode=GraphMode(mode))
"""

VENDOR_ID = "vendor.acme.graph_runner"
REFERENCE_ID = "reference.sglang_graph_runner"


def platform_runner(model_runner: Any, **options: Any) -> tuple[str, str]:
    return ("compiled on the cpu", model_runner.name)


def model_runner(refused: str | None = None) -> SimpleNamespace:
    """A model runner whose attention backend refuses ``refused`` graphs (None: none)."""

    def graph_problem(mode: GraphMode) -> str | None:
        return "a planner reads host lengths" if mode == refused else None

    return SimpleNamespace(
        name="runner-0", attn_backend=SimpleNamespace(graph_problem=graph_problem)
    )


@pytest.fixture
def acme(plugin_site: Any) -> None:
    plugin_site.plugin("acme", OFFERING)


def build(tmp_path: Any, runner: SimpleNamespace | None = None) -> tuple[Any, list[dict]]:
    runtime = Runtime(Settings.from_environment())
    log = tmp_path / "dispatch.jsonl"
    built = build_graph_runner(
        runtime, DispatchReport(log), runner or model_runner(), platform_runner
    )
    return built, read_log(log)


def test_without_offers_the_platforms_runner_serves(tmp_path: Any) -> None:
    runner, (record,) = build(tmp_path)
    assert runner == ("compiled on the cpu", "runner-0")
    assert record["event"] == "graph_runner"
    assert (record["op"], record["impl_id"], record["failed"]) == (
        SGLANG_GRAPH_RUNNER,
        REFERENCE_ID,
        [],
    )
    assert record["graph_runner"] == "builtins.tuple"


def test_an_offer_ranks_above_the_platforms_runner(acme: None, tmp_path: Any) -> None:
    runner, (record,) = build(tmp_path)
    assert runner == ("npu graphs", "runner-0")
    assert (record["impl_id"], record["vendor"], record["distribution"]) == (
        VENDOR_ID,
        "acme",
        "sglang-fl-acme",
    )


def test_an_offer_whose_mode_the_attention_backend_refuses_falls_back_before_it_builds(
    acme: None, tmp_path: Any
) -> None:
    runner, (fallback, served) = build(tmp_path, model_runner(refused=GraphMode.CAPTURED))
    assert runner == ("compiled on the cpu", "runner-0")
    assert (fallback["event"], fallback["impl_id"], fallback["next_impl_id"]) == (
        "fallback",
        VENDOR_ID,
        REFERENCE_ID,
    )
    assert "refuses captured graphs: a planner reads host lengths" in fallback["reason"]
    assert (served["impl_id"], served["failed"]) == (REFERENCE_ID, [VENDOR_ID])


def test_a_factory_that_raises_falls_back_reported_or_is_an_error_under_strict(
    acme: None, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OFFER_MODE", "raise")
    runner, (fallback, _) = build(tmp_path)
    assert runner == ("compiled on the cpu", "runner-0")
    assert fallback["reason"] == "RuntimeError: NPU graph capture failed"
    monkeypatch.setenv("SGLANG_FL_STRICT", "1")
    with pytest.raises(StrictModeError, match=r"vendor 'acme': graph runner vendor\.acme"):
        build(tmp_path)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SGLANG_FL_DENY_VENDORS", "acme"),
        ("SGLANG_FL_PER_OP", f"{SGLANG_GRAPH_RUNNER}=reference"),
    ],
)
def test_the_policy_governs_the_offer(
    acme: None, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    runner, (record,) = build(tmp_path)
    assert runner == ("compiled on the cpu", "runner-0")
    assert record["impl_id"] == REFERENCE_ID


def test_an_offer_without_a_graph_mode_is_a_rejected_candidate(
    acme: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OFFER_GRAPH_MODE", "not-a-mode")
    decision = select(Runtime(Settings.from_environment()), platform_runner, GRAPH_RUNNER).decision
    verdicts = {c.impl.impl_id: c for c in decision.candidates}
    assert verdicts[VENDOR_ID].outcome == "rejected"
    assert "mode='captured'; expected a GraphMode" in verdicts[VENDOR_ID].reason


def test_the_platforms_class_is_built_as_sglang_builds_a_runner() -> None:
    runner = selected_graph_runner(platform_runner)(model_runner())
    assert runner == ("compiled on the cpu", "runner-0")


def test_the_cli_explains_the_selection(acme: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["explain", SGLANG_GRAPH_RUNNER, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["chosen"] == VENDOR_ID
    assert {c["impl_id"] for c in report["candidates"]} == {VENDOR_ID, REFERENCE_ID}


def test_the_offer_is_frozen() -> None:
    offer = SglangGraphRunnerOffer(factory=platform_runner)
    assert offer.mode is GraphMode.CAPTURED
    with pytest.raises(AttributeError):
        offer.mode = GraphMode.COMPILED  # type: ignore[misc]
