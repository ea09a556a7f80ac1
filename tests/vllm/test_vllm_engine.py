"""vLLM end to end on the CPU through sglang-fl: its engine, and a vendor wheel inside it.

Each engine runs in its own subprocess (``vllm_run.py``) with its own dispatch log, so the log
shows what vLLM's spawned worker process really ran. Greedy token ids must equal
``transformers``' on a tiny Qwen2 with ``head_dim`` 64 (vLLM's CPU attention rejects 16).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from probe_vendor import probe_vendor_site
from sglang_processes import persistent_cache
from tiny_models import build_tiny_model, hf_greedy

from sglang_fl.dispatch_report import read_log

pytest.importorskip("vllm")

HERE = Path(__file__).parent
PROMPTS = ["def main():", "import os\nimport sys\n", "class Config:"]
MAX_NEW_TOKENS = 12
# The layers of a Qwen2 decoder that sglang-fl routes, by standard op.
QWEN2_LAYERS = {
    "rms_norm": "vllm.model_executor.layers.layernorm.RMSNorm",
    "silu_and_mul": "vllm.model_executor.layers.activation.SiluAndMul",
    "rotary_embedding": "vllm.model_executor.layers.rotary_embedding.base.RotaryEmbedding",
}
ENGINE_TIMEOUT_S = 420


@pytest.fixture(scope="module")
def qwen2() -> Path:
    """A tiny Qwen2 with 4 heads of 64 (hidden 256), built offline once (the tests' cache)."""
    return build_tiny_model(persistent_cache("models") / "qwen2-256", "qwen2", hidden_size=256)


@pytest.fixture(scope="module")
def expected(qwen2: Path) -> list[list[int]]:
    return hf_greedy(qwen2, PROMPTS, MAX_NEW_TOKENS)


def run_vllm(model: Path, log: Path, **env: str) -> dict[str, Any]:
    """Greedy ``PROMPTS`` from a vLLM engine subprocess that logs its dispatch to ``log``."""
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_FL_", "VLLM_"))},
        "SGLANG_FL_DISPATCH_LOG": str(log),
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB: the default would reserve 4 on a shared machine
        **env,
    }
    command = [sys.executable, str(HERE / "vllm_run.py"), str(model), str(MAX_NEW_TOKENS)]
    done = subprocess.run(
        [*command, *PROMPTS],
        env=environment,
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"vLLM exited with {done.returncode}:\n{done.stderr[-6000:]}")
    last = [line for line in done.stdout.splitlines() if line.startswith('{"pid"')][-1]
    result: dict[str, Any] = json.loads(last)
    return result


def worker_layers(rows: list[dict[str, Any]], main_pid: int) -> dict[str, dict[str, Any]]:
    """The ``layer`` records written by vLLM's worker process (never the front end), by class."""
    layers = {r["layer"]: r for r in rows if r["event"] == "layer" and "scope" not in r}
    pids = {r["pid"] for r in layers.values()}
    assert main_pid not in pids, "layers were built in the front-end process, not a worker"
    assert len(pids) == 1, f"layers built in several processes: {pids}"
    return layers


def test_engine_generates_what_transformers_generates(
    qwen2: Path, expected: list[list[int]], tmp_path: Path
) -> None:
    log = tmp_path / "dispatch.jsonl"
    result = run_vllm(qwen2, log)
    assert result["output_ids"] == expected
    rows = read_log(log)
    layers = worker_layers(rows, result["pid"])
    for op_name, layer in QWEN2_LAYERS.items():
        row = layers[layer]
        assert (row["runner"], row["impl_id"]) == ("sglang-fl", f"reference.{op_name}")
    plugins = [r for r in rows if r["event"] == "plugin"]
    assert {r["pid"] for r in plugins} >= {result["pid"], *(r["pid"] for r in layers.values())}
    assert {r["engine"] for r in plugins} == {"vllm"}


@pytest.fixture(scope="module")
def vendor_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The probe vendor (the SGLang tests' own), installed into a directory of its own."""
    root = tmp_path_factory.mktemp("probe-vendor")
    return probe_vendor_site(root)


def test_vendor_wheel_is_called_inside_the_worker(
    qwen2: Path, expected: list[list[int]], vendor_site: Path, tmp_path: Path
) -> None:
    log, calls = tmp_path / "dispatch.jsonl", tmp_path / "calls.jsonl"
    pythonpath = os.pathsep.join(filter(None, [str(vendor_site), os.environ.get("PYTHONPATH")]))
    result = run_vllm(qwen2, log, PYTHONPATH=pythonpath, PROBE_VENDOR_CALLS=str(calls))
    assert result["output_ids"] == expected
    layers = worker_layers(read_log(log), result["pid"])
    (worker_pid,) = {row["pid"] for row in layers.values()}
    for op_name, layer in QWEN2_LAYERS.items():
        row = layers[layer]
        assert row["impl_id"] == f"vendor.probe.{op_name}"
        assert (row["distribution"], row["version"]) == ("sglang-fl-probe", "0.0.1")
        assert f"reference.{op_name}" in row["fallbacks"]
    called = [json.loads(line) for line in calls.read_text().splitlines()]
    assert {c["op"] for c in called} == set(QWEN2_LAYERS)
    assert {c["pid"] for c in called} == {worker_pid}, "the vendor's kernels ran in the worker"
