"""The SGLang attention backend as a policy selection: vendors' whole backends vs the kernels'.

Real plugins (throwaway distributions with entry points) offer backends through
``sglang_fl_attention_backend``; :func:`build_backend` is called as SGLang's registry calls
``create_backend``, with ``list`` standing in for SGLang's ``AttentionBackend`` base (the
isinstance check is the code under test; SGLang itself is not installed in this env).
"""

from __future__ import annotations

import json

import pytest

from sglang_fl import SglangAttentionBackendOffer, cli
from sglang_fl.config import Settings
from sglang_fl.dispatch_report import DispatchReport, read_log
from sglang_fl.errors import ConfigError, StrictModeError
from sglang_fl.integrations.sglang.backend_selection import (
    REFERENCE_IMPL_ID,
    build_backend,
    select,
)
from sglang_fl.ops.attention import SGLANG_ATTENTION_BACKEND
from sglang_fl.runtime import Runtime

OFFERING = """
import os
from sglang_fl import SglangAttentionBackendOffer, hookimpl

def build(model_runner):
    mode = os.environ.get("OFFER_MODE", "ok")
    if mode == "raise":
        raise RuntimeError("no device memory for the workspace")
    if mode == "wrong":
        return "not a backend"
    return ["vendor", model_runner]

@hookimpl
def sglang_fl_attention_backend():
    if os.environ.get("OFFER_MODE") == "hook-raises":
        raise ValueError("hook broke")
    return SglangAttentionBackendOffer(
        factory=build, available=os.environ.get("OFFER_AVAILABLE", "1") == "1"
    )
"""

SILENT = """
from sglang_fl import hookimpl

@hookimpl
def sglang_fl_attention_backend():
    return None
"""

VENDOR_ID = "vendor.acme.attention_backend"


def kernel_backend(model_runner):
    return ["kernels", model_runner]


@pytest.fixture
def acme(plugin_site):
    plugin_site.plugin("acme", OFFERING)
    plugin_site.plugin("quiet", SILENT)


def build(tmp_path, runner="runner-0"):
    runtime = Runtime(Settings.from_environment())
    log = tmp_path / "dispatch.jsonl"
    backend = build_backend(runtime, DispatchReport(log), runner, kernel_backend, list)
    return backend, read_log(log)


def outcomes(runtime):
    decision = select(runtime, kernel_backend).decision
    return {c.impl.impl_id: (c.outcome, c.reason) for c in decision.candidates}


def test_without_offers_the_kernel_based_backend_serves(tmp_path):
    backend, records = build(tmp_path)
    assert backend == ["kernels", "runner-0"]
    (record,) = records
    assert record["event"] == "attention_backend"
    assert (record["op"], record["impl_id"], record["kind"]) == (
        SGLANG_ATTENTION_BACKEND,
        REFERENCE_IMPL_ID,
        "reference",
    )
    assert record["backend_class"] == "builtins.list"
    assert record["failed"] == []


def test_an_offer_ranks_above_the_kernels_by_the_default_order(acme, tmp_path):
    backend, records = build(tmp_path)
    assert backend == ["vendor", "runner-0"]
    (record,) = records
    assert (record["impl_id"], record["vendor"], record["distribution"]) == (
        VENDOR_ID,
        "acme",
        "sglang-fl-acme",
    )
    assert "matches vendor" in record["reason"]
    runtime = Runtime(Settings.from_environment())
    assert set(outcomes(runtime)) == {VENDOR_ID, REFERENCE_IMPL_ID}  # quiet offers nothing


@pytest.mark.parametrize(
    ("variable", "value", "why"),
    [
        ("SGLANG_FL_DENY_VENDORS", "acme", "is denied"),
        ("SGLANG_FL_ALLOW_VENDORS", "quiet", "not in the allow list"),
        ("SGLANG_FL_PER_OP", f"{SGLANG_ATTENTION_BACKEND}=reference", "matches no token"),
        ("OFFER_AVAILABLE", "0", "unavailable"),
    ],
)
def test_the_policy_governs_the_offer(acme, tmp_path, monkeypatch, variable, value, why):
    monkeypatch.setenv(variable, value)
    backend, _ = build(tmp_path)
    assert backend == ["kernels", "runner-0"]
    outcome, reason = outcomes(Runtime(Settings.from_environment()))[VENDOR_ID]
    assert outcome == "rejected"
    assert why in reason


