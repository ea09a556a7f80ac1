"""One SGLang engine on the real model, timed batch by batch on request (run by ``e2e.py``).

``python e2e_worker.py MODEL_DIR DTYPE [ATTENTION_BACKEND] [SERVER_ARGS_JSON]`` starts
``sglang.Engine`` (with that ``attention_backend``, if given, and the server arguments of the
JSON object, e.g. ``{"enable_torch_compile": true}`` or ``{"device": "cuda"}``; on the CPU by
default) and this process's environment (``SGLANG_FORCE_FUSED_OP_BACKEND``,
``SGLANG_FL_DISPATCH_LOG``), prints ``{"ready": true, "pid": ...}``, then answers one JSON
line per request read from stdin: ``{"input_ids": [[...], ...], "max_new_tokens": N}`` ->
``{"seconds": ..., "completion_tokens": ..., "prompt_tokens": ..., "output_ids": [[...],
...]}``, until stdin closes. Workers stay up side by side so that their batches can alternate
in one run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "sglang"))


def main(argv: list[str]) -> int:
    from engine_run import start_engine

    model_dir, dtype, *rest = argv
    server_args = json.loads(rest[1]) if len(rest) > 1 else {}
    if rest and rest[0]:
        server_args["attention_backend"] = rest[0]
    # The radix cache would let later repetitions skip prefill that earlier ones paid for.
    # (start_engine's idle engines sleep instead of polling: they do not slow the timed one.)
    engine = start_engine(model_dir, dtype, disable_radix_cache=True, **server_args)
    try:
        print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
        for line in sys.stdin:
            request = json.loads(line)
            sampling = {
                "temperature": 0,
                "max_new_tokens": request["max_new_tokens"],
                "ignore_eos": True,
            }
            began = time.perf_counter()
            outputs = engine.generate(input_ids=request["input_ids"], sampling_params=sampling)
            seconds = time.perf_counter() - began
            tokens = sum(out["meta_info"]["completion_tokens"] for out in outputs)
            prompt = sum(out["meta_info"]["prompt_tokens"] for out in outputs)
            answer = {
                "seconds": seconds,
                "completion_tokens": tokens,
                "prompt_tokens": prompt,
                "output_ids": [out["output_ids"] for out in outputs],
            }
            print(json.dumps(answer), flush=True)
    finally:
        engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
