"""Decode with SGLang's CPU graph runner (``--enable-torch-compile``) vs eagerly, through sglang-fl.

``python benchmarks/graphs.py [--reps R] [--batches 1 2 4 8] [--quick]`` starts three engine
workers (``e2e_worker.py``) on SmolLM2-135M-Instruct in bfloat16, side by side:

- ``compiled``: sglang-fl's CPU platform, ``--attention-backend sglang_fl``, every fused op
  routed, ``--enable-torch-compile`` (one compiled decode step per batch size below);
- ``eager``: the same without ``--enable-torch-compile``;
- ``sglang``: SGLang's own paths on this CPU: ``torch_native`` attention and ``forward_native``
  layers (``SGLANG_FORCE_FUSED_OP_BACKEND=torch``), eager (SGLang's own compiled CPU path needs
  ``sgl_kernel``'s CPU build, which is not installable here).

For each batch size, each repetition times in every worker, in alternating order, one-token
and ``new_tokens`` generations of the same chat prompts; decode tokens/s is
``batch * (new_tokens - 1) / (t_full - t_first)``. It prints a table of medians and the ratios
compiled/eager (target >= 1.0) and compiled/sglang, and the compiled worker's capture record
(graph breaks and recompiles, whose). Every worker's dispatch log is checked: the compiled and
eager ones must have served attention and the fused ops through sglang-fl, SGLang's none, and
the compiled one must report its graph runner.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from e2e import QUESTIONS as E2E_QUESTIONS
from e2e import Worker

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "sglang"))

from real_model import MODEL_NAME, chat_input_ids, prepare  # noqa: E402

from sglang_fl.dispatch_report import read_log  # noqa: E402

TARGET = 1.0  # compiled decode tokens/s over eager's, medians
# e2e's chat prompts, and four more for batches up to 8.
QUESTIONS = [
    *E2E_QUESTIONS,
    "What does a compiler do?",
    "Give a synonym of quick.",
    "Why is the sky blue?",
    "Name a prime number above ten.",
]
COMPILED_START_TIMEOUT_S = 3600  # one compiled step per batch size, on two busy cores
ROUTED = {"store_kv_cache", "decode_attention", "rms_norm", "silu_and_mul", "rotary_embedding"}


def variants(batches: list[int]) -> dict[str, dict[str, Any]]:
    """Worker name -> its environment and server arguments."""
    routed = {"attention_backend": "sglang_fl"}
    return {
        "compiled": {
            "env": {},
            "args": {
                **routed,
                "enable_torch_compile": True,
                "cuda_graph_bs_decode": batches,
                "torch_compile_max_bs": max(batches),
            },
        },
        "eager": {"env": {}, "args": routed},
        "sglang": {
            "env": {"SGLANG_FORCE_FUSED_OP_BACKEND": "torch"},
            "args": {"attention_backend": "torch_native"},
        },
    }


def _served(log: Path) -> set[str]:
    return {
        r["op"]
        for r in read_log(log)
        if r["event"] == "layer" and r.get("runner") == "sglang-fl" and r.get("op")
    }


def run(batches: list[int], repetitions: int, new_tokens: int) -> dict[str, Any]:
    model = prepare(progress=lambda message: print(f"  {message}", flush=True))
    workdir = Path(tempfile.mkdtemp(prefix="sglang-fl-graphs-"))
    workers: dict[str, Worker] = {}
    samples: dict[int, dict[str, list[float]]] = {b: {} for b in batches}
    same_answers: dict[int, bool] = {}
    try:
        for name, variant in variants(batches).items():
            began = time.monotonic()
            workers[name] = Worker(
                name,
                model,
                "bfloat16",
                variant["env"],
                workdir / f"{name}.jsonl",
                server_args=variant["args"],
                start_timeout_s=COMPILED_START_TIMEOUT_S,
            )
            print(f"  {name} engine up in {time.monotonic() - began:.0f} s", flush=True)
        order = list(workers)
        for batch in batches:
            input_ids = chat_input_ids(model, QUESTIONS[:batch])
            for worker in workers.values():  # warm-up
                worker.time_batch(input_ids, new_tokens)
            rates: dict[str, list[float]] = {name: [] for name in workers}
            answers: dict[str, Any] = {}
            for repetition in range(repetitions):
                for name in order if repetition % 2 == 0 else order[::-1]:
                    first = workers[name].time_batch(input_ids, 1)
                    full = workers[name].time_batch(input_ids, new_tokens)
                    decoded = full["completion_tokens"] - first["completion_tokens"]
                    rates[name].append(decoded / (full["seconds"] - first["seconds"]))
                    answers[name] = full["output_ids"]
            samples[batch] = rates
            same_answers[batch] = answers["compiled"] == answers["eager"]
            line = ", ".join(f"{n} {statistics.median(r):.1f}" for n, r in rates.items())
            print(f"  batch {batch}: decode tokens/s {line}", flush=True)
        logs = {name: read_log(worker.log) for name, worker in workers.items()}
        served = {name: sorted(_served(worker.log)) for name, worker in workers.items()}
    finally:
        for worker in workers.values():
            worker.close()
    if not set(served["compiled"]) >= ROUTED or not set(served["eager"]) >= ROUTED:
        raise RuntimeError(f"the sglang-fl workers did not route what they claim: {served}")
    if served["sglang"]:
        raise RuntimeError(f"SGLang's own worker ran sglang-fl kernels: {served['sglang']}")
    captures = [r for r in logs["compiled"] if r["event"] == "graph_capture"]
    if not captures:
        raise RuntimeError("the compiled worker reported no graph capture")
    replays = [r for r in logs["compiled"] if r["event"] == "graph_replay"]
    medians = {
        b: {n: statistics.median(r) for n, r in rates.items()} for b, rates in samples.items()
    }
    ratios = {
        b: {
            "compiled/eager": m["compiled"] / m["eager"],
            "compiled/sglang": m["compiled"] / m["sglang"],
            "eager/sglang": m["eager"] / m["sglang"],
        }
        for b, m in medians.items()
    }
    return {
        "model": MODEL_NAME,
        "dtype": "bfloat16",
        "batches": batches,
        "new_tokens": new_tokens,
        "repetitions": repetitions,
        "samples_tokens_per_s": {str(b): s for b, s in samples.items()},
        "medians": {str(b): m for b, m in medians.items()},
        "ratios": {str(b): r for b, r in ratios.items()},
        "target": TARGET,
        "met": all(r["compiled/eager"] >= TARGET for r in ratios.values()),
        "compiled_answers_are_eagers": {str(b): same for b, same in same_answers.items()},
        "capture": captures[0],
        "replay_recompiles": replays,
        "served": served,
    }


def render(result: dict[str, Any]) -> str:
    rows = [
        f"| {b} | {result['medians'][str(b)]['compiled']:.1f} | "
        f"{result['medians'][str(b)]['eager']:.1f} | {result['medians'][str(b)]['sglang']:.1f} | "
        f"{result['ratios'][str(b)]['compiled/eager']:.2f}x | "
        f"{result['ratios'][str(b)]['compiled/sglang']:.2f}x |"
        for b in result["batches"]
    ]
    capture = result["capture"]
    breaks = capture.get("graph_breaks", [])
    owners: dict[str, int] = {}
    for item in breaks:
        owners[item["owner"]] = owners.get(item["owner"], 0) + 1
    lines = [
        f"{result['model']} {result['dtype']}, {result['new_tokens']} new tokens, "
        f"{result['repetitions']} interleaved repetitions (medians); target compiled/eager "
        f">= {result['target']}x: {'met' if result['met'] else 'NOT met'}",
        "",
        "| batch | compiled (sglang-fl) | eager (sglang-fl) | SGLang's own (eager) | "
        "compiled/eager | compiled/SGLang |",
        "|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"capture: {len(capture.get('capture_bs', []))} batch sizes in {capture.get('seconds')} s, "
        f"{capture.get('graphs')} graphs, {len(breaks)} graph breaks "
        f"({', '.join(f'{o}: {n}' for o, n in sorted(owners.items())) or 'none'}), "
        f"{len(capture.get('recompiles', []))} recompiles; "
        f"{len(result['replay_recompiles'])} recompiles at replay",
        f"inside the compiled steps: custom ops {sorted(capture.get('custom_ops', {}))}, "
        f"traced {capture.get('traced_ops', [])}; compiled answers equal eager's (batch: "
        + ", ".join(f"{b}: {same}" for b, same in result["compiled_answers_are_eagers"].items())
        + ")",
    ]
    lines += [f"  break at {b['location']} ({b['owner']}): {b['reason']}" for b in breaks]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="batches 1 and 4, 3 repetitions")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    batches, reps = ([1, 4], 3) if args.quick else (sorted(set(args.batches)), args.reps)
    if not all(1 <= b <= len(QUESTIONS) for b in batches):
        parser.error(f"batch sizes must be between 1 and {len(QUESTIONS)}")
    result = run(batches, reps, args.new_tokens)
    print(render(result), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
