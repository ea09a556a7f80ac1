"""Verify mode in a live SGLang engine: find the vendor op that breaks accuracy.

A throwaway vendor wheel, built and installed here, ships an ``rms_norm`` that is subtly wrong
(it accumulates the variance in bfloat16 where the contract says float32). A tiny Llama
generates with ``SGLANG_FL_VERIFY`` on; ``sglang-fl verify-report`` on the scheduler's dispatch
log must name that vendor's ``rms_norm`` and no other op. With the reference alone, the same
run passes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sglang_processes import clean_env, install_wheel_from_source, run_engine

CHECKED_CALLS = 3  # per layer class: the prefill and the first decode steps
SKEWED_IMPL = "vendor.skewed.rms_norm"

SKEWED_KERNEL = '''
"""The skewed chip's norm: the variance accumulates in bfloat16 (the contract says float32)."""
import torch


def rms_norm(obj, x, residual=None):
    orig_dtype = x.dtype
    hidden = x.to(torch.float32)
    if residual is not None:
        hidden = hidden + residual.to(torch.float32)
        residual = hidden.to(orig_dtype)
    variance = hidden.to(torch.bfloat16).pow(2).mean(dim=-1, keepdim=True).to(torch.float32)
    out = (hidden * torch.rsqrt(variance + obj.variance_epsilon) * obj.weight).to(orig_dtype)
    return out if residual is None else (out, residual)
'''

SKEWED_PLUGIN = f'''
from sglang_fl import hookimpl
from sglang_fl.dispatch.types import BackendImplKind, OpImpl

from .impl.normalization import rms_norm


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(
        OpImpl(op_name="rms_norm", impl_id="{SKEWED_IMPL}", kind=BackendImplKind.VENDOR,
               fn=rms_norm, vendor="skewed")
    )
'''

SKEWED_PYPROJECT = """
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang-fl-skewed"
version = "0.0.1"
dependencies = ["sglang-fl"]

[tool.setuptools]
packages = ["sglang_fl_skewed", "sglang_fl_skewed.impl"]

[project.entry-points."sglang_fl.backends"]
skewed = "sglang_fl_skewed.plugin"
"""


@pytest.fixture(scope="module")
def skewed_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("skewed-vendor")
    package = root / "src" / "sglang_fl_skewed"
    (package / "impl").mkdir(parents=True)
    (package / "__init__.py").write_text('"""A chip whose rms_norm is subtly wrong."""\n')
    (package / "impl" / "__init__.py").write_text("")
    (package / "impl" / "normalization.py").write_text(SKEWED_KERNEL)
    (package / "plugin.py").write_text(SKEWED_PLUGIN)
    (root / "src" / "pyproject.toml").write_text(SKEWED_PYPROJECT)
    return install_wheel_from_source(root / "src", root)


def generate_verified(model: Path, log: Path, **env: str) -> None:
    run_engine(
        model,
        6,
        ["def main():", "class Config:"],
        clean_env(SGLANG_FL_VERIFY=str(CHECKED_CALLS), SGLANG_FL_DISPATCH_LOG=str(log), **env),
    )


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


def test_the_summary_names_the_vendor_rms_norm_and_nothing_else(
    models: dict[str, Path], skewed_site: Path, tmp_path: Path
) -> None:
    log = tmp_path / "dispatch.jsonl"
    pythonpath = os.pathsep.join(filter(None, [str(skewed_site), os.environ.get("PYTHONPATH")]))
    generate_verified(models["llama"], log, PYTHONPATH=pythonpath)
    code, summary = verify_report(log)
    assert code == 1
    failed = [(row["op"], row["impl_id"]) for row in summary["rows"] if row["verdict"] == "fail"]
    assert failed == [("rms_norm", SKEWED_IMPL)]
    (row,) = (r for r in summary["rows"] if r["impl_id"] == SKEWED_IMPL)
    assert row["distribution"] == "sglang-fl-skewed"
    assert row["calls_checked"] >= CHECKED_CALLS
    assert row["calls_failed"] >= 1
    assert row["max_abs_error"] > 10 * row["atol"]
    assert row["first_offending_layer"].startswith("sglang.srt.layers.layernorm.RMSNorm #0 ")
    # The other routed ops were checked too (against themselves: the reference runs them).
    passed = {r["op"] for r in summary["rows"] if r["verdict"] == "pass"}
    assert {"silu_and_mul", "rotary_embedding"} <= passed


def test_with_the_reference_alone_everything_passes(
    models: dict[str, Path], tmp_path: Path
) -> None:
    log = tmp_path / "dispatch.jsonl"
    generate_verified(models["llama"], log)
    code, summary = verify_report(log)
    assert code == 0
    assert summary["violations"] == 0
    rows = {row["op"]: row for row in summary["rows"]}
    assert rows["rms_norm"]["impl_id"] == "reference.rms_norm"
    assert {"rms_norm", "silu_and_mul", "rotary_embedding"} <= set(rows)
    for row in rows.values():
        assert (row["verdict"], row["calls_failed"]) == ("pass", 0), row
        assert row["calls_checked"] >= CHECKED_CALLS
