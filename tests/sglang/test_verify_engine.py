"""Verify mode in a live SGLang engine: find the vendor op that breaks accuracy.

A throwaway vendor (``skewed_vendor``) ships an ``rms_norm`` that is subtly wrong (it
accumulates the variance in bfloat16 where the contract says float32). A tiny Llama generates
with ``SGLANG_FL_VERIFY`` on (:data:`~configurations.LLAMA_SKEWED`); ``sglang-fl verify-report``
on the engine's dispatch log must name that vendor's ``rms_norm`` and no other op. With the
reference alone (the shared :data:`~configurations.LLAMA` engine, verify on), everything passes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from configurations import LLAMA, LLAMA_SKEWED, VERIFY_CALLS
from engines import Engine
from sglang_processes import clean_env
from skewed_vendor import SKEWED_IMPL

pytest.importorskip("sglang")

PROMPTS = ["def main():", "class Config:"]


def verify_report(log: Path) -> tuple[int, dict[str, Any]]:
    """``sglang-fl verify-report LOG --json`` as a user runs it: the installed console script."""
    script = Path(sys.executable).with_name("sglang-fl")
    proc = subprocess.run(
        [str(script), "verify-report", str(log), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    )
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.engine(LLAMA_SKEWED)
def test_the_summary_names_the_vendor_rms_norm_and_nothing_else(engine: Engine) -> None:
    engine.generate(PROMPTS, max_new_tokens=6)
    code, summary = verify_report(engine.log)
    assert code == 1
    failed = [(row["op"], row["impl_id"]) for row in summary["rows"] if row["verdict"] == "fail"]
    assert failed == [("rms_norm", SKEWED_IMPL)]
    (row,) = (r for r in summary["rows"] if r["impl_id"] == SKEWED_IMPL)
    assert row["distribution"] == "sglang-fl-skewed"
    assert row["calls_checked"] >= VERIFY_CALLS
    assert row["calls_failed"] >= 1
    assert row["max_abs_error"] > 10 * row["atol"]
    assert row["first_offending_layer"].startswith("sglang.srt.layers.layernorm.RMSNorm #0 ")
    # The other routed ops were checked too (against themselves: the reference runs them).
    passed = {r["op"] for r in summary["rows"] if r["verdict"] == "pass"}
    assert {"silu_and_mul", "rotary_embedding"} <= passed


@pytest.mark.engine(LLAMA)
def test_with_the_reference_alone_everything_passes(engine: Engine) -> None:
    engine.generate(PROMPTS, max_new_tokens=6)
    code, summary = verify_report(engine.log)
    assert code == 0
    assert summary["violations"] == 0
    rows = {row["op"]: row for row in summary["rows"]}
    assert rows["rms_norm"]["impl_id"] == "reference.rms_norm"
    assert {"rms_norm", "silu_and_mul", "rotary_embedding"} <= set(rows)
    for row in rows.values():
        assert (row["verdict"], row["calls_failed"]) == ("pass", 0), row
        assert row["calls_checked"] >= VERIFY_CALLS
