"""Greedy generation with ``sglang.Engine`` on the CPU over several ranks (TP or PP).

``python tp_engine_run.py MODEL_DIR MAX_NEW_TOKENS --tp N --pp M PROMPT...`` prints one JSON
line ``{"pid", "output_ids", "texts"}`` last, like ``engine_run.py`` (whose engine settings it
uses). Each rank is one SGLang scheduler process; give it its cores with
``SGLANG_CPU_OMP_THREADS_BIND`` (docs/running.md, "Several ranks on the CPU").
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from engine_run import start_engine


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("max_new_tokens", type=int)
    parser.add_argument("prompts", nargs="+")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    args = parser.parse_args(argv)
    engine = start_engine(args.model_dir, tp_size=args.tp, pp_size=args.pp)
    try:
        outputs = engine.generate(
            args.prompts, {"temperature": 0, "max_new_tokens": args.max_new_tokens}
        )
    finally:
        engine.shutdown()
    result = {
        "pid": os.getpid(),
        "output_ids": [out["output_ids"] for out in outputs],
        "texts": [out["text"] for out in outputs],
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
