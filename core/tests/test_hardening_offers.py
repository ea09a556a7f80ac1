"""Hardening III: attention-backend offers held to the guarantees of an ``OpImpl`` (issue 33).

Real plugins (throwaway distributions with entry points) offer whole backends through
``sglang_fl_attention_backend``; :func:`build_backend` is called as SGLang's registry calls
``create_backend``, with ``list`` standing in for SGLang's ``AttentionBackend`` (the engine
tests run the same paths inside SGLang). Each test failed on 4ee63c2:

- an offer whose ``priority`` is ``"high"``, NaN or ``1e400`` crashed ``ops --json`` and
  ``explain --json`` (and the engine); ``"7"``, ``2.9``, ``True`` were coerced; ``factory=None``
  was reported as the chosen backend;
- a factory raising ``SystemExit`` (or another ``BaseException``) ended the host;
- a factory that never returned hung the engine's start-up;
- a 50 MB ``repr()`` or message became a 50 MB JSON field and log line.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from sglang_fl import cli
from sglang_fl.config import Settings
from sglang_fl.dispatch_report import DispatchReport, read_log
from sglang_fl.errors import StrictModeError
from sglang_fl.integrations.sglang.backend_selection import REFERENCE_IMPL_ID, build_backend
from sglang_fl.ops.attention import SGLANG_ATTENTION_BACKEND
from sglang_fl.runtime import Runtime

OFFER = """
from sglang_fl import SglangAttentionBackendOffer, hookimpl

def build(model_runner):
    return ["{name}", model_runner]

@hookimpl
def sglang_fl_attention_backend():
    return SglangAttentionBackendOffer(factory={factory}, priority={priority},
                                       available={available})
"""

# plugin -> (priority, factory, available, what the refusal names)
BAD_OFFERS = {
    "pword": ('"high"', "build", "None", "priority='high'; expected an int"),
    "pnan": ('float("nan")', "build", "None", "priority=nan; expected an int"),
    "pinf": ("1e400", "build", "None", "priority=inf; expected an int"),
    "pstr": ('"7"', "build", "None", "priority='7'; expected an int"),
    "pfloat": ("2.9", "build", "None", "priority=2.9; expected an int"),
    "pbool": ("True", "build", "None", "priority=True; expected an int"),
    "nofactory": ("None", "None", "None", "factory=None; expected a callable"),
    "badprobe": ("None", "build", '"yes"', "available='yes'; expected None, True, False"),
}


def kernel_backend(model_runner):
    return ["kernels", model_runner]


def build(tmp_path, runner="runner-0"):
    runtime = Runtime(Settings.from_environment())
    log = tmp_path / "dispatch.jsonl"
    backend = build_backend(runtime, DispatchReport(log), runner, kernel_backend, list)
    return backend, read_log(log)


def offering(plugin_site, name, *, priority="None", factory="build", available="None"):
    source = OFFER.format(name=name, priority=priority, factory=factory, available=available)
    plugin_site.plugin(name, source)


@pytest.fixture
def bad_offers(plugin_site):
    for name, (priority, factory, available, _) in BAD_OFFERS.items():
        offering(plugin_site, name, priority=priority, factory=factory, available=available)
    offering(plugin_site, "zgood", priority="3")  # sorts last: the refusals come first


def cli_json(capsys, *argv):
    assert cli.main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_bad_offer_fields_are_refused_by_name_and_the_good_offer_kept(bad_offers, capsys):
    report = cli_json(capsys, "explain", SGLANG_ATTENTION_BACKEND)
    assert report["chosen"] == "vendor.zgood.attention_backend"
    by_id = {c["impl_id"]: c for c in report["candidates"]}
    chosen = by_id["vendor.zgood.attention_backend"]
    assert (chosen["priority"], chosen["outcome"]) == (3, "chosen")
    for name, (*_, named) in BAD_OFFERS.items():
        rejected = by_id[f"vendor.{name}.attention_backend"]
        assert rejected["outcome"] == "rejected", rejected
        assert rejected["reason"].startswith(
            "sglang_fl_attention_backend returned an unusable offer: its "
        ), rejected
        assert named in rejected["reason"], rejected
    listed = cli_json(capsys, "ops")
    (selection,) = [s for s in listed["selections"] if s["op"] == SGLANG_ATTENTION_BACKEND]
    assert selection["chosen"] == "vendor.zgood.attention_backend"


def test_an_engine_build_skips_the_refused_offers(bad_offers, tmp_path):
    backend, records = build(tmp_path)
    assert backend == ["zgood", "runner-0"]
    (record,) = [r for r in records if r["event"] == "attention_backend"]
    assert (record["impl_id"], record["failed"]) == ("vendor.zgood.attention_backend", [])


def test_under_strict_a_refused_offer_is_an_error_naming_plugin_and_field(
    plugin_site, tmp_path, monkeypatch
):
    offering(plugin_site, "pword", priority='"high"')
    monkeypatch.setenv("SGLANG_FL_STRICT", "1")
    with pytest.raises(StrictModeError, match=r"plugin 'pword': .*priority='high'"):
        build(tmp_path)


def test_an_int_subclass_priority_is_kept_as_its_value(plugin_site, capsys):
    offering(plugin_site, "intenum", priority="__import__('sglang_fl').BackendPriority.DEFAULT")
    report = cli_json(capsys, "explain", SGLANG_ATTENTION_BACKEND)
    (candidate,) = [c for c in report["candidates"] if c["vendor"] == "intenum"]
    assert (candidate["priority"], candidate["outcome"]) == (150, "chosen")


NOT_AN_OFFER = """
from sglang_fl import hookimpl

