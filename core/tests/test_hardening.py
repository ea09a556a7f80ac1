"""Internals that keep plugin code from crashing, hanging or impersonating (issue 12).

The end-to-end attacks, as installed distributions, are in tests/cross/test_hardening_loading.py;
these are the pieces: calling plugin code, the registry's states and keys, fresh locks at fork.
"""

from __future__ import annotations

import sys
import threading
import time

import pytest
from forking import needs_fork, run_in_child

from sglang_fl import runtime as runtime_module
from sglang_fl.config import Settings
from sglang_fl.dispatch.availability import AvailabilityCache
from sglang_fl.dispatch.probes import ChipSdk
from sglang_fl.dispatch.registry import OpRegistry, RegistryState
from sglang_fl.dispatch.types import Availability, BackendImplKind, OpImpl, Provenance
from sglang_fl.dispatch_report import DispatchReport, ReportEvent
from sglang_fl.errors import ConfigError, PluginLoadError, RegistrationError
from sglang_fl.guard import (
    ReservedPluginCall,
    call_plugin_code,
    describe_exception,
    in_plugin_code,
    safe_repr,
)

ACME = Provenance("acme", "sglang-fl-acme", "1.0")
REFERENCE = Provenance("reference", "sglang-fl", "0.1.0")


def silu(obj, x):
    return x


def impl(impl_id="vendor.acme", **overrides):
    fields = {"op_name": "silu_and_mul", "impl_id": impl_id, "kind": BackendImplKind.VENDOR,
              "fn": silu, "vendor": "acme", **overrides}  # fmt: skip
    return OpImpl(**fields)


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no text")


# -- calling plugin code -------------------------------------------------------------------------


def test_describe_exception_survives_a_raising_str():
    assert describe_exception(ValueError("bad")) == "ValueError: bad"
    assert describe_exception(GeneratorExit()) == "GeneratorExit"
    assert describe_exception(Unprintable()) == (
        "Unprintable: <str() of the exception raised RuntimeError>"
    )


def test_safe_repr_survives_a_raising_repr():
    class Odd:
        def __repr__(self):
            raise TypeError("no")

    assert safe_repr([1]) == "[1]"
    assert safe_repr(Odd()) == "<Odd whose repr() raised TypeError>"


@pytest.mark.parametrize(
    "error", [SystemExit(3), GeneratorExit(), Unprintable(), KeyboardInterrupt()], ids=repr
)
def test_call_plugin_code_reports_base_exceptions(error):
    """Even KeyboardInterrupt: raised by plugin code in a worker thread, it is only a report
    (the user's Ctrl-C reaches the main thread, which is not running plugin code)."""

    def body():
        raise error

    outcome = call_plugin_code(body, what="test code", timeout=10)
    assert outcome.error is error
    assert not outcome.timed_out
    assert outcome.details is not None
    assert "Traceback" in outcome.details


def test_call_plugin_code_marks_its_thread_and_returns_the_value():
    outcome = call_plugin_code(in_plugin_code, what="the probe of x", timeout=10)
    assert outcome.value == "the probe of x"
    assert in_plugin_code() is None  # the caller's thread is not marked


def test_call_plugin_code_abandons_what_does_not_return():
    release = threading.Event()
    started = time.monotonic()
    outcome = call_plugin_code(lambda: release.wait(30), what="slow", timeout=0.2)
    assert outcome.timed_out
    assert outcome.value is None
    assert outcome.error is None
    assert time.monotonic() - started < 5
    release.set()


