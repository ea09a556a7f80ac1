"""A tiny model's decode captured into CUDA graphs through the ``sglang_fl`` backend, on a GPU.

Run where SGLang (with ``sgl_kernel``), sglang-fl and the CUDA vendor wheel are installed, on
a GPU FlashAttention-3 runs on (sm80/86/89/90)::

    python scripts/cuda_graph_decode.py [--batches 1 2 4 8] [--reps 5] [--json OUT]

Three engine workers (``benchmarks/e2e_worker.py``) serve a tiny Llama (built offline by
``tests/sglang/tiny_models.py``, run in bfloat16) on ``cuda``, one after another:

- ``graphs``: ``--attention-backend sglang_fl``, SGLang's CUDA graph runner capturing the
  decode step for each batch size (the backend's plans allocated once, rewritten in place
  before every replay), the attention ops on the CUDA wheel's FA3 adapters;
- ``eager``: the same with ``--disable-cuda-graph``;
- ``fa3``: SGLang's own ``fa3`` backend, CUDA graphs on.

For each batch size: the greedy tokens of ``graphs`` must equal ``eager``'s (and are compared
with ``fa3``'s, reported), and decode tokens/s is measured as in ``benchmarks/e2e.py``
(``batch * (new_tokens - 1) / (t_full - t_first)``, medians of interleaved repetitions). The
dispatch logs must show the FA3 adapters serving ``decode_attention`` in both sglang_fl
workers and the ``graphs`` worker's backend allocating its plans for CUDA graphs (a
``graph_state`` record, mode ``captured``). Exit status: 0 all checks passed, 1 a check
failed, 2 no CUDA device.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "sglang"))

PROMPTS = [
    "def main():",
    "import os\nimport sys",
    "class Config:",
    "for i in range(",
    "return self.",
    "with open(",
    "if __name__ ==",
    "print(",
]
FA3_IMPL = "vendor.cuda"
VARIANTS: dict[str, dict[str, Any]] = {
    "graphs": {"attention_backend": "sglang_fl"},
    "eager": {"attention_backend": "sglang_fl", "disable_cuda_graph": True},
    "fa3": {"attention_backend": "fa3"},
}


def checks(result: dict[str, Any]) -> list[str]:
    """What failed in ``result`` (empty: every check passed)."""
    failed = []
    for batch, tokens in result["tokens"].items():
        if tokens["graphs"] != tokens["eager"]:
            failed.append(f"batch {batch}: the CUDA graph replay's tokens differ from eager's")
    for name in ("graphs", "eager"):
        served = result["decode_attention"].get(name)
        if served != FA3_IMPL:
            failed.append(f"{name}: decode_attention served by {served}, not {FA3_IMPL} (FA3)")
    modes = [c.get("mode") for c in result["graph_states"]]
    if "captured" not in modes:
        failed.append(f"the graphs worker's backend allocated no CUDA graph plans: {modes}")
    return failed


def render(result: dict[str, Any]) -> str:
    rows = []
    for batch in result["batches"]:
        m = result["medians"][str(batch)]
        same = result["tokens"][str(batch)]
        rows.append(
            f"| {batch} | {m['graphs']:.1f} | {m['eager']:.1f} | {m['fa3']:.1f} | "
            f"{m['graphs'] / m['eager']:.2f}x | {m['graphs'] / m['fa3']:.2f}x | "
            f"{'yes' if same['graphs'] == same['eager'] else 'NO'} | "
            f"{'yes' if same['graphs'] == same['fa3'] else 'no'} |"
        )
    failed = checks(result)
    return "\n".join(
        [
            f"tiny Llama bfloat16 on {result['gpu']}, {result['new_tokens']} new tokens, "
            f"{result['repetitions']} repetitions (medians of decode tokens/s)",
            "",
            "| batch | sglang_fl + graphs | sglang_fl eager | SGLang fa3 + graphs | "
            "graphs/eager | sglang_fl/fa3 | tokens = eager | tokens = fa3 |",
            "|---:|---:|---:|---:|---:|---:|:-:|:-:|",
            *rows,
            "",
            "all checks passed" if not failed else "FAILED:\n  " + "\n  ".join(failed),
        ]
    )


def run(batches: list[int], repetitions: int, new_tokens: int) -> dict[str, Any]:
    import torch
    from e2e import Worker
    from tiny_models import build_tiny_model

    from sglang_fl.dispatch_report import read_log

    workdir = Path(tempfile.mkdtemp(prefix="sglang-fl-cuda-graphs-"))
    model = build_tiny_model(workdir / "llama", "llama")
    tokens: dict[str, dict[str, Any]] = {str(b): {} for b in batches}
    rates: dict[str, dict[str, list[float]]] = {str(b): {} for b in batches}
    logs: dict[str, list[dict[str, Any]]] = {}
    for name, args in VARIANTS.items():  # one engine on the GPU at a time
        log = workdir / f"{name}.jsonl"
        server_args = {**args, "device": "cuda", "cuda_graph_bs_decode": batches}
        began = time.monotonic()
        worker = Worker(name, model, "bfloat16", {}, log, server_args=server_args)
        print(f"  {name} engine up in {time.monotonic() - began:.0f} s", flush=True)
        try:
            for batch in batches:
                ids = [worker_ids(model, prompt) for prompt in PROMPTS[:batch]]
                warm = worker.time_batch(ids, new_tokens)
                tokens[str(batch)][name] = warm["output_ids"]
                samples = []
                for _ in range(repetitions):
                    first = worker.time_batch(ids, 1)
                    full = worker.time_batch(ids, new_tokens)
                    decoded = full["completion_tokens"] - first["completion_tokens"]
                    samples.append(decoded / (full["seconds"] - first["seconds"]))
                rates[str(batch)][name] = samples
                print(f"  {name} batch {batch}: {statistics.median(samples):.1f} tokens/s")
        finally:
            worker.close()
        logs[name] = read_log(log) if log.exists() else []
    decode_served = {
        name: next(
            (
                r.get("impl_id")
                for r in rows
                if r["event"] == "layer" and r.get("op") == "decode_attention"
            ),
            None,
        )
        for name, rows in logs.items()
    }
    return {
        "gpu": torch.cuda.get_device_name(0),
        "batches": batches,
        "new_tokens": new_tokens,
        "repetitions": repetitions,
        "tokens": tokens,
        "samples_tokens_per_s": rates,
        "medians": {b: {n: statistics.median(s) for n, s in r.items()} for b, r in rates.items()},
        "decode_attention": decode_served,
        "graph_states": [r for r in logs["graphs"] if r["event"] == "graph_state"],
    }


_tokenizers: dict[Path, Any] = {}


def worker_ids(model: Path, prompt: str) -> list[int]:
    """``prompt``'s token ids by the model's own tokenizer."""
    from transformers import AutoTokenizer

    if model not in _tokenizers:
        _tokenizers[model] = AutoTokenizer.from_pretrained(model)
    ids: list[int] = _tokenizers[model](prompt)["input_ids"]
    return ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: this check runs on a GPU", file=sys.stderr)
        return 2
    if not all(1 <= b <= len(PROMPTS) for b in args.batches):
        parser.error(f"batch sizes must be between 1 and {len(PROMPTS)}")
    result = run(sorted(set(args.batches)), args.reps, args.new_tokens)
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 1 if checks(result) else 0


if __name__ == "__main__":
    sys.exit(main())
