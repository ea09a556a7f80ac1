"""SGLang's CPU graph runner (``--enable-torch-compile``) through sglang-fl, end to end.

On the compiled engines of ``configurations.py`` (the decode step compiled for batches of 1
and 2 at start-up, ``--attention-backend sglang_fl``, every fused op routed), greedy tokens are
eager's: transformers' for the tiny Llama, Qwen3 and Qwen3-Next (what their eager engines give,
``test_engine.py`` and friends), the eager bfloat16 engine's for the real model. Prompts go one
at a time (the compiled step of batch 1), two together (batch 2) and three together (more than
the largest compiled batch: SGLang decodes that batch eagerly in the same engine).

The scheduler's dispatch report must show what ran: the ``graph_state`` record of the
attention backend (plans allocated for ``compiled`` mode), the ``graph_capture`` record of
sglang-fl's CPU graph runner with the routed ops inside the compiled graphs: the references
declared traceable (the elementwise ops and the KV store) traced into them (``traced_ops``),
every other routed op called there as its ``sglang_fl::<op>`` custom op (eager code never
calls one: the attention ops, the norms, and for Qwen3-Next the GDN functions), no graph
break and no recompile in sglang-fl's code, at capture or at replay (``graph_replay``). Breaks
and recompiles in SGLang's own code are listed with their owner, not failed on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from configurations import (
    LLAMA_COMPILED,
    QWEN3_COMPILED,
    QWEN3_NEXT_COMPILED,
    SMOLLM2_BF16,
    SMOLLM2_BF16_COMPILED,
)
from engines import Engine, EnginePool
from real_model import chat_input_ids
from sglang_processes import scheduler_layers
from test_real_model import MAX_NEW_TOKENS as CHAT_NEW_TOKENS
from test_real_model import QUESTIONS

from sglang_fl.ops import STANDARD_OPS

pytest.importorskip("sglang")
# A compiled engine compiles its decode step per batch size before it serves.
pytestmark = pytest.mark.timeout(1800)

PROMPTS = ["def main():", "import os\nimport sys\n", "class Config:"]
MAX_NEW_TOKENS = 12
# The routed ops every compiled decode step of these models calls.
DECODE_OPS = {"store_kv_cache", "decode_attention", "rms_norm", "silu_and_mul", "rotary_embedding"}
# Those whose references dynamo traces into the compiled steps (not custom ops there).
TRACEABLE = {op for op, contract in STANDARD_OPS.items() if contract.reference_traceable}
# Qwen3-Next: Gemma-style norms, a MoE, the GDN decode functions; its hybrid KV pool keeps
# SGLang's own store (not the token-level MHA pool store_kv_cache writes).
QWEN3_NEXT_DECODE_OPS = {
    "decode_attention",
    "gemma_rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "topk",
    "fused_moe",
    "fused_qkvzba_split_reshape_cat",
    "causal_conv1d_update",
    "fused_recurrent_gated_delta_rule_packed_decode",
    "rms_norm_gated",
}


def generations(engine: Engine) -> list[list[int]]:
    """``PROMPTS`` one at a time, then two together, then all three: their output ids."""
    return batched(engine, [{"prompts": [p]} for p in PROMPTS], MAX_NEW_TOKENS)


def batched(engine: Engine, requests: list[dict[str, Any]], new_tokens: int) -> list[list[int]]:
    """Each request of ``requests`` (``generate`` keywords: prompts or input ids), then the
    first two together, then all: batches of 1, 2 (compiled) and 3 (eager)."""
    engine.flush_cache()
    key = "prompts" if "prompts" in requests[0] else "input_ids"
    items = [request[key][0] for request in requests]
    outputs = [engine.generate(**{key: [item]}, max_new_tokens=new_tokens)[0] for item in items]
    outputs += engine.generate(**{key: items[:2]}, max_new_tokens=new_tokens)
    outputs += engine.generate(**{key: items}, max_new_tokens=new_tokens)
    return [out["output_ids"] for out in outputs]


def real_model_answers(engine: Engine, real_model: Path) -> list[list[int]]:
    """The real model's chat questions, singly and in batches of 2 and 3."""
    ids = chat_input_ids(real_model, QUESTIONS)
    return batched(engine, [{"input_ids": [one]} for one in ids], CHAT_NEW_TOKENS)


