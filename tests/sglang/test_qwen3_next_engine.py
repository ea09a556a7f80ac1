"""Qwen3-Next and Qwen3.5 (hybrid gated-delta-rule linear attention) end to end on the CPU
through sglang-fl.

Three tiny models built offline (``tiny_models``): Qwen3-Next with value/key head ratio 2
(SGLang's fused q/k/v/z/b/a split) and ratio 3 (its torch reshuffle), and Qwen3.5 (its
non-interleaved split and gated full attention), float32. One engine per model, started once
per module on first use (``hybrid_run.py``, a hard timeout; ``-k`` on the model starts only
its own), serving in order: two short prompts,
a prompt spanning several 64-token chunks with 64-token chunked prefill, and two prompts
sharing that long prefix (the second reuses the first's cached states through SGLang's hybrid
radix cache). Every output must be transformers' greedy tokens; the dispatch report must show
each GDN kernel SGLang called routed to sglang-fl and nothing left to SGLang.
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

ARCHS = ("qwen3_next", "qwen3_next_r3", "qwen3_5")
MAX_NEW_TOKENS = 6
CHUNKED_PREFILL = 64
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


class Runs:
    """One engine per model, started on first use (a failed start is not retried): its
    result, the dispatch log, transformers' tokens."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[str, dict[str, Any]] = {}

    def __getitem__(self, arch: str) -> dict[str, Any]:
        if arch not in self.done:
            self.done[arch] = _run(self.root, arch)
        run = self.done[arch]
        if "error" in run:
            pytest.fail(run["error"])
        return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("qwen3-next"))


def _run(root: Path, arch: str) -> dict[str, Any]:
    model = build_tiny_model(root / arch, arch)
    log = root / f"{arch}.jsonl"
    # No SGLANG_MAMBA_CONV_DTYPE: on sglang-fl's platform the conv states take the model's
    # dtype (float32), so the comparison with transformers is like for like, and the start
    # documented in docs/running.md (SGLang's bfloat16 default failed the first prefill).
    env = clean_env(SGLANG_FL_DISPATCH_LOG=str(log))
    proc = subprocess.run(
        [sys.executable, str(HERE / "hybrid_run.py"), str(model), str(MAX_NEW_TOKENS),
         str(CHUNKED_PREFILL), *PROMPTS],
        env=env, capture_output=True, text=True, timeout=ENGINE_TIMEOUT_S,
    )  # fmt: skip
    if proc.returncode != 0:
        return {"error": f"{arch} engine failed ({proc.returncode}):\n{proc.stderr[-6000:]}"}
    return {
        "result": json.loads(proc.stdout.strip().splitlines()[-1]),
        "rows": read_log(log),
        "want": hf_greedy(model, PROMPTS, MAX_NEW_TOKENS, stop_at_eos=True),
    }


@pytest.mark.parametrize("arch", ARCHS)
def test_generates_what_transformers_generates(arch: str, runs: Runs) -> None:
    run = runs[arch]
    got, want = run["result"]["output_ids"], run["want"]
    for prompt, g, w in zip(PROMPTS, got, want, strict=True):
        assert g == w, f"{arch}, prompt {prompt[-30:]!r}: sglang {g} != transformers {w}"


def test_long_prompt_spans_several_chunks(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path, ARCHS[0]))
    assert len(tokenizer(LONG).input_ids) > 3 * CHUNKED_PREFILL


@pytest.mark.parametrize("arch", ARCHS)
def test_shared_prefix_is_served_from_the_radix_cache(arch: str, runs: Runs) -> None:
    cached = runs[arch]["result"]["cached_tokens"]
    # The last two prompts extend the long one: each must reuse its cached prefix states.
    assert cached[3] >= CHUNKED_PREFILL, cached
    assert cached[4] >= CHUNKED_PREFILL, cached


@pytest.mark.parametrize("arch", ARCHS)
def test_every_gdn_kernel_runs_through_sglang_fl(arch: str, runs: Runs) -> None:
    rows = runs[arch]["rows"]
    pid = runs[arch]["result"]["pid"]
    layers = scheduler_layers(rows, pid)
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
    for row in functions:
        assert row["impl_id"] == f"reference.{row['op']}", row
    not_routed = {name for name, row in layers.items() if row["runner"] != "sglang-fl"}
    assert not not_routed, f"fused ops left to SGLang: {not_routed}"
    assert not [r for r in rows if r["event"] == "handoff"], "nothing is handed back"
