"""One ``sglang.Engine`` on the CPU for a hybrid (linear-attention) model, requests in order.

``python hybrid_run.py MODEL_DIR MAX_NEW_TOKENS CHUNKED_PREFILL_SIZE PROMPT...`` sends each
prompt as its own request, one after another (so a later prompt can reuse an earlier one's
cached prefix), and prints one JSON line last: ``{"pid": ..., "output_ids": [[...], ...],
"cached_tokens": [...]}``. A subprocess of its own, as ``engine_run.py``.
"""

from __future__ import annotations

import json
import os
import sys

from engine_run import start_engine


def main(argv: list[str]) -> int:
    model, max_new_tokens, chunked_prefill, *prompts = argv
    sampling = {"temperature": 0, "max_new_tokens": int(max_new_tokens)}
    engine = start_engine(model, "float32", chunked_prefill_size=int(chunked_prefill))
    try:
        outputs = [engine.generate(prompt, sampling) for prompt in prompts]
    finally:
        engine.shutdown()
    result = {
        "pid": os.getpid(),
        "output_ids": [out["output_ids"] for out in outputs],
        "cached_tokens": [out["meta_info"].get("cached_tokens", 0) for out in outputs],
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
