"""The main job: SGLang generating on the CPU through sglang-fl, then the dispatch report.

Builds a tiny Llama offline (byte-level BPE tokenizer trained on the standard library, random
seeded weights; reused on later runs), starts ``sglang.Engine(device="cpu")`` with sglang-fl
installed (its platform entry point supplies the CPU platform, its plugin entry point routes
SiluAndMul, RMSNorm and RotaryEmbedding), generates greedily, and prints which implementation
ran each SGLang layer class in each SGLang process. Run by ``bash scripts/demo.sh`` (nox
session ``demo``), which provides an environment with SGLang and the sglang-fl wheel.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "sglang"))  # the tiny-model builder and engine runner

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n", "class Config:"]


def report_rows(records: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row per (process, layer class) from the dispatch log's ``layer`` records."""
    rows = []
    for r in records:
        if r["event"] != "layer":
            continue
        process = f"{r.get('proctitle') or r['process']} (pid {r['pid']})"
        layer = r["layer"].rsplit(".", 1)[-1]
        if r["runner"] == "sglang-fl":
            runner = f"sglang-fl  {r['impl_id']}"
            source = f"{r['kind']}, {r['distribution']} {r['version']}"
        else:
            runner = f"SGLang     {r['sglang_forward']}"
            source = r.get("reason", "")
        rows.append((process, layer, runner, source))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=ROOT / ".cache" / "demo")
    parser.add_argument("--arch", choices=["llama", "qwen2"], default="llama")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args(argv)

    log = args.workdir / "dispatch.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    # Before SGLang starts: every process it spawns inherits this and appends its records.
    os.environ["SGLANG_FL_DISPATCH_LOG"] = str(log)

    from engine_run import generate
    from tiny_models import build_tiny_model

    from sglang_fl.cli import format_table
    from sglang_fl.integrations.sglang.report import read_log

    print(f"== building (or reusing) a tiny {args.arch} model offline", flush=True)
    model = build_tiny_model(args.workdir / f"tiny-{args.arch}", args.arch)
    print(f"   {model}")
    print("== starting SGLang on the CPU through sglang-fl and generating greedily", flush=True)
    result = generate(str(model), PROMPTS, args.max_new_tokens)
    for prompt, text, ids in zip(PROMPTS, result["texts"], result["output_ids"], strict=True):
        print(f"   {prompt!r} -> {text!r}\n      token ids {ids}")

    records = read_log(log)
    pids = sorted({r["pid"] for r in records if r["event"] == "plugin"})
    print(f"\n== dispatch report ({log}; sglang-fl loaded in processes {pids})")
    rows = report_rows(records)
    if not rows:
        print("no SGLang layer was resolved: is sglang-fl installed in this environment?")
        return 1
    print(format_table(rows, ("process", "layer", "runs", "provenance / reason")))
    routed = {r["op"] for r in records if r["event"] == "layer" and r["runner"] == "sglang-fl"}
    missing = {"silu_and_mul", "rms_norm", "rotary_embedding"} - routed
    if missing:
        print(f"\nnot routed through sglang-fl: {', '.join(sorted(missing))}")
        return 1
    print("\nSGLang generated on the CPU with every standard op running through sglang-fl.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
