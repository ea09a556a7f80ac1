"""Greedy generation with ``sglang.Engine`` on the CPU, in a process of its own.

``python engine_run.py MODEL_DIR MAX_NEW_TOKENS PROMPT...`` prints one JSON line
``{"pid": ..., "output_ids": [[...], ...], "texts": [...]}`` last. The tests and the demo run
it as a subprocess so that each engine gets its own environment (``SGLANG_*`` and
``SGLANG_FL_*`` variables) and its own spawned scheduler and detokenizer processes.
"""

from __future__ import annotations

import json
import os
import sys

# SGLang's default KV cache would reserve ~15 GB; a tiny model needs a few thousand tokens.
MAX_TOTAL_TOKENS = 4096


def generate(model_dir: str, prompts: list[str], max_new_tokens: int) -> dict[str, object]:
    """Start an engine on the CPU, generate greedily, shut it down."""
    import sglang

    engine = sglang.Engine(
        model_path=model_dir,
        device="cpu",
        max_total_tokens=MAX_TOTAL_TOKENS,
        # SGLang's "auto" runs float32 checkpoints in float16; compare like with like.
        dtype="float32",
        log_level=os.environ.get("ENGINE_LOG_LEVEL", "warning"),
    )
    try:
        outputs = engine.generate(prompts, {"temperature": 0, "max_new_tokens": max_new_tokens})
    finally:
        engine.shutdown()
    return {
        "pid": os.getpid(),
        "output_ids": [out["output_ids"] for out in outputs],
        "texts": [out["text"] for out in outputs],
    }


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    model_dir, max_new_tokens, *prompts = argv
    result = generate(model_dir, prompts, int(max_new_tokens))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