def scheduler_records(engine: Engine, event: str) -> list[dict[str, Any]]:
    rows = engine.records()
    scheduler = {r["pid"] for r in scheduler_layers(rows, engine.pid).values()}
    return [r for r in rows if r["event"] == event and r["pid"] in scheduler]


def assert_compiled_through_sglang_fl(engine: Engine, ops: set[str]) -> dict[str, Any]:
    """The capture record: what the compiled steps called, and nothing recompiled or broken
    in sglang-fl's code; returns it."""
    (state,) = scheduler_records(engine, "graph_state")
    assert (state["mode"], state["max_bs"]) == ("compiled", 2), state
    (capture,) = scheduler_records(engine, "graph_capture")
    assert capture["capture_bs"] == [1, 2]
    assert capture["graphs"] >= 2, capture
    traced = set(capture["traced_ops"])
    assert traced == ops & TRACEABLE, f"routed ops traced into the compiled steps: {traced}"
    inside = set(capture["custom_ops"])
    assert ops - TRACEABLE <= inside, f"not called by the compiled steps: {ops - inside}"
    ours = [b for b in capture["graph_breaks"] if b["owner"] in ("sglang-fl", "vendor")]
    assert ours == [], f"graph breaks in sglang-fl's code: {ours}"
    recompiled = [r for r in capture["recompiles"] if r["owner"] in ("sglang-fl", "vendor")]
    assert recompiled == [], f"recompiles in sglang-fl's code: {recompiled}"
    replayed = [
        r
        for record in scheduler_records(engine, "graph_replay")
        for r in record["recompiles"]
        if r["owner"] in ("sglang-fl", "vendor")
    ]
    assert replayed == [], f"a compiled step recompiled at replay in sglang-fl's code: {replayed}"
    return capture


@pytest.mark.parametrize(
    "engine",
    [LLAMA_COMPILED, QWEN3_COMPILED, QWEN3_NEXT_COMPILED],
    indirect=True,
    ids=["llama", "qwen3", "qwen3-next"],
)
def test_compiled_decode_gives_transformers_tokens(engine: Engine, oracle) -> None:
    got = generations(engine)
    want = oracle(engine.spec.model, PROMPTS, MAX_NEW_TOKENS, stop_at_eos=True)
    assert got == [*want, *want[:2], *want]
    ops = QWEN3_NEXT_DECODE_OPS if engine.spec.model == "qwen3_next" else DECODE_OPS
    assert_compiled_through_sglang_fl(engine, ops)
    layers = [r for r in scheduler_records(engine, "layer") if r.get("op") == "decode_attention"]
    assert layers, "no attention layer bound decode_attention"
    assert {r["runner"] for r in layers} == {"sglang-fl"}


_EAGER_BF16: list[list[list[int]]] = []


@pytest.mark.engine(SMOLLM2_BF16)
def test_real_model_eager_bfloat16_answers(engine: Engine, real_model: Path) -> None:
    """The eager bfloat16 engine's answers (the oracle of the compiled one); no graph runner."""
    _EAGER_BF16.append(real_model_answers(engine, real_model))
    assert scheduler_records(engine, "graph_capture") == []


@pytest.mark.engine(SMOLLM2_BF16_COMPILED, also=(SMOLLM2_BF16,))
def test_real_model_compiled_bfloat16_answers_are_eagers(
    engine: Engine, engine_pool: EnginePool, real_model: Path
) -> None:
    compiled = real_model_answers(engine, real_model)
    assert_compiled_through_sglang_fl(engine, DECODE_OPS)
    if not _EAGER_BF16:  # run alone (-k): the eager engine after this one
        _EAGER_BF16.append(real_model_answers(engine_pool.get(SMOLLM2_BF16), real_model))
    assert compiled == _EAGER_BF16[0]
