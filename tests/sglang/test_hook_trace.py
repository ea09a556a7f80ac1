"""``SGLANG_FL_TRACE=<file>`` traces the hook calls of SGLang's spawned worker processes too.

The shared :data:`~configurations.LLAMA` engine runs with the trace file set: every process
that loads sglang-fl appends pluggy's trace of its own hook calls, each line tagged with its
pid, and the scheduler (known from the dispatch log's process title) is one.
"""

from __future__ import annotations

import re

import pytest
from configurations import LLAMA
from engines import Engine
from sglang_processes import scheduler_layers

pytest.importorskip("sglang")

PID_LINE = re.compile(r"^\[pid (\d+)\] (.*)$")


@pytest.mark.engine(LLAMA)
def test_trace_file_holds_the_hook_calls_of_every_sglang_process(engine: Engine) -> None:
    engine.generate(["def main():"], max_new_tokens=4)
    trace = engine.workdir / "trace.log"

    calls: dict[int, list[str]] = {}
    for line in trace.read_text().splitlines():
        match = PID_LINE.match(line)
        assert match, f"trace line without its pid: {line!r}"
        calls.setdefault(int(match.group(1)), []).append(match.group(2).strip())
    rows = engine.records()
    loaded = {r["pid"] for r in rows if r["event"] == "plugin"}
    schedulers = {row["pid"] for row in scheduler_layers(rows, engine.pid).values()}
    assert engine.pid in loaded
    assert schedulers, "the dispatch log names the scheduler process"
    # Every process that loaded sglang-fl (main, scheduler, detokenizer) traced its own load.
    assert set(calls) == loaded, (sorted(calls), sorted(loaded))
    for pid in loaded:
        assert calls[pid][0] == "sglang_fl_register_ops [hook]", calls[pid][:3]
        assert "finish sglang_fl_register_ops --> [] [hook]" in calls[pid]
