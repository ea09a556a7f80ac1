"""SGLang end to end on the CPU through sglang-fl: Engine, HTTP server, a vendor wheel.

Each engine runs in its own subprocess (``engine_run.py``) with its own dispatch log, so the
log shows what SGLang's spawned scheduler process really ran. Greedy token ids must equal
``transformers``' and those of SGLang's own ``forward_native`` paths
(``SGLANG_FORCE_FUSED_OP_BACKEND=torch``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from probe_vendor import probe_vendor_site
from sglang_processes import (
    STANDARD_LAYERS,
    clean_env,
    launch_server,
    post_json,
    scheduler_layers,
)
from sglang_processes import run_engine as run_engine_process
from tiny_models import hf_greedy

from sglang_fl.dispatch_report import read_log

pytest.importorskip("sglang")

PROMPTS = ["def main():", "import os\nimport sys\n", "class Config:"]
MAX_NEW_TOKENS = 12


def run_engine(model: Path, log: Path, **env: str) -> dict[str, Any]:
    """Greedy ``PROMPTS`` from an engine subprocess that logs its dispatch to ``log``."""
    return run_engine_process(
        model, MAX_NEW_TOKENS, PROMPTS, clean_env(SGLANG_FL_DISPATCH_LOG=str(log), **env)
    )


@pytest.fixture(scope="module")
def expected(models: dict[str, Path]) -> dict[str, list[list[int]]]:
    """transformers' greedy token ids, per architecture: the ground truth."""
    return {arch: hf_greedy(path, PROMPTS, MAX_NEW_TOKENS) for arch, path in models.items()}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_engine_generates_what_transformers_generates(
    arch: str, models: dict[str, Path], expected: dict[str, list[list[int]]], tmp_path: Path
) -> None:
    log = tmp_path / "dispatch.jsonl"
    result = run_engine(models[arch], log)
    assert result["output_ids"] == expected[arch]

    rows = read_log(log)
    plugin_pids = {r["pid"] for r in rows if r["event"] == "plugin"}
    assert result["pid"] in plugin_pids, "the plugin loads in the main process"
    assert len(plugin_pids) >= 3, f"main, scheduler and detokenizer load the plugin: {rows}"
    layers = scheduler_layers(rows, result["pid"])
    for op_name, layer in STANDARD_LAYERS.items():
        row = layers.get(layer)
        assert row is not None, f"the scheduler never resolved {layer}: {sorted(layers)}"
        assert row["runner"] == "sglang-fl"
        assert row["op"] == op_name
        assert row["impl_id"] == f"reference.{op_name}"
        assert row["kind"] == "reference"
        assert row["distribution"] == "sglang-fl"
    assert not [r for r in rows if r["event"] == "handoff"], "nothing is handed back"


def test_forced_torch_backend_gives_the_same_tokens_without_routing(
    models: dict[str, Path], expected: dict[str, list[list[int]]], tmp_path: Path
) -> None:
    log = tmp_path / "dispatch.jsonl"
    result = run_engine(models["llama"], log, SGLANG_FORCE_FUSED_OP_BACKEND="torch")
    assert result["output_ids"] == expected["llama"]
    rows = read_log(log)
    assert [r for r in rows if r["event"] == "plugin"], "the plugin still loads"
    # The switch forces fused ops; the attention backend is another choice (still sglang_fl).
    routed = [
        r
        for r in rows
        if r["event"] == "layer" and r["runner"] == "sglang-fl" and not r.get("attention_backend")
    ]
    assert routed == [], "SGLang's forced backend wins over sglang-fl's route"


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


# --- HTTP server ---------------------------------------------------------------------------


def test_http_server_completions_return_the_same_tokens(
    models: dict[str, Path], expected: dict[str, list[list[int]]], tmp_path: Path
) -> None:
    log = tmp_path / "dispatch.jsonl"
    env = clean_env(SGLANG_FL_DISPATCH_LOG=str(log))
    with launch_server(models["llama"], tmp_path, env) as server:
        for prompt, want in zip(PROMPTS, expected["llama"], strict=True):
            reply = post_json(
                f"{server.base_url}/v1/completions",
                {
                    "model": str(models["llama"]),
                    "prompt": prompt,
                    "max_tokens": MAX_NEW_TOKENS,
                    "temperature": 0,
                    "return_token_ids": True,
                },
            )
            assert reply["choices"][0]["token_ids"] == want
    layers = scheduler_layers(read_log(log), main_pid=server.proc.pid)
    assert {layers[name]["runner"] for name in STANDARD_LAYERS.values()} == {"sglang-fl"}


# --- a vendor wheel installed beside core --------------------------------------------------


@pytest.fixture(scope="module")
def vendor_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The probe vendor built as a real wheel and pip-installed into a directory of its own."""
    root = tmp_path_factory.mktemp("probe-vendor")
    return probe_vendor_site(root)


def test_vendor_wheel_is_called_inside_the_scheduler(
    models: dict[str, Path],
    expected: dict[str, list[list[int]]],
    vendor_site: Path,
    tmp_path: Path,
) -> None:
    log, calls = tmp_path / "dispatch.jsonl", tmp_path / "calls.jsonl"
    pythonpath = os.pathsep.join(filter(None, [str(vendor_site), os.environ.get("PYTHONPATH")]))
    result = run_engine(models["llama"], log, PYTHONPATH=pythonpath, PROBE_VENDOR_CALLS=str(calls))
    assert result["output_ids"] == expected["llama"]
    layers = scheduler_layers(read_log(log), result["pid"])
    scheduler_pids = {layers[name]["pid"] for name in STANDARD_LAYERS.values()}
    for op_name, layer in STANDARD_LAYERS.items():
        row = layers[layer]
        assert row["impl_id"] == f"vendor.probe.{op_name}"
        assert (row["kind"], row["vendor"]) == ("vendor", "probe")
        assert (row["distribution"], row["version"]) == ("sglang-fl-probe", "0.0.1")
        assert f"reference.{op_name}" in row["fallbacks"]
    called = [json.loads(line) for line in calls.read_text().splitlines()]
    # Every op whose layer the scheduler routed ran on the vendor (Llama's decode steps also
    # compute their positions through ClampPositionOp: clamp_position).
    routed = {row["op"] for row in layers.values() if row["runner"] == "sglang-fl"}
    assert routed >= set(STANDARD_LAYERS) | {"clamp_position"}
    assert {c["op"] for c in called} == routed
    assert {c["pid"] for c in called} <= scheduler_pids, "the vendor ran in the scheduler"
    assert result["pid"] not in {c["pid"] for c in called}


def test_platform_declared_by_a_vendor_is_what_sglang_activates(vendor_site: Path) -> None:
    script = (
        "from sglang.srt.platforms import current_platform as p; "
        "print(type(p).__qualname__, p.get_dispatch_key_name(), p.is_out_of_tree())"
    )
    last = run_python(
        script,
        PYTHONPATH=os.pathsep.join(filter(None, [str(vendor_site), os.environ.get("PYTHONPATH")])),
        PROBE_VENDOR_PLATFORM="sglang_fl_probe.platform:ProbePlatform",
    )
    assert last == "ProbePlatform probe True"
