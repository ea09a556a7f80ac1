"""Qwen3-Next and Qwen3.5 (hybrid gated-delta-rule linear attention) end to end on the CPU
through sglang-fl.

Three tiny models built offline (``tiny_models``): Qwen3-Next with value/key head ratio 2
(SGLang's fused q/k/v/z/b/a split) and ratio 3 (its torch reshuffle), and Qwen3.5 (its
non-interleaved split and gated full attention), float32. Each model's shared engine
(``configurations.py``) serves, one request after another: two short prompts, a prompt spanning
several 64-token chunks with 64-token chunked prefill, and two prompts sharing that long prefix
(the second reuses the first's cached states through SGLang's hybrid radix cache). Every output
must be transformers' greedy tokens; the dispatch report must show each GDN kernel SGLang
called routed to sglang-fl and nothing left to SGLang. The ratio-3 engine also carries a vendor
whose chunked delta rule declines long calls (``test_linear_attention_engine.py``): there that
op's chosen implementation is the vendor's.
"""

from __future__ import annotations

from typing import Any

import pytest
from configurations import GDN_CHUNK, QWEN3_5, QWEN3_NEXT, QWEN3_NEXT_R3
from decline_vendor import GDN_DECLINE_IMPL_ID
from engines import Engine, EngineSpec, model_path
from sglang_processes import scheduler_layers

pytest.importorskip("sglang")

ENGINES = [QWEN3_NEXT, QWEN3_NEXT_R3, QWEN3_5]
IDS = ["qwen3_next", "qwen3_next_r3", "qwen3_5"]
MAX_NEW_TOKENS = 6
CHUNKED_PREFILL = GDN_CHUNK
LONG = (
    "def parse(text):\n    result = []\n    for line in text.splitlines():\n"
    "        if not line.strip():\n            continue\n"
    "        key, _, value = line.partition('=')\n"
    "        result.append((key.strip(), value.strip()))\n    return result\n\n"
    "class Config:\n    def __init__(self, path):\n        self.path = path\n"
    "        self.values = {}\n\n    def load(self):\n        with open(self.path) as f:\n"
    "            for key, value in parse(f.read()):\n                self.values[key] = value\n"
    "\n    def keys(self):\n        return sorted(self.values)\n"
    "\n    def items(self):\n        return [(k, self.values[k]) for k in self.keys()]\n"
)
PROMPTS = [
    "def main():",
    "import os",
    LONG,
    LONG + "    def get(self, key):",
    LONG + "    def save(self):",
]
# The GDN ops whose SGLang functions a prefill + decode of Qwen3-Next calls on this path. None
# of SGLang's Triton kernels can run here, so tokens equal to transformers' also prove that
# each call was served by sglang-fl.
CALLED = {
    "fused_qkvzba_split_reshape_cat",
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "fused_gdn_gating",
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule_packed_decode",
    "rms_norm_gated",
    "track_mamba_states",
    # Qwen3.5's (models/qwen3_5.py): its split and the full-attention output gate.
    "fused_qkvzba_split_reshape_cat_contiguous",
    "fused_sigmoid_mul",
}


_RUNS: dict[EngineSpec, dict[str, Any]] = {}


def run_prompts(engine: Engine) -> dict[str, Any]:
    """``PROMPTS`` one request after another (the cache emptied first): each output's ids, its
    cached-token count and its tokens' log-probabilities; once per engine."""
    if engine.spec not in _RUNS:
        engine.flush_cache()
        outputs = [
            engine.generate([prompt], max_new_tokens=MAX_NEW_TOKENS, return_logprob=True)[0]
            for prompt in PROMPTS
        ]
        _RUNS[engine.spec] = {
            "output_ids": [out["output_ids"] for out in outputs],
            "cached_tokens": [out["meta_info"].get("cached_tokens", 0) for out in outputs],
            "logprobs": [
                [entry[0] for entry in out["meta_info"]["output_token_logprobs"]] for out in outputs
            ],
        }
    return _RUNS[engine.spec]


