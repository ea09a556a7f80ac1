"""Greedy generation through one attention backend, in a process of its own.

``python attention_run.py MODEL_DIR BACKEND... [--tp N]`` starts one ``sglang.Engine`` per named
attention backend in turn (small ``chunked_prefill_size``, so a long prompt spans several
chunks) and, with each, generates: a batch of short prompts, one long prompt, and requests
sharing a long prefix sent one after another (so the later ones hit the radix cache). Prints
one JSON line last: per backend, the output ids of each scenario and the cached-token counts
SGLang reports (``meta_info.cached_tokens``), and the engine's pid.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from engine_run import start_engine

CHUNK = 16  # tokens per prefill chunk: the long prompt spans several
NEW_TOKENS = 8
SHORT = ["The quick brown fox", "import os\nimport sys\n", "def main():"]
LONG = " ".join(["the scheduler splits a long prompt into chunks of prefill"] * 6)
PREFIX = " ".join(["shared context that every request repeats before its question"] * 4)
SHARED = [f"{PREFIX} question {i}:" for i in range(3)]


def run(model_dir: str, backend: str, tp_size: int = 1) -> dict[str, Any]:
    sampling = {"temperature": 0, "max_new_tokens": NEW_TOKENS}
    engine = start_engine(
        model_dir,
        attention_backend=backend,
        chunked_prefill_size=CHUNK,
        disable_cuda_graph=True,
        tp_size=tp_size,
    )
    try:
        short = engine.generate(SHORT, sampling)
        long = engine.generate([LONG], sampling)
        shared = [engine.generate(prompt, sampling) for prompt in SHARED]
        tokens = engine.tokenizer_manager.tokenizer
        long_len = len(tokens(LONG)["input_ids"])
    finally:
        engine.shutdown()
    return {
        "short": [out["output_ids"] for out in short],
        "long": [out["output_ids"] for out in long],
        "long_prompt_tokens": long_len,
        "shared": [out["output_ids"] for out in shared],
        "shared_cached_tokens": [out["meta_info"].get("cached_tokens", 0) for out in shared],
    }


def main(argv: list[str]) -> int:
    tp_size = 1
    if "--tp" in argv:
        at = argv.index("--tp")
        tp_size = int(argv[at + 1])
        argv = argv[:at] + argv[at + 2 :]
    model_dir, backends = argv[0], argv[1:]
    runs = {b: run(model_dir, b, tp_size) for b in backends}
    result = {"pid": os.getpid(), "backends": runs}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
