"""Runs inside the environment being measured, in a fresh interpreter; prints one JSON line.

Modes:

- ``scan``: one bare ``importlib.metadata.entry_points()`` scan, timed (wall clock, and the
  process's CPU time, which leaves out time other processes took from it);
- ``load``: sglang-fl's plugin discovery and load (``get_runtime()``) then the resolution of
  every standard op (``resolve_all()``), timed;
- ``imports``: which watched modules (vendor SDKs, SGLang, ...) anything *tries* to import while
  ``sglang_fl`` is imported, its plugins load and every op resolves; with stub SDK packages on
  the path (they report here when their code runs), which SDKs would actually be imported.

``scan`` and ``load`` run in separate fresh processes with the same modules imported before the
clock starts (sglang_fl and therefore torch), so each pays for the first, cold scan of the
process and neither profits from the other's caches.
"""

from __future__ import annotations

import importlib.abc
import json
import sys
import time
from typing import Any

WATCHED = ("sgl_kernel", "torch_npu", "sglang", "vllm", "flashinfer", "deep_gemm", "triton")


def _distribution_count() -> int:
    """Installed distributions visible on ``sys.path``, by normalised name (after timing)."""
    from importlib.metadata import distributions

    names = set()
    for dist in distributions():
        name = dist.metadata["Name"] or ""
        names.add(name.lower().replace("_", "-").replace(".", "-"))
    return len(names)


def scan() -> dict[str, Any]:
    from importlib.metadata import entry_points

    import sglang_fl.runtime  # noqa: F401  (same imports as ``load`` before the clock)

    start, start_cpu = time.perf_counter_ns(), time.process_time_ns()
    eps = entry_points()
    elapsed, elapsed_cpu = time.perf_counter_ns() - start, time.process_time_ns() - start_cpu
    return {
        "scan_ns": elapsed,
        "scan_cpu_ns": elapsed_cpu,
        "entry_points": len(eps),
        "backends": sorted(ep.name for ep in eps.select(group="sglang_fl.backends")),
        "distributions": _distribution_count(),
    }


def load() -> dict[str, Any]:
    from importlib.metadata import entry_points  # noqa: F401  (same imports as ``scan``)

    import sglang_fl
    import sglang_fl.runtime

    start, start_cpu = time.perf_counter_ns(), time.process_time_ns()
    runtime = sglang_fl.get_runtime()
    loaded = time.perf_counter_ns()
    resolutions = runtime.resolve_all()
    end, end_cpu = time.perf_counter_ns(), time.process_time_ns()
    return {
        "load_ns": loaded - start,
        "resolve_ns": end - loaded,
        "total_ns": end - start,
        "total_cpu_ns": end_cpu - start_cpu,
        "plugins": [
            {"name": p.name, "distribution": p.distribution, "status": p.status, "error": p.error}
            for p in runtime.plugins
        ],
        "chosen": {
            op: None if isinstance(r, Exception) else r.decision.chosen.impl_id
            for op, r in resolutions.items()
        },
        "unresolved": [op for op, r in resolutions.items() if isinstance(r, Exception)],
        "distributions": _distribution_count(),
    }


class _ImportRecorder(importlib.abc.MetaPathFinder):
    """Records every attempt to import a watched module, found or not, with the phase."""

    def __init__(self) -> None:
        self.phase = "start"
        self.attempts: list[tuple[str, str]] = []
        self.executed: list[tuple[str, str]] = []  # stub SDKs whose code ran

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.partition(".")[0] in WATCHED:
            self.attempts.append((self.phase, name))
        return None


RECORDER = _ImportRecorder()


def stub_imported(name: str) -> None:
    """Called by the stub SDK packages ``startup.py`` may put on the path, when imported."""
    RECORDER.executed.append((RECORDER.phase, name))


def imports() -> dict[str, Any]:
    recorder = RECORDER
    sys.meta_path.insert(0, recorder)
    recorder.phase = "import torch"  # baseline: whatever torch itself probes is not ours
    import torch  # noqa: F401

    before = {m for m in sys.modules if m.partition(".")[0] in WATCHED}
    recorder.phase = "import sglang_fl"
    import sglang_fl

    recorder.phase = "load plugins"
    runtime = sglang_fl.get_runtime()
    recorder.phase = "resolve every op"
    runtime.resolve_all()
    sys.meta_path.remove(recorder)
    phases = ["import torch", "import sglang_fl", "load plugins", "resolve every op"]
    return {
        "watched": list(WATCHED),
        "attempts": {
            phase: sorted({name for p, name in recorder.attempts if p == phase}) for phase in phases
        },
        "stub_sdks_imported": {
            phase: sorted({name for p, name in recorder.executed if p == phase}) for phase in phases
        },
        "in_sys_modules": sorted(
            m for m in sys.modules if m.partition(".")[0] in WATCHED and m not in before
        ),
        "vendor_modules": sorted(
            m for m in sys.modules if m.startswith("sglang_fl_") and "." not in m
        ),
        "plugins": [{"name": p.name, "status": p.status} for p in runtime.plugins],
    }


if __name__ == "__main__":
    modes = {"scan": scan, "load": load, "imports": imports}
    print(json.dumps(modes[sys.argv[1]]()))