class Lookalike:  # the offer's fields, not its type
    factory = staticmethod(lambda model_runner: ["lookalike", model_runner])
    priority = None
    available = None

@hookimpl
def sglang_fl_attention_backend():
    return Lookalike()
"""


def test_an_object_that_is_not_the_offer_type_is_refused(plugin_site, capsys):
    plugin_site.plugin("lookalike", NOT_AN_OFFER)
    report = cli_json(capsys, "explain", SGLANG_ATTENTION_BACKEND)
    assert report["chosen"] == REFERENCE_IMPL_ID
    (rejected,) = [c for c in report["candidates"] if c["vendor"] == "lookalike"]
    assert "is not a SglangAttentionBackendOffer" in rejected["reason"]


# -- factories that end the host, hang, or lie about what they return --------------------------

FACTORY = """
import sys, time
from sglang_fl import SglangAttentionBackendOffer, hookimpl

class PluginBaseError(BaseException):
    pass

def build(model_runner):
    {statement}

@hookimpl
def sglang_fl_attention_backend():
    return SglangAttentionBackendOffer(factory=build, priority=1000)
"""


@pytest.mark.parametrize(
    ("statement", "named"),
    [
        ("sys.exit(3)", "its factory raised SystemExit: 3"),
        ("raise PluginBaseError('not an Exception')", "PluginBaseError: not an Exception"),
        ("raise GeneratorExit", "its factory raised GeneratorExit"),
    ],
)
def test_a_factory_raising_a_base_exception_is_a_fallback_and_the_next_is_built(
    plugin_site, tmp_path, statement, named
):
    plugin_site.plugin("exiting", FACTORY.format(statement=statement))
    offering(plugin_site, "second")
    backend, records = build(tmp_path)
    assert backend == ["second", "runner-0"]
    (fallback,) = [r for r in records if r["event"] == "fallback"]
    assert (fallback["impl_id"], fallback["next_impl_id"]) == (
        "vendor.exiting.attention_backend",
        "vendor.second.attention_backend",
    )
    assert named in fallback["reason"]
    (served,) = [r for r in records if r["event"] == "attention_backend"]
    assert served["failed"] == ["vendor.exiting.attention_backend"]


def test_a_factory_that_never_returns_is_abandoned_after_the_plugin_timeout(
    plugin_site, tmp_path, monkeypatch
):
    plugin_site.plugin("hanging", FACTORY.format(statement="time.sleep(600)"))
    monkeypatch.setenv("SGLANG_FL_PLUGIN_TIMEOUT", "1")
    started = time.monotonic()
    backend, records = build(tmp_path)
    assert time.monotonic() - started < 30
    assert backend == ["kernels", "runner-0"]
    (fallback,) = [r for r in records if r["event"] == "fallback"]
    assert fallback["reason"] == (
        "its factory did not return within 1 s (SGLANG_FL_PLUGIN_TIMEOUT); abandoned"
    )


THREAD_STATE = """
import torch
from sglang_fl import SglangAttentionBackendOffer, hookimpl

def build(model_runner):
    return ["seen", torch.is_inference_mode_enabled(), torch.is_grad_enabled()]

@hookimpl
def sglang_fl_attention_backend():
    return SglangAttentionBackendOffer(factory=build)
"""


def test_the_factory_builds_under_the_engine_threads_autograd_modes(plugin_site, tmp_path):
    """The worker carries the caller's thread-local modes (SGLang builds under no_grad or
    inference mode); a bare worker thread would see grad mode on, inference mode off."""
    plugin_site.plugin("modes", THREAD_STATE)
    with torch.inference_mode():
        inference, _ = build(tmp_path)
    with torch.no_grad():
        no_grad, _ = build(tmp_path)
    assert inference == ["seen", True, False]
    assert no_grad == ["seen", False, False]
    assert threading.current_thread() is threading.main_thread()


# -- what the report and the CLI carry from a plugin: capped, marked -----------------------------

HUGE = """
from sglang_fl import SglangAttentionBackendOffer, hookimpl

class Huge:
    def __repr__(self):
        return "x" * 50_000_000

def build(model_runner):
    raise RuntimeError("y" * 50_000_000)

@hookimpl
def sglang_fl_attention_backend():
    return {answer}
"""


def test_a_50_mb_repr_is_cut_in_the_cli_json(plugin_site, capsys):
    from sglang_fl.guard import PLUGIN_TEXT_LIMIT

    plugin_site.plugin("huge", HUGE.format(answer="Huge()"))
    assert cli.main(["explain", SGLANG_ATTENTION_BACKEND, "--json"]) == 0
    out = capsys.readouterr().out
    assert len(out) < 20_000
    (rejected,) = [c for c in json.loads(out)["candidates"] if c["vendor"] == "huge"]
    assert (
        "x" * PLUGIN_TEXT_LIMIT + "... [sglang-fl: cut 49998000 more characters]"
        in (rejected["reason"])
    )


def test_a_50_mb_factory_message_is_cut_in_the_dispatch_log(plugin_site, tmp_path):
    plugin_site.plugin("huge", HUGE.format(answer="SglangAttentionBackendOffer(factory=build)"))
    backend, records = build(tmp_path)
    assert backend == ["kernels", "runner-0"]
    assert (tmp_path / "dispatch.jsonl").stat().st_size < 50_000
    (fallback,) = [r for r in records if r["event"] == "fallback"]
    assert fallback["reason"].endswith("[sglang-fl: cut 49998000 more characters]")
