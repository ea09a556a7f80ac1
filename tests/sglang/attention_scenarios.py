"""The attention tests' request scenarios, sent to a shared engine.

A batch of short prompts, one long prompt (several prefill chunks: the attention engines run
with ``configurations.CHUNK``-token chunks), and requests sharing a long prefix sent one after
another, so the later ones hit the radix cache (emptied first, so the first one cannot).
"""

from __future__ import annotations

from typing import Any

from engines import Engine

NEW_TOKENS = 8
SHORT = ["The quick brown fox", "import os\nimport sys\n", "def main():"]
LONG = " ".join(["the scheduler splits a long prompt into chunks of prefill"] * 6)
PREFIX = " ".join(["shared context that every request repeats before its question"] * 4)
SHARED = [f"{PREFIX} question {i}:" for i in range(3)]
SCENARIOS = {"short": SHORT, "long": [LONG], "shared": SHARED}


def run_scenarios(engine: Engine) -> dict[str, Any]:
    """Each scenario's output ids, the long prompt's length and the shared requests' cache hits."""
    engine.flush_cache()
    short = engine.generate(SHORT, max_new_tokens=NEW_TOKENS)
    long = engine.generate([LONG], max_new_tokens=NEW_TOKENS)
    shared = [engine.generate([prompt], max_new_tokens=NEW_TOKENS)[0] for prompt in SHARED]
    return {
        "short": [out["output_ids"] for out in short],
        "long": [out["output_ids"] for out in long],
        "long_prompt_tokens": len(engine.tokenize(LONG)),
        "shared": [out["output_ids"] for out in shared],
        "shared_cached_tokens": [out["meta_info"].get("cached_tokens", 0) for out in shared],
    }


def transformers_scenarios(oracle: Any, model: str) -> dict[str, list[list[int]]]:
    """transformers' greedy ids for each scenario (up to EOS, as SGLang stops)."""
    return {
        name: oracle(model, prompts, NEW_TOKENS, stop_at_eos=True)
        for name, prompts in SCENARIOS.items()
    }
