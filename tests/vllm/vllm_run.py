"""Run vLLM's engine once, greedily, and print one JSON line (run as a subprocess by the tests).

``python vllm_run.py MODEL_DIR MAX_NEW_TOKENS PROMPT...`` prints
``{"pid": ..., "output_ids": [[...], ...]}``: this (the front-end) process's pid, so a test can
tell the engine's worker processes apart in the dispatch log, and exactly ``MAX_NEW_TOKENS``
greedy tokens per prompt (EOS suppressed before that, as ``hf_greedy`` does).
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    from vllm import LLM, SamplingParams

    model_dir, max_new_tokens, prompts = argv[0], int(argv[1]), argv[2:]
    llm = LLM(
        model=model_dir,
        dtype="float32",
        enforce_eager=True,
        max_model_len=512,
        seed=0,
    )
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, min_tokens=max_new_tokens)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    ids = [list(output.outputs[0].token_ids) for output in outputs]
    print(json.dumps({"pid": os.getpid(), "output_ids": ids}), flush=True)
    return 0


if __name__ == "__main__":  # vLLM spawns its engine process: the guard is required
    sys.exit(main(sys.argv[1:]))
