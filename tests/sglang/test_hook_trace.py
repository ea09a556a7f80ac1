"""``SGLANG_FL_TRACE=<file>`` traces the hook calls of SGLang's spawned worker processes too.

One engine run (the tiny Llama, through ``test_engine``'s helpers) with the trace file set:
every process that loads sglang-fl appends pluggy's trace of its own hook calls, each line
tagged with its pid, and the scheduler (known from the dispatch log's process title) is one.
"""

from __future__ import annotations

import re
from pathlib import Path

from test_engine import run_engine, scheduler_layers

from sglang_fl.dispatch_report import read_log

PID_LINE = re.compile(r"^\[pid (\d+)\] (.*)$")


def test_trace_file_holds_the_hook_calls_of_every_sglang_process(
    models: dict[str, Path], tmp_path: Path
) -> None:
    log, trace = tmp_path / "dispatch.jsonl", tmp_path / "trace.log"
    result = run_engine(models["llama"], log, SGLANG_FL_TRACE=str(trace))

    calls: dict[int, list[str]] = {}
    for line in trace.read_text().splitlines():
        match = PID_LINE.match(line)
        assert match, f"trace line without its pid: {line!r}"
        calls.setdefault(int(match.group(1)), []).append(match.group(2).strip())
    rows = read_log(log)
    loaded = {r["pid"] for r in rows if r["event"] == "plugin"}
    schedulers = {row["pid"] for row in scheduler_layers(rows, result["pid"]).values()}
    assert result["pid"] in loaded
    assert schedulers, "the dispatch log names the scheduler process"
    # Every process that loaded sglang-fl (main, scheduler, detokenizer) traced its own load.
    assert set(calls) == loaded, (sorted(calls), sorted(loaded))
    for pid in loaded:
        assert calls[pid][0] == "sglang_fl_register_ops [hook]", calls[pid][:3]
        assert "finish sglang_fl_register_ops --> [] [hook]" in calls[pid]
