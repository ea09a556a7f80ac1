"""End-to-end decode throughput on a real model: sglang-fl routing vs SGLang's forward_native.

Two engine workers (``e2e_worker.py``) on SmolLM2-135M-Instruct with the same settings run side
by side: one routes the standard layers through sglang-fl, the other is forced onto SGLang's
``forward_native`` (``SGLANG_FORCE_FUSED_OP_BACKEND=torch``). Each repetition times, in each
worker, in alternating order, the same batch of chat prompts twice: generating one token
(prefill) and ``new_tokens`` tokens with ``ignore_eos``; decode tokens per second is
``batch * (new_tokens - 1) / (t_full - t_prefill)``. Each worker's dispatch log is checked so
that the figures are known to compare what they claim to.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "sglang"))
sys.path.insert(0, str(HERE.parent / "tests" / "support"))  # sglang_processes' installed_dists

from real_model import MODEL_NAME, chat_input_ids, prepare  # noqa: E402
from sglang_processes import clean_env  # noqa: E402

from sglang_fl.dispatch_report import read_log  # noqa: E402

TARGET_RATIO = 0.98  # routed decode tokens/s over forward_native's, medians
QUESTIONS = [
    "What is the capital of France?",
    "Name the three primary colors.",
    "Write one sentence about the sea.",
    "How many legs does a spider have?",
]
STANDARD_OPS = {"silu_and_mul", "rms_norm", "rotary_embedding"}
WORKER_START_TIMEOUT_S = 600
BATCH_TIMEOUT_S = 600
VARIANTS = {
    "sglang-fl": {},
    "forward_native": {"SGLANG_FORCE_FUSED_OP_BACKEND": "torch"},
}


class Worker:
    """An ``e2e_worker.py`` subprocess: one engine, timed batches over stdin/stdout."""

    def __init__(
        self,
        name: str,
        model: Path,
        dtype: str,
        extra_env: dict[str, str],
        log: Path,
        attention_backend: str | None = None,
        server_args: dict[str, Any] | None = None,
        start_timeout_s: float = WORKER_START_TIMEOUT_S,
    ):
        env = clean_env(**extra_env, SGLANG_FL_DISPATCH_LOG=str(log))
        self.name, self.log = name, log
        extra = [attention_backend or ""] if attention_backend or server_args else []
        if server_args:
            extra.append(json.dumps(server_args))
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "e2e_worker.py"), str(model), dtype, *extra],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = self._read(start_timeout_s)["pid"]

    def _read(self, timeout_s: float) -> dict[str, Any]:
        """The worker's next JSON line; the worker is killed if it takes longer than allowed."""
        stdout: IO[str] = self.proc.stdout  # type: ignore[assignment]
        timer = _Deadline(self.proc, timeout_s)
        try:
            line = stdout.readline()
        finally:
            timer.cancel()
        if not line:
            raise RuntimeError(
                f"the {self.name} worker exited ({self.proc.poll()}) without answering; "
                "its error is above"
            )
        return json.loads(line)

    def time_batch(self, input_ids: list[list[int]], max_new_tokens: int) -> dict[str, Any]:
        stdin: IO[str] = self.proc.stdin  # type: ignore[assignment]
        stdin.write(json.dumps({"input_ids": input_ids, "max_new_tokens": max_new_tokens}) + "\n")
        stdin.flush()
        return self._read(BATCH_TIMEOUT_S)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def routed_ops(self) -> set[str]:
        """Ops whose SGLang layers this worker's processes ran through sglang-fl."""
        return {
            r["op"]
            for r in read_log(self.log)
            if r["event"] == "layer" and r["runner"] == "sglang-fl"
        }


class _Deadline:
    """Kills ``proc`` unless cancelled within ``timeout_s`` (a blocking read cannot time out)."""

    def __init__(self, proc: subprocess.Popen[str], timeout_s: float) -> None:
        self._timer = threading.Timer(timeout_s, proc.kill)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def run(
    dtype: str = "bfloat16",
    repetitions: int = 5,
    new_tokens: int = 32,
    batch: int = len(QUESTIONS),
) -> dict[str, Any]:
    """Measure both variants side by side; every sample and the summary."""
    if not 1 <= batch <= len(QUESTIONS):
        raise ValueError(f"batch must be between 1 and {len(QUESTIONS)}, got {batch}")
    if new_tokens < 2:
        raise ValueError(f"new_tokens must be at least 2 (one prefill token), got {new_tokens}")
    model = prepare(progress=lambda message: print(f"  {message}", flush=True))
    input_ids = chat_input_ids(model, QUESTIONS[:batch])
    workdir = Path(tempfile.mkdtemp(prefix="sglang-fl-e2e-"))
    workers: dict[str, Worker] = {}
    try:
        for name, env in VARIANTS.items():
            began = time.monotonic()
            workers[name] = Worker(name, model, dtype, env, workdir / f"{name}.jsonl")
            print(f"  {name} engine up in {time.monotonic() - began:.0f} s", flush=True)
        for worker in workers.values():  # warm-up: first batches allocate and compile
            worker.time_batch(input_ids, new_tokens)
        samples: dict[str, list[float]] = {name: [] for name in workers}
        order = list(workers)
        for repetition in range(repetitions):
            for name in order if repetition % 2 == 0 else order[::-1]:
                prefill = workers[name].time_batch(input_ids, 1)
                full = workers[name].time_batch(input_ids, new_tokens)
                decoded = full["completion_tokens"] - prefill["completion_tokens"]
                rate = decoded / (full["seconds"] - prefill["seconds"])
                samples[name].append(rate)
                print(f"  repetition {repetition + 1}: {name} {rate:.1f} tokens/s", flush=True)
        routed = {name: sorted(worker.routed_ops()) for name, worker in workers.items()}
    finally:
        for worker in workers.values():
            worker.close()
    for log in workdir.glob("*.jsonl"):
        log.unlink()
    workdir.rmdir()
    if set(routed["sglang-fl"]) != STANDARD_OPS or routed["forward_native"]:
        raise RuntimeError(f"the variants did not run what they claim; routed ops: {routed}")
    fl, native = samples["sglang-fl"], samples["forward_native"]
    paired = [a / b for a, b in zip(fl, native, strict=True)]
    ratio = statistics.median(fl) / statistics.median(native)
    return {
        "model": MODEL_NAME,
        "dtype": dtype,
        "batch": batch,
        "new_tokens": new_tokens,
        "prompt_tokens": [len(ids) for ids in input_ids],
        "repetitions": repetitions,
        "samples_tokens_per_s": samples,
        "tokens_per_s": {name: _spread(values) for name, values in samples.items()},
        "paired_ratios": _spread(paired),
        "ratio": ratio,
        "target": TARGET_RATIO,
        "met": ratio >= TARGET_RATIO,
        "routed_ops": routed,
    }


