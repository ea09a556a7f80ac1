"""The process-wide runtime: loaded once, one answer for every thread, safe across fork."""

from __future__ import annotations

import sys
import threading
import time

import pytest
import torch
from forking import needs_fork, run_in_child

import sglang_fl
from sglang_fl import runtime as runtime_module
from sglang_fl.ops import STANDARD_OPS


@pytest.fixture
def load_counter(monkeypatch):
    """Counts calls of the loader the runtime uses (slowed down, to widen any race)."""
    calls: list[int] = []
    real = runtime_module.load_plugins

    def counting(*args, **kwargs):
        calls.append(threading.get_ident())
        time.sleep(0.05)
        return real(*args, **kwargs)

    monkeypatch.setattr(runtime_module, "load_plugins", counting)
    monkeypatch.setenv("SGLANG_FL_PLUGINS", "")  # reference only: independent of what is installed
    return calls


def test_one_load_per_process(load_counter):
    first = runtime_module.get_runtime()
    assert sglang_fl.get_runtime() is first
    assert runtime_module.get_runtime() is first
    assert len(load_counter) == 1


def test_resolutions_are_cached(load_counter):
    runtime = runtime_module.get_runtime()
    first = runtime.resolve("rms_norm")
    assert runtime.resolve("rms_norm") is first
    assert first.fn is runtime_module.get_runtime().resolve("rms_norm").fn


def test_bound_fn_is_the_reference_itself_without_fallbacks(load_counter):
    from sglang_fl.ops import STANDARD_OPS

    runtime = runtime_module.get_runtime()
    for op, contract in STANDARD_OPS.items():
        resolution = runtime.resolve(op)
        assert resolution.fn is contract.reference
        assert resolution.decision.fallbacks == ()


def test_reset_runtime_reloads_with_new_settings(load_counter, monkeypatch):
    first = runtime_module.get_runtime()
    assert first.config.prefer is None
    monkeypatch.setenv("SGLANG_FL_PREFER", "reference")
    assert runtime_module.get_runtime() is first  # settings are read once
    runtime_module.reset_runtime()
    second = runtime_module.get_runtime()
    assert second is not first
    assert str(second.config.prefer) == "reference"
    assert len(load_counter) == 2


def test_bad_configuration_raises_and_leaves_no_runtime(monkeypatch):
    monkeypatch.setenv("SGLANG_FL_STRICT", "sometimes")
    with pytest.raises(sglang_fl.ConfigError, match="SGLANG_FL_STRICT='sometimes'"):
        runtime_module.get_runtime()
    assert runtime_module._runtime is None
    monkeypatch.setenv("SGLANG_FL_STRICT", "0")
    assert runtime_module.get_runtime().config.strict is False


def test_resolve_unknown_op_suggests():
    with pytest.raises(sglang_fl.UnknownOpError, match="did you mean 'rotary_embedding'"):
        runtime_module.get_runtime().resolve("rotary_embeding")


def test_resolve_all_reports_errors_per_op(load_counter, monkeypatch):
    monkeypatch.setenv("SGLANG_FL_PER_OP", "silu_and_mul=vendor:nope")
    runtime_module.reset_runtime()
    results = runtime_module.get_runtime().resolve_all()
    assert set(results) == set(STANDARD_OPS)
    assert isinstance(results["silu_and_mul"], sglang_fl.NoImplementationError)
    assert results["rms_norm"].decision.chosen.impl_id == "reference.rms_norm"


def test_concurrent_first_use_gives_one_runtime_and_one_resolution(load_counter):
    threads_n = 16
    barrier = threading.Barrier(threads_n)
    results: list[object] = [None] * threads_n
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            barrier.wait(timeout=10)
            runtime = runtime_module.get_runtime()
            results[index] = (runtime, runtime.resolve("rotary_embedding"))
        except BaseException as exc:  # reported below, in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert len(load_counter) == 1
    runtimes = {id(r[0]) for r in results}
    resolutions = {id(r[1]) for r in results}
    assert len(runtimes) == 1
    assert len(resolutions) == 1


PROBED_PLUGIN = """
import threading
import time

from sglang_fl.types import Availability, BackendImplKind, OpImpl, hookimpl

CALLS = []
PROBING = threading.Event()
RELEASE = threading.Event()


def slow_probe():
    CALLS.append("slow")
    PROBING.set()
    RELEASE.wait(timeout=30)
    return Availability(True, "slow but fine")


def quick_probe():
    CALLS.append("quick")
    return Availability(False, "quick probe ran")


def silu(obj, x):
    return "slow"


def rms(obj, x, residual=None):
    return "quick"


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl("silu_and_mul", "vendor.probed.slow", BackendImplKind.VENDOR, silu,
                             "probed", available=slow_probe))
    registry.register(OpImpl("rms_norm", "vendor.probed.quick", BackendImplKind.VENDOR, rms,
                             "probed", available=quick_probe))
"""


