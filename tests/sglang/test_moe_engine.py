"""MoE models end to end on the CPU through sglang-fl: tokens equal transformers' greedy.

Three architectures SGLang 0.5.23 ships, built tiny offline: Qwen3-MoE and Mixtral (routed
experts only) and Qwen2-MoE (plus a shared expert behind a sigmoid gate, which SGLang's model
code computes with the Triton-only ``fused_gate_sigmoid_mul_add``). Each runs in its own engine
subprocess with its own dispatch log; the scheduler's log must show ``TopK`` and the MoE method
routed to sglang-fl and no fused op left to SGLang for lack of an op, except the ones no
standard op covers yet.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sglang_processes import ENGINE_TIMEOUT_S, HERE, clean_env, scheduler_layers
from tiny_models import build_tiny_model, hf_greedy

from sglang_fl.dispatch_report import read_log

pytest.importorskip("sglang")

MOE_ARCHS = ("qwen3_moe", "mixtral", "qwen2_moe")
PROMPTS = ["def main():", "class Config:"]
MAX_NEW_TOKENS = 8
MOE_LAYERS = {
    "topk": "sglang.srt.layers.moe.topk.TopK",
    "fused_moe": "sglang.srt.layers.quantization.unquant.UnquantizedFusedMoEMethod",
}


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("moe-models")
    return {arch: build_tiny_model(root / arch, arch) for arch in MOE_ARCHS}


def generate(model: Path, log: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(HERE / "engine_run.py"), str(model), str(MAX_NEW_TOKENS), *PROMPTS],
        env=clean_env(SGLANG_FL_DISPATCH_LOG=str(log)),
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT_S,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"engine failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_moe_model_generates_what_transformers_generates(
    arch: str, moe_models: dict[str, Path], tmp_path: Path
) -> None:
    log = tmp_path / "dispatch.jsonl"
    result = generate(moe_models[arch], log)
    # Up to and including EOS: SGLang stops there (transformers' EOS is not suppressed here).
    assert result["output_ids"] == hf_greedy(
        moe_models[arch], PROMPTS, MAX_NEW_TOKENS, stop_at_eos=True
    )

    rows = read_log(log)
    layers = scheduler_layers(rows, result["pid"])
    for op_name, layer in MOE_LAYERS.items():
        row = layers.get(layer)
        assert row is not None, f"the scheduler never resolved {layer}: {sorted(layers)}"
        assert (row["runner"], row["op"]) == ("sglang-fl", op_name), row
        assert row["impl_id"] == f"reference.{op_name}"
    left = {name for name, row in layers.items() if row["runner"] != "sglang-fl"}
    assert not left, f"fused ops left to SGLang: {left}"
    assert not [r for r in rows if r["event"] == "handoff"], "nothing is handed back"
    functions = {r["function"]: r["runner"] for r in rows if r["event"] == "function"}
    assert set(functions.values()) == {"sglang-fl"}, functions
