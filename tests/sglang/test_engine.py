"""SGLang end to end on the CPU through sglang-fl: Engine, routed layers, a vendor wheel.

The engines are the shared ones (``configurations.py``): each runs in its own processes with
its own dispatch log, so the log shows what SGLang's spawned scheduler process really ran.
Greedy token ids must equal ``transformers``'. SGLang's own forced backend
(``SGLANG_FORCE_FUSED_OP_BACKEND=torch``) is checked in process (``test_layers.py``) and on the
Gemma-3 and real-model engines, where it is the oracle; the HTTP server on the real model
(``test_real_model.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from configurations import LLAMA, LLAMA_VENDOR, QWEN2
from engines import Engine
from installed_dists import pythonpath_with
from sglang_processes import STANDARD_LAYERS, clean_env, scheduler_layers

from sglang_fl.dispatch_report import read_log

pytest.importorskip("sglang")

PROMPTS = ["def main():", "import os\nimport sys\n", "class Config:"]
MAX_NEW_TOKENS = 12


@pytest.mark.parametrize("engine", [LLAMA, QWEN2], indirect=True, ids=["llama", "qwen2"])
def test_engine_generates_what_transformers_generates(engine: Engine, oracle) -> None:
    outputs = engine.generate(PROMPTS, max_new_tokens=MAX_NEW_TOKENS)
    assert [out["output_ids"] for out in outputs] == oracle(
        engine.spec.model, PROMPTS, MAX_NEW_TOKENS
    )

    rows = engine.records()
    plugin_pids = {r["pid"] for r in rows if r["event"] == "plugin"}
    assert engine.pid in plugin_pids, "the plugin loads in the main process"
    assert len(plugin_pids) >= 3, f"main, scheduler and detokenizer load the plugin: {rows}"
    layers = scheduler_layers(rows, engine.pid)
    for op_name, layer in STANDARD_LAYERS.items():
        row = layers.get(layer)
        assert row is not None, f"the scheduler never resolved {layer}: {sorted(layers)}"
        assert row["runner"] == "sglang-fl"
        assert row["op"] == op_name
        assert row["impl_id"] == f"reference.{op_name}"
        assert row["kind"] == "reference"
        assert row["distribution"] == "sglang-fl"
    assert not [r for r in rows if r["event"] == "handoff"], "nothing is handed back"


def run_python(script: str, **env: str) -> str:
    """Run ``script`` in a fresh interpreter with ``env``; its last stdout line."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


# Loads plugins the way SGLang does, then reports which forward each layer cached (or raised).
LAYER_SCRIPT = """
    import torch
    from sglang.srt.plugins import load_plugins
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.layers.layernorm import RMSNorm
    load_plugins()
    names = []
    for layer in (SiluAndMul(), RMSNorm(8)):
        try:
            layer(torch.ones(2, 8))
            names.append(layer._forward_method.__name__)
        except Exception as exc:
            names.append(type(exc).__name__)
    print(" ".join(names))
"""


def test_sglang_plugins_whitelist_without_sglang_fl_is_honoured(tmp_path: Path) -> None:
    """``SGLANG_PLUGINS`` naming other plugins keeps SGLang from running sglang-fl's."""
    log = tmp_path / "dispatch.jsonl"
    last = run_python(LAYER_SCRIPT, SGLANG_PLUGINS="someone_else", SGLANG_FL_DISPATCH_LOG=str(log))
    assert last == "forward_native forward_native"
    assert not [r for r in read_log(log) if r["event"] == "plugin"]


@pytest.mark.parametrize("strict", [False, True], ids=["lenient", "strict"])
def test_op_without_usable_implementation(strict: bool, tmp_path: Path) -> None:
    """No candidate left for rms_norm: SGLang keeps the layer (reported), or STRICT raises."""
    log = tmp_path / "dispatch.jsonl"
    env = {"SGLANG_FL_PER_OP": "rms_norm=vendor:nothing", "SGLANG_FL_DISPATCH_LOG": str(log)}
    if strict:
        env["SGLANG_FL_STRICT"] = "1"
    last = run_python(LAYER_SCRIPT, **env)
    second = "NoImplementationError" if strict else "forward_native"
    assert last == f"sglang_fl[reference.silu_and_mul] {second}"
    if not strict:
        (row,) = [r for r in read_log(log) if r.get("op") == "rms_norm"]
        assert row["runner"] == "sglang"
        assert "no usable implementation" in row["reason"]


# --- a vendor wheel installed beside core --------------------------------------------------


@pytest.mark.engine(LLAMA_VENDOR)
def test_vendor_wheel_is_called_inside_the_scheduler(engine: Engine, oracle) -> None:
    outputs = engine.generate(PROMPTS, max_new_tokens=MAX_NEW_TOKENS)
    assert [out["output_ids"] for out in outputs] == oracle("llama", PROMPTS, MAX_NEW_TOKENS)
    layers = scheduler_layers(engine.records(), engine.pid)
    scheduler_pids = {layers[name]["pid"] for name in STANDARD_LAYERS.values()}
    for op_name, layer in STANDARD_LAYERS.items():
        row = layers[layer]
        assert row["impl_id"] == f"vendor.probe.{op_name}"
        assert (row["kind"], row["vendor"]) == ("vendor", "probe")
        assert (row["distribution"], row["version"]) == ("sglang-fl-probe", "0.0.1")
        assert f"reference.{op_name}" in row["fallbacks"]
    calls = engine.workdir / "probe-calls.jsonl"
    called = [json.loads(line) for line in calls.read_text().splitlines()]
    # Every op whose layer the scheduler routed ran on the vendor (Llama's decode steps also
    # compute their positions through ClampPositionOp: clamp_position). Attention is the
    # vendor's whole backend here (test_attention_vendor_backend.py), so no attention op.
    routed = {row["op"] for row in layers.values() if row["runner"] == "sglang-fl"}
    assert routed >= set(STANDARD_LAYERS) | {"clamp_position"}
    assert {c["op"] for c in called} == routed
    assert {c["pid"] for c in called} <= scheduler_pids, "the vendor ran in the scheduler"
    assert engine.pid not in {c["pid"] for c in called}


def test_platform_declared_by_a_vendor_is_what_sglang_activates(engine_pool) -> None:
    script = (
        "from sglang.srt.platforms import current_platform as p; "
        "print(type(p).__qualname__, p.get_dispatch_key_name(), p.is_out_of_tree())"
    )
    last = run_python(
        script,
        PYTHONPATH=pythonpath_with(engine_pool.site("probe")),
        PROBE_VENDOR_PLATFORM="sglang_fl_probe.platform:ProbePlatform",
    )
    assert last == "ProbePlatform probe True"
