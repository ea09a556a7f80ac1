"""Greedy generation with ``sglang.Engine`` on the CPU, in a process of its own.

``python engine_run.py MODEL_DIR MAX_NEW_TOKENS PROMPT... [--dtype bfloat16] [--chat]`` prints
one JSON line ``{"pid": ..., "output_ids": [[...], ...], "texts": [...]}`` last. With
``--chat`` each prompt is a user question sent through the model's chat template (as token
ids, which the result repeats as ``input_ids``): one engine by hand, in an environment of its
own. :func:`start_engine` (the CPU engine settings) is shared by the tests' engine worker
(``engine_worker.py``), the demo and the benchmarks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

# SGLang's default KV cache would reserve ~15 GB; these models need a few thousand tokens.
MAX_TOTAL_TOKENS = 4096
DTYPES = ("float32", "bfloat16")


def start_engine(
    model_dir: str, dtype: str = "float32", device: str = "cpu", **server_args: Any
) -> Any:
    """An ``sglang.Engine`` (on the CPU unless ``device`` says otherwise) with a small KV cache,
    quiet logs, and a scheduler that sleeps while idle."""
    import sglang

    # An idle scheduler otherwise polls its sockets in a busy loop (about 80% of a core measured
    # here): a shared test engine kept up between requests would take CPU from everything else.
    server_args.setdefault("sleep_on_idle", True)
    return sglang.Engine(
        model_path=model_dir,
        device=device,
        max_total_tokens=MAX_TOTAL_TOKENS,
        # SGLang's "auto" runs float32 checkpoints in float16; compare like with like.
        dtype=dtype,
        log_level=os.environ.get("ENGINE_LOG_LEVEL", "warning"),
        **server_args,
    )


def generate(
    model_dir: str,
    prompts: list[str],
    max_new_tokens: int,
    dtype: str = "float32",
    chat: bool = False,
) -> dict[str, Any]:
    """Start an engine on the CPU, generate greedily, shut it down."""
    sampling = {"temperature": 0, "max_new_tokens": max_new_tokens}
    input_ids = None
    if chat:
        from real_model import chat_input_ids

        input_ids = chat_input_ids(model_dir, prompts)
    engine = start_engine(model_dir, dtype)
    try:
        if input_ids is None:
            outputs = engine.generate(prompts, sampling)
        else:
            outputs = engine.generate(input_ids=input_ids, sampling_params=sampling)
    finally:
        engine.shutdown()
    result: dict[str, Any] = {
        "pid": os.getpid(),
        "output_ids": [out["output_ids"] for out in outputs],
        "texts": [out["text"] for out in outputs],
    }
    if input_ids is not None:
        result["input_ids"] = input_ids
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("max_new_tokens", type=int)
    parser.add_argument("prompts", nargs="+")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--chat", action="store_true", help="prompts are chat questions")
    args = parser.parse_args(argv)
    result = generate(args.model_dir, args.prompts, args.max_new_tokens, args.dtype, args.chat)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