def test_a_reserved_call_runs_where_no_thread_can_start(monkeypatch):
    """Python 3.12 refuses ``Thread.start()`` at interpreter exit; a call reserved before runs
    there all the same, marked, bounded, its exceptions reported, once."""
    reserved: ReservedPluginCall[str | None] = ReservedPluginCall("close() of x")
    failing: ReservedPluginCall[None] = ReservedPluginCall("close() of y")
    slow: ReservedPluginCall[None] = ReservedPluginCall("close() of z")

    def no_new_threads(self):
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Thread, "start", no_new_threads)
    assert reserved.run(in_plugin_code, timeout=10).value == "close() of x"
    with pytest.raises(RuntimeError, match="has already run its call"):
        reserved.run(in_plugin_code, timeout=10)
    assert isinstance(failing.run(lambda: sys.exit(3), timeout=10).error, SystemExit)
    release = threading.Event()
    started = time.monotonic()
    assert slow.run(lambda: release.wait(30), timeout=0.2).timed_out
    assert time.monotonic() - started < 5
    release.set()


# -- the registry's states -----------------------------------------------------------------------


def test_loading_registry_accepts_only_the_loaders_scopes_and_the_scope_thread():
    registry = OpRegistry()
    key = registry.begin_loading()
    assert registry.state is RegistryState.LOADING
    with pytest.raises(RegistrationError, match="outside any plugin's sglang_fl_register_ops"):
        registry.register(impl())
    with pytest.raises(RegistrationError, match="only its loader may"), registry.plugin_scope(ACME):
        pass
    with pytest.raises(RegistrationError, match="only its loader may"):
        registry.seal()
    with registry.plugin_scope(ACME, loader_key=key):
        registry.register(impl())
    registry.seal(key)
    assert [i.provenance for i in registry.implementations("silu_and_mul")] == [ACME]


def test_registration_from_a_thread_the_hook_started_fails_the_plugin():
    registry = OpRegistry()
    refused: list[str] = []

    def worker():
        try:
            registry.register(impl())
        except RegistrationError as exc:
            refused.append(str(exc))

    def hook():
        with registry.plugin_scope(ACME):
            thread = threading.Thread(target=worker, name="helper")
            thread.start()
            thread.join(10)

    with pytest.raises(RegistrationError, match="only the thread running its"):
        hook()
    assert refused
    assert "thread 'helper' registered an implementation while plugin 'acme'" in (refused[0])
    assert registry.implementations("silu_and_mul") == ()


def test_a_thread_older_than_the_scope_is_refused_without_failing_the_plugin():
    registry = OpRegistry()
    go, done = threading.Event(), threading.Event()
    refused: list[str] = []

    def leftover():
        go.wait(10)
        try:
            registry.register(impl("vendor.late"))
        except RegistrationError as exc:
            refused.append(str(exc))
        done.set()

    thread = threading.Thread(target=leftover)
    thread.start()
    with registry.plugin_scope(ACME):
        registry.register(impl())
        go.set()
        assert done.wait(10)
    thread.join(10)
    assert refused
    assert "while plugin 'acme' loads" in refused[0]
    assert [i.impl_id for i in registry.implementations("silu_and_mul")] == ["vendor.acme"]


def test_sealed_registry_refuses_registrations_and_scopes():
    registry = OpRegistry()
    registry.seal()
    with pytest.raises(RegistrationError, match="the registry is sealed"):
        registry.register(impl())
    with pytest.raises(RegistrationError, match="the registry is sealed"):
        registry.declare_no_kernel("layer_norm", "none")
    with pytest.raises(RegistrationError, match="sealed"), registry.plugin_scope(REFERENCE):
        pass


def test_a_plugin_whose_registrations_were_kept_gets_no_second_scope():
    registry = OpRegistry()
    with registry.plugin_scope(REFERENCE):
        registry.register(impl("reference.x", kind=BackendImplKind.REFERENCE, vendor=None))
    with pytest.raises(RegistrationError, match="'reference' already registered"):  # noqa: SIM117
        with registry.plugin_scope(REFERENCE):
            pass


def test_an_abandoned_scope_keeps_nothing():
    registry = OpRegistry()
    key = registry.begin_loading()
    inside, release = threading.Event(), threading.Event()
    errors: list[str] = []

    def hook():
        try:
            with registry.plugin_scope(ACME, loader_key=key):
                registry.register(impl())
                inside.set()
                release.wait(10)
                registry.register(impl("vendor.more"))
        except RegistrationError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=hook)
    thread.start()
    assert inside.wait(10)
    registry.abandon_scope(ACME, key)
    release.set()
    thread.join(10)
    assert errors
    assert "outside any plugin's" in errors[0]
    assert registry.implementations("silu_and_mul") == ()