ATTENTION_BACKENDS = ("sglang_fl", "torch_native")
ATTENTION_TARGET = 1.0  # sglang_fl (reference kernels) tokens/s over torch_native's, medians
ATTENTION_OPS = {"store_kv_cache", "decode_attention", "extend_attention"}


def run_attention(
    dtype: str = "bfloat16",
    repetitions: int = 5,
    new_tokens: int = 32,
    batch: int = len(QUESTIONS),
) -> dict[str, Any]:
    """The real model with ``--attention-backend sglang_fl`` and ``torch_native`` side by side.

    Both workers route the other layers through sglang-fl alike; only the attention backend
    differs. Per repetition, in alternating order: prefill tokens/s is the batch's prompt
    tokens over the one-token batch's time, decode tokens/s as in :func:`run`. The sglang_fl
    worker's dispatch log must name the three attention ops; torch_native's none.
    """
    model = prepare(progress=lambda message: print(f"  {message}", flush=True))
    input_ids = chat_input_ids(model, QUESTIONS[:batch])
    workdir = Path(tempfile.mkdtemp(prefix="sglang-fl-e2e-attention-"))
    workers: dict[str, Worker] = {}
    decode: dict[str, list[float]] = {name: [] for name in ATTENTION_BACKENDS}
    prefill: dict[str, list[float]] = {name: [] for name in ATTENTION_BACKENDS}
    try:
        for name in ATTENTION_BACKENDS:
            began = time.monotonic()
            workers[name] = Worker(name, model, dtype, {}, workdir / f"{name}.jsonl", name)
            print(f"  {name} engine up in {time.monotonic() - began:.0f} s", flush=True)
        for worker in workers.values():
            worker.time_batch(input_ids, new_tokens)
        for repetition in range(repetitions):
            order = ATTENTION_BACKENDS if repetition % 2 == 0 else ATTENTION_BACKENDS[::-1]
            for name in order:
                first = workers[name].time_batch(input_ids, 1)
                full = workers[name].time_batch(input_ids, new_tokens)
                decoded = full["completion_tokens"] - first["completion_tokens"]
                decode[name].append(decoded / (full["seconds"] - first["seconds"]))
                prefill[name].append(first["prompt_tokens"] / first["seconds"])
                print(
                    f"  repetition {repetition + 1}: {name} decode {decode[name][-1]:.1f}, "
                    f"prefill {prefill[name][-1]:.1f} tokens/s",
                    flush=True,
                )
        served = {
            name: sorted(
                {
                    r["op"]
                    for r in read_log(worker.log)
                    if r["event"] == "layer" and r.get("attention_backend") == "sglang_fl"
                }
            )
            for name, worker in workers.items()
        }
    finally:
        for worker in workers.values():
            worker.close()
    for log in workdir.glob("*.jsonl"):
        log.unlink()
    workdir.rmdir()
    if set(served["sglang_fl"]) != ATTENTION_OPS or served["torch_native"]:
        raise RuntimeError(f"the backends did not run what they claim; attention ops: {served}")
    ratios = {
        what: statistics.median(samples["sglang_fl"]) / statistics.median(samples["torch_native"])
        for what, samples in (("decode", decode), ("prefill", prefill))
    }
    return {
        "model": MODEL_NAME,
        "dtype": dtype,
        "batch": batch,
        "new_tokens": new_tokens,
        "prompt_tokens": [len(ids) for ids in input_ids],
        "repetitions": repetitions,
        "decode_tokens_per_s": {name: _spread(v) for name, v in decode.items()},
        "prefill_tokens_per_s": {name: _spread(v) for name, v in prefill.items()},
        "samples": {"decode": decode, "prefill": prefill},
        "ratios": ratios,
        "target": ATTENTION_TARGET,
        "met": all(ratio >= ATTENTION_TARGET for ratio in ratios.values()),
        "attention_ops": served,
    }
