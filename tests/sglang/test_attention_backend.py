"""The ``sglang_fl`` backend on SGLang's real KV pools and layers, without an engine.

One forward of two ``RadixAttention`` layers (prefill with a radix-hit request, then a decode
step) through ``SglangFlAttnBackend`` and through ``TorchNativeAttnBackend`` on twin pools:
equal outputs and equal pools. In verify mode (a subprocess: the runtime reads the switch
once), every attention op is checked with a budget of its own, not one shared by the class.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sglang_processes import ENGINE_TIMEOUT_S, HERE, clean_env

from sglang_fl.dispatch_report import read_log

pytest.importorskip("sglang")


def _run(tmp_path, **env: str) -> tuple[str, list[dict]]:
    log = tmp_path / "dispatch.jsonl"
    proc = subprocess.run(
        [sys.executable, str(HERE / "backend_forward.py")],
        env=clean_env(SGLANG_FL_DISPATCH_LOG=str(log), **env),
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), read_log(log)


def test_outputs_and_pool_equal_torch_natives(tmp_path) -> None:
    last, rows = _run(tmp_path)
    assert (last["same"], last["pools_same"]) == (True, True)
    assert last["backend_class"] == "SglangFlAttnBackend"
    layer_rows = [r for r in rows if r["event"] == "layer" and r.get("attention_backend")]
    assert len(layer_rows) == 2 * 3  # one record per layer and op, not per call


def test_verify_mode_checks_every_attention_op_with_its_own_budget(tmp_path) -> None:
    last, rows = _run(tmp_path, SGLANG_FL_VERIFY="2")
    assert (last["same"], last["pools_same"]) == (True, True)
    checks = [r for r in rows if r["event"] == "verify"]
    per_op = {op: [r for r in checks if r["op"] == op] for op in attention_ops()}
    assert {op: len(found) for op, found in per_op.items()} == dict.fromkeys(per_op, 2)
    assert all(r["problem"] is None for r in checks), checks
    assert {r["layer"] for r in checks} == {
        f"sglang.srt.layers.radix_attention.RadixAttention[{op}]" for op in per_op
    }


def attention_ops() -> tuple[str, ...]:
    return ("store_kv_cache", "decode_attention", "extend_attention")
