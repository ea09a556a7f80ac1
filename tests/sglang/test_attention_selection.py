"""What serves attention when a candidate cannot: on SGLang's real pools, without an engine.

Each case runs ``backend_forward.py`` (one prefill and one decode step through the
``sglang_fl`` backend and, on twin pools, through ``torch_native``) in a fresh interpreter with
throwaway vendor distributions on its path:

- a vendor ``decode_attention`` that declines every call (``decline_vendor``): chosen (it ranks
  first), every call handed to the reference, the outputs torch_native's, the decline reported
  once with its reason; under ``SGLANG_FL_STRICT=1`` the first decode is an error naming the op,
  the implementation and the reason;
- a vendor's whole backend (``backend_vendor``): denied by ``SGLANG_FL_DENY_VENDORS``, the
  kernel-based backend serves; its factory raising, the kernel-based backend serves and the
  report says why; under strict that is an error naming the vendor.

The vendor's whole backend serving a live engine is ``test_attention_vendor_backend.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from backend_vendor import PLUGIN, RAISE_MESSAGE, VENDOR_IMPL_ID
from decline_vendor import DECLINE_IMPL_ID, DECLINE_REASON
from engines import EnginePool
from installed_dists import pythonpath_with
from sglang_processes import ENGINE_TIMEOUT_S, HERE, clean_env

from sglang_fl.dispatch_report import read_log

pytest.importorskip("sglang")

KERNEL_BACKEND = "reference.sglang_fl_attention"


def forward(
    pool: EnginePool, tmp_path: Path, site: str, script: str = "backend_forward.py", **env: str
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """``script`` (``backend_forward.py``) with vendor ``site`` on the path, in a fresh
    interpreter with a hard timeout; the process and its records."""
    log = tmp_path / "dispatch.jsonl"
    proc = subprocess.run(
        [sys.executable, str(HERE / script)],
        env=clean_env(
            SGLANG_FL_DISPATCH_LOG=str(log), PYTHONPATH=pythonpath_with(pool.site(site)), **env
        ),
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT_S,
    )
    return proc, read_log(log) if log.exists() else []


def result(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr[-4000:]
    found: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return found


def test_a_declining_vendor_kernel_falls_back_and_the_report_says_why(
    engine_pool: EnginePool, tmp_path: Path
) -> None:
    proc, rows = forward(engine_pool, tmp_path, "decline")
    found = result(proc)
    assert (found["same"], found["pools_same"]) == (True, True)
    assert found["backend_class"] == "SglangFlAttnBackend"
    decode = [r for r in rows if r["event"] == "layer" and r.get("op") == "decode_attention"]
    assert len(decode) == 2  # one record per layer
    assert {r["impl_id"] for r in decode} == {DECLINE_IMPL_ID}  # chosen: it ranks first
    assert all(r["fallbacks"] == ["reference.decode_attention"] for r in decode)
    fallbacks = [r for r in rows if r["event"] == "fallback"]
    assert fallbacks, "the decline was not reported"
    assert {(r["op"], r["impl_id"], r["next_impl_id"], r["reason"]) for r in fallbacks} == {
        ("decode_attention", DECLINE_IMPL_ID, "reference.decode_attention", DECLINE_REASON)
    }


def test_strict_mode_makes_a_decline_an_error_naming_op_and_impl(
    engine_pool: EnginePool, tmp_path: Path
) -> None:
    proc, _ = forward(engine_pool, tmp_path, "decline", SGLANG_FL_STRICT="1")
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "StrictModeError" in text, text[-4000:]
    assert f"{DECLINE_IMPL_ID} declined a call of decode_attention" in text
    assert DECLINE_REASON in text


def backend_records(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["event"] == "attention_backend"]


def test_denied_the_vendors_whole_backend_the_kernel_based_one_serves(
    engine_pool: EnginePool, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.txt"
    proc, rows = forward(
        engine_pool,
        tmp_path,
        "wholebackend",
        BACKEND_VENDOR_CALLS=str(calls),
        SGLANG_FL_DENY_VENDORS=PLUGIN,
    )
    found = result(proc)
    assert (found["same"], found["pools_same"]) == (True, True)
    assert found["backend_class"] == "SglangFlAttnBackend"
    (record,) = backend_records(rows)
    assert record["impl_id"] == KERNEL_BACKEND
    assert record["backend_class"].endswith("SglangFlAttnBackend")
    assert not calls.exists()
    assert any(r["event"] == "layer" and r.get("attention_backend") for r in rows)


def test_a_factory_that_raises_falls_back_reported(engine_pool: EnginePool, tmp_path: Path) -> None:
    proc, rows = forward(engine_pool, tmp_path, "wholebackend", BACKEND_VENDOR_RAISE="1")
    found = result(proc)
    assert (found["same"], found["pools_same"]) == (True, True)
    assert found["backend_class"] == "SglangFlAttnBackend"
    (record,) = backend_records(rows)
    assert record["impl_id"] == KERNEL_BACKEND
    assert record["failed"] == [VENDOR_IMPL_ID]
    fallbacks = [
        r for r in rows if r["event"] == "fallback" and r["op"] == "sglang_attention_backend"
    ]
    assert fallbacks
    assert {(r["impl_id"], r["next_impl_id"]) for r in fallbacks} == {
        (VENDOR_IMPL_ID, KERNEL_BACKEND)
    }
    assert all(RAISE_MESSAGE in r["reason"] for r in fallbacks)


def test_strict_makes_a_failing_factory_an_error_naming_the_vendor(
    engine_pool: EnginePool, tmp_path: Path
) -> None:
    proc, _ = forward(
        engine_pool, tmp_path, "wholebackend", BACKEND_VENDOR_RAISE="1", SGLANG_FL_STRICT="1"
    )
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "StrictModeError" in text, text[-4000:]
    assert f"vendor {PLUGIN!r}: attention backend {VENDOR_IMPL_ID}" in text
    assert RAISE_MESSAGE in text