def test_provenance_set_by_a_plugin_is_replaced():
    registry = OpRegistry()
    with registry.plugin_scope(ACME):
        registry.register(impl(provenance=REFERENCE))
    assert registry.implementations("silu_and_mul")[0].provenance == ACME


# -- probes ---------------------------------------------------------------------------------------


def probe_answer(probe, timeout=5.0) -> Availability:
    return AvailabilityCache(timeout=timeout).check(impl(available=probe))


def test_probe_that_exits_or_blocks_is_unavailable():
    assert probe_answer(lambda: sys.exit(0)) == Availability(
        False, "availability probe raised SystemExit: 0"
    )
    release = threading.Event()
    answer = probe_answer(lambda: release.wait(30), timeout=0.2)
    release.set()
    assert answer == Availability(
        False,
        "availability probe did not answer within 0.2 s (SGLANG_FL_PLUGIN_TIMEOUT); "
        "treated as unavailable",
    )


def test_probe_answer_is_read_in_the_probes_thread():
    class Shifty(Availability):
        def __getattribute__(self, name):
            if name == "available":
                raise RuntimeError("no answer")
            return super().__getattribute__(name)

    assert probe_answer(lambda: Shifty(True, "x")) == Availability(
        False, "availability probe raised RuntimeError: no answer"
    )
    assert probe_answer(lambda: Availability(True, 42)) == Availability(True, "42")


def test_fn_whose_probe_lookup_raises_is_unavailable():
    class Lazy:
        def __call__(self, obj, x):
            return x

        def __getattr__(self, name):
            raise ImportError("sdk missing")

    answer = AvailabilityCache().check(impl(fn=Lazy()))
    assert answer == Availability(False, "looking up its probe raised ImportError: sdk missing")


def test_plugin_timeout_setting():
    assert Settings.from_environment({}).plugin_timeout == 60.0
    assert Settings.from_environment({"SGLANG_FL_PLUGIN_TIMEOUT": "2.5"}).plugin_timeout == 2.5
    for bad in ("0", "-1", "nan", "inf", "soon"):
        with pytest.raises(ConfigError, match=r"SGLANG_FL_PLUGIN_TIMEOUT=.*positive number"):
            Settings.from_environment({"SGLANG_FL_PLUGIN_TIMEOUT": bad})


# -- plugin code cannot load or reset the runtime --------------------------------------------------


def test_runtime_calls_from_plugin_code_are_clear_errors():
    for call in (runtime_module.get_runtime, runtime_module.reset_runtime):
        outcome = call_plugin_code(call, what="the probe of vendor.x", timeout=10)
        assert isinstance(outcome.error, PluginLoadError), outcome
        assert "was called from the probe of vendor.x" in str(outcome.error)


# -- fork: fresh locks in the child ---------------------------------------------------------------


@needs_fork
@pytest.mark.parametrize("owner_name", ["dispatch report", "chip sdk"])
def test_a_lock_held_by_a_parent_thread_is_fresh_in_the_child(owner_name, tmp_path):
    log = tmp_path / "report.jsonl"
    report = DispatchReport(log)
    sdk = ChipSdk("math", device="cpu", count_devices=lambda: 1, devices_need_sdk=False)
    owner = report if owner_name == "dispatch report" else sdk
    holding, release = threading.Event(), threading.Event()

    def hold():
        with owner._lock:  # a thread mid-emit / mid-probe at fork time
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(10)

        def child() -> int:
            if owner is report:
                report.emit(ReportEvent.PLUGIN, layer="x")
                return 0 if log.read_text().count("\n") == 1 else 11
            return 0 if sdk.probe().available else 12

        assert run_in_child(child) == 0
    finally:
        release.set()
        holder.join(10)
