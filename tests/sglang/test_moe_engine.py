"""MoE models end to end on the CPU through sglang-fl: tokens equal transformers' greedy.

Three architectures SGLang 0.5.23 ships, built tiny offline: Qwen3-MoE and Mixtral (routed
experts only) and Qwen2-MoE (plus a shared expert behind a sigmoid gate, which SGLang's model
code computes with the Triton-only ``fused_gate_sigmoid_mul_add``). Each runs on its shared
engine (``configurations.py``; Qwen3-MoE at TP=2, the engine the collectives' test shares); the
scheduler's log must show ``TopK`` and the MoE method routed to sglang-fl and no fused op left
to SGLang for lack of an op, except the ones no standard op covers yet.
"""

from __future__ import annotations

import pytest
from configurations import MIXTRAL, QWEN2_MOE, QWEN3_MOE_TP2
from engines import Engine
from sglang_processes import scheduler_layers

pytest.importorskip("sglang")

PROMPTS = ["def main():", "class Config:"]
MAX_NEW_TOKENS = 8
MOE_LAYERS = {
    "topk": "sglang.srt.layers.moe.topk.TopK",
    "fused_moe": "sglang.srt.layers.quantization.unquant.UnquantizedFusedMoEMethod",
}


@pytest.mark.parametrize(
    "engine",
    [QWEN3_MOE_TP2, MIXTRAL, QWEN2_MOE],
    indirect=True,
    ids=["qwen3_moe-tp2", "mixtral", "qwen2_moe"],
)
def test_moe_model_generates_what_transformers_generates(engine: Engine, oracle) -> None:
    outputs = engine.generate(PROMPTS, max_new_tokens=MAX_NEW_TOKENS)
    # Up to and including EOS: SGLang stops there (transformers' EOS is not suppressed here).
    want = oracle(engine.spec.model, PROMPTS, MAX_NEW_TOKENS, stop_at_eos=True)
    assert [out["output_ids"] for out in outputs] == want

    rows = engine.records()
    layers = scheduler_layers(rows, engine.pid)
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