def probed_runtime(plugin_site, monkeypatch):
    """The runtime with one real plugin whose probes the test drives (its module's events)."""
    module = plugin_site.plugin("probed", PROBED_PLUGIN)
    monkeypatch.setenv("SGLANG_FL_PLUGINS", "probed")
    runtime = runtime_module.get_runtime()
    assert runtime.plugin("probed").status == "loaded", runtime.plugin("probed").error
    return runtime, sys.modules[module]


def test_concurrent_resolution_probes_once(plugin_site, monkeypatch):
    """Threads racing on a cold op with a slow probe: one probe call, one Resolution."""
    runtime, plugin = probed_runtime(plugin_site, monkeypatch)
    threading.Timer(0.05, plugin.RELEASE.set).start()
    barrier = threading.Barrier(8)
    seen = []

    def worker():
        barrier.wait(timeout=10)
        seen.append(runtime.resolve("silu_and_mul"))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(seen) == 8
    assert len({id(r) for r in seen}) == 1
    assert seen[0].decision.chosen.impl_id == "vendor.probed.slow"
    assert plugin.CALLS == ["slow"]


# -- fork -----------------------------------------------------------------------------------------


def reference_result_ok(runtime) -> bool:
    from types import SimpleNamespace

    x = torch.randn(3, 8)
    obj = SimpleNamespace(weight=torch.ones(8), variance_epsilon=1e-6)
    out = runtime.resolve("rms_norm").fn(obj, x)
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return torch.allclose(out, want, atol=1e-6)


@needs_fork
def test_forked_child_inherits_the_runtime_and_never_reloads(load_counter):
    parent = runtime_module.get_runtime()
    parent_id = id(parent)
    parent.resolve("silu_and_mul")

    def child() -> int:
        runtime = runtime_module.get_runtime()
        if id(runtime) != parent_id:
            return 10
        if len(load_counter) != 1:
            return 11
        if not reference_result_ok(runtime):  # a fresh op, resolved in the child
            return 12
        if runtime_module.get_runtime().resolve("rms_norm") is not runtime.resolve("rms_norm"):
            return 13
        return 0

    assert run_in_child(child) == 0
    assert len(load_counter) == 1


@needs_fork
def test_fork_while_a_thread_holds_the_runtime_lock(load_counter):
    runtime = runtime_module.get_runtime()
    holding = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with runtime._lock:
            holding.set()
            release.wait(timeout=30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(timeout=10)

        def child() -> int:
            return 0 if reference_result_ok(runtime_module.get_runtime()) else 12

        assert run_in_child(child) == 0
    finally:
        release.set()
        holder.join(timeout=10)


@needs_fork
def test_fork_while_a_thread_is_loading_the_runtime(load_counter, monkeypatch):
    """The parent's loader holds the module lock mid-load: the fork waits for the load to end,
    so the child inherits the loaded runtime instead of half-done imports."""
    started = threading.Event()
    counting = runtime_module.load_plugins

    def slow(*args, **kwargs):
        started.set()
        time.sleep(0.5)
        return counting(*args, **kwargs)

    monkeypatch.setattr(runtime_module, "load_plugins", slow)
    loader = threading.Thread(target=runtime_module.get_runtime)
    loader.start()
    try:
        assert started.wait(timeout=10)

        def child() -> int:
            return 0 if reference_result_ok(runtime_module.get_runtime()) else 12

        assert run_in_child(child) == 0
    finally:
        loader.join(timeout=30)
    assert len(load_counter) == 1  # the child inherited the parent's load


@needs_fork
def test_fork_waits_for_a_probe_another_thread_runs(plugin_site, monkeypatch):
    """A probe mid-way (maybe importing its SDK) at fork time: the fork waits for its answer,
    so the child inherits the answer, not a half-done import; the child probes its own ops."""
    runtime, plugin = probed_runtime(plugin_site, monkeypatch)
    resolver = threading.Thread(target=runtime.resolve, args=("silu_and_mul",))
    resolver.start()
    try:
        assert plugin.PROBING.wait(timeout=10)
        threading.Timer(0.3, plugin.RELEASE.set).start()

        def child() -> int:
            runtime = runtime_module.get_runtime()
            if runtime.resolve("silu_and_mul").decision.chosen.impl_id != "vendor.probed.slow":
                return 11
            verdicts = {
                c.impl.impl_id: c.reason for c in runtime.resolve("rms_norm").decision.candidates
            }
            if verdicts["vendor.probed.quick"] != "unavailable: quick probe ran":
                return 12
            return 0 if plugin.CALLS == ["slow", "quick"] else 13  # the slow probe ran once

        assert run_in_child(child) == 0
    finally:
        plugin.RELEASE.set()
        resolver.join(timeout=10)
    assert runtime.resolve("silu_and_mul").decision.chosen.impl_id == "vendor.probed.slow"
    assert plugin.CALLS == ["slow"]  # the child's quick probe ran in the child only