def test_prefer_reference_keeps_the_offer_as_fallback(acme, tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_FL_PREFER", "reference")
    backend, _ = build(tmp_path)
    assert backend == ["kernels", "runner-0"]
    outcome, _ = outcomes(Runtime(Settings.from_environment()))[VENDOR_ID]
    assert outcome == "fallback"


@pytest.mark.parametrize(
    ("mode", "problem"),
    [
        ("raise", "its factory raised RuntimeError: no device memory for the workspace"),
        ("wrong", "its factory returned 'not a backend', not an SGLang list"),
    ],
)
def test_a_factory_that_fails_falls_back_reported(acme, tmp_path, monkeypatch, mode, problem):
    monkeypatch.setenv("OFFER_MODE", mode)
    backend, records = build(tmp_path)
    assert backend == ["kernels", "runner-0"]
    fallback, served = records
    assert fallback["event"] == "fallback"
    assert (fallback["op"], fallback["impl_id"], fallback["next_impl_id"]) == (
        SGLANG_ATTENTION_BACKEND,
        VENDOR_ID,
        REFERENCE_IMPL_ID,
    )
    assert fallback["reason"] == problem
    assert (served["impl_id"], served["failed"]) == (REFERENCE_IMPL_ID, [VENDOR_ID])


def test_strict_makes_a_failing_factory_an_error_naming_the_vendor(acme, tmp_path, monkeypatch):
    monkeypatch.setenv("OFFER_MODE", "raise")
    monkeypatch.setenv("SGLANG_FL_STRICT", "1")
    with pytest.raises(StrictModeError, match=r"vendor 'acme': attention backend vendor\.acme"):
        build(tmp_path)


def test_a_hook_that_raises_is_a_rejected_candidate(acme, tmp_path, monkeypatch):
    monkeypatch.setenv("OFFER_MODE", "hook-raises")
    backend, _ = build(tmp_path)
    assert backend == ["kernels", "runner-0"]
    outcome, reason = outcomes(Runtime(Settings.from_environment()))[VENDOR_ID]
    assert outcome == "rejected"
    assert reason == "sglang_fl_attention_backend raised ValueError: hook broke"
    monkeypatch.setenv("SGLANG_FL_STRICT", "1")
    with pytest.raises(StrictModeError, match="plugin 'acme': sglang_fl_attention_backend raised"):
        build(tmp_path)


def test_per_op_naming_only_an_absent_vendor_leaves_the_kernels_unless_strict(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("SGLANG_FL_PER_OP", f"{SGLANG_ATTENTION_BACKEND}=vendor:acme")
    backend, (record,) = build(tmp_path)
    assert backend == ["kernels", "runner-0"]
    assert "no usable implementation" in record["reason"]
    monkeypatch.setenv("SGLANG_FL_STRICT", "1")
    with pytest.raises(Exception, match="no usable implementation"):
        build(tmp_path)


def test_the_cli_lists_and_explains_the_selection(acme, capsys):
    assert cli.main(["explain", SGLANG_ATTENTION_BACKEND, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["chosen"] == VENDOR_ID
    assert report["sglang_layer"] == "--attention-backend sglang_fl"
    assert {c["impl_id"] for c in report["candidates"]} == {VENDOR_ID, REFERENCE_IMPL_ID}
    cli.main(["ops", "--json"])
    listed = json.loads(capsys.readouterr().out)
    assert SGLANG_ATTENTION_BACKEND not in {o["op"] for o in listed["ops"]}
    assert [(s["op"], s["chosen"]) for s in listed["selections"]] == [
        (SGLANG_ATTENTION_BACKEND, VENDOR_ID),
        ("sglang_graph_runner", "reference.sglang_graph_runner"),
    ]


def test_the_offer_is_frozen_and_per_op_accepts_the_selection(monkeypatch):
    offer = SglangAttentionBackendOffer(factory=kernel_backend)
    with pytest.raises(AttributeError):
        offer.priority = 1  # type: ignore[misc]
    monkeypatch.setenv("SGLANG_FL_PER_OP", f"{SGLANG_ATTENTION_BACKEND}=reference")
    assert SGLANG_ATTENTION_BACKEND in Settings.from_environment().per_op
    monkeypatch.setenv("SGLANG_FL_PER_OP", "sglang_attention_backnd=reference")
    with pytest.raises(ConfigError, match="unknown op"):
        Settings.from_environment()