@pytest.mark.parametrize("engine", ENGINES, indirect=True, ids=IDS)
def test_generates_what_transformers_generates(engine: Engine, oracle) -> None:
    got = run_prompts(engine)["output_ids"]
    want = oracle(engine.spec.model, PROMPTS, MAX_NEW_TOKENS, stop_at_eos=True)
    for prompt, g, w in zip(PROMPTS, got, want, strict=True):
        assert g == w, f"{engine.spec.id}, prompt {prompt[-30:]!r}: sglang {g} != transformers {w}"


def test_long_prompt_spans_several_chunks() -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path("qwen3_next"))
    assert len(tokenizer(LONG).input_ids) > 3 * CHUNKED_PREFILL


@pytest.mark.parametrize("engine", ENGINES, indirect=True, ids=IDS)
def test_shared_prefix_is_served_from_the_radix_cache(engine: Engine) -> None:
    cached = run_prompts(engine)["cached_tokens"]
    # The last two prompts extend the long one: each must reuse its cached prefix states.
    assert cached[3] >= CHUNKED_PREFILL, cached
    assert cached[4] >= CHUNKED_PREFILL, cached


@pytest.mark.parametrize("engine", ENGINES, indirect=True, ids=IDS)
def test_every_gdn_kernel_runs_through_sglang_fl(engine: Engine) -> None:
    run_prompts(engine)
    rows = engine.records()
    layers = scheduler_layers(rows, engine.pid)
    scheduler = {r["pid"] for r in layers.values()}
    functions = [
        r
        for r in rows
        if r["event"] == "function" and r["pid"] in scheduler and "declined_by" not in r
    ]
    left = [r for r in functions if r["runner"] != "sglang-fl"]
    assert not left, f"kernel functions left to SGLang: {left}"
    routed_ops = {r["op"] for r in functions}
    assert routed_ops >= CALLED, routed_ops
    # The ratio-3 engine's vendor ranks above the reference for the chunked delta rule.
    vendor = (
        {"chunk_gated_delta_rule": GDN_DECLINE_IMPL_ID} if "gdndecline" in engine.spec.sites else {}
    )
    for row in functions:
        assert row["impl_id"] == vendor.get(row["op"], f"reference.{row['op']}"), row
    not_routed = {name: row for name, row in layers.items() if row["runner"] != "sglang-fl"}
    # The hybrid model's KV pool is not the token-level MHA pool store_kv_cache writes: SGLang's
    # own store stays, reported with the reason (sglang_fl is the platform's default backend).
    store = not_routed.pop("sglang.srt.layers.radix_attention.RadixAttention[store_kv_cache]", None)
    assert store is None or "is not the token-level MHA pool" in store["reason"], store
    assert not not_routed, f"fused ops left to SGLang: {set(not_routed)}"
    assert not [r for r in rows if r["event"] == "handoff"], "nothing is handed back"
    # What was called, not only what was bound: each function's first call names who served it,
    # one of the candidates its routing record bound; a function the model never calls (the
    # other architecture's) is bound and has no such record.
    bound = {(r["pid"], r["function"]): r for r in functions}
    called = [r for r in rows if r["event"] == "called" and r["pid"] in scheduler]
    assert len(called) == len({(r["pid"], r["function"]) for r in called}), "once per process"
    for row in called:
        routing = bound[row["pid"], row["function"]]
        assert row["op"] == routing["op"], row
        assert row["impl_id"] in [routing["impl_id"], *routing["fallbacks"]], (row, routing)
    called_ops = {r["op"] for r in called}
    assert {"chunk_gated_delta_rule", "causal_conv1d_fn", "causal_conv1d_update"} <= called_ops
    if "qwen3_5" not in engine.spec.model:
        assert "fused_sigmoid_mul" in routed_ops  # bound, ...
        assert "fused_sigmoid_mul" not in called_ops  # ... never called: Qwen3.5's gate
