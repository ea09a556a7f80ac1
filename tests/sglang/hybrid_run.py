"""One ``sglang.Engine`` on the CPU for a hybrid (linear-attention) model, requests in order.

``python hybrid_run.py MODEL_DIR MAX_NEW_TOKENS CHUNKED_PREFILL_SIZE PROMPT... [--dtype
bfloat16]`` sends each prompt as its own request, one after another (so a later prompt can
reuse an earlier one's cached prefix), and prints one JSON line last: ``{"pid": ...,
"output_ids": [[...], ...], "cached_tokens": [...], "logprobs": [[...], ...]}`` (the engine's
log-probability of each token it generated). A subprocess of its own, as ``engine_run.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from engine_run import DTYPES, start_engine


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("max_new_tokens", type=int)
    parser.add_argument("chunked_prefill", type=int)
    parser.add_argument("prompts", nargs="+")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    args = parser.parse_args(argv)
    sampling = {"temperature": 0, "max_new_tokens": args.max_new_tokens}
    engine = start_engine(args.model, args.dtype, chunked_prefill_size=args.chunked_prefill)
    try:
        outputs = [
            engine.generate(prompt, sampling, return_logprob=True) for prompt in args.prompts
        ]
    finally:
        engine.shutdown()
    result = {
        "pid": os.getpid(),
        "output_ids": [out["output_ids"] for out in outputs],
        "cached_tokens": [out["meta_info"].get("cached_tokens", 0) for out in outputs],
        "logprobs": [
            [entry[0] for entry in out["meta_info"]["output_token_logprobs"]] for out in outputs
        ],
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
