"""Attention backends side by side: ``sglang_fl`` (reference kernels) vs SGLang's ``torch_native``.

``python benchmarks/attention.py [--layers N] [--reps R]`` builds SGLang's real KV pools
(``MHATokenToKVPool``, ``ReqToTokenPool``) and ``RadixAttention`` layers in this process and
times one forward's attention (every layer: store the new K/V, attend) through each backend's
``init_forward_metadata`` and ``forward_decode``/``forward_extend``, interleaved, medians:

- decode: a batch of requests with different context lengths, one new token each;
- prefill: a batch of prompts, one with a cached prefix (radix hit), chunk-sized extends.

It prints tokens/s of each backend and the ratio (target: sglang_fl / torch_native >= 1.0),
and the sglang_fl backend's own bookkeeping, measured separately: ``init_forward_metadata``
in µs per forward, and per layer the µs a call through the backend costs beyond calling the
bound kernels directly with the same tensors. Times are this thread's CPU time
(``time.thread_time``, torch on one thread by default), so other processes on a shared machine
do not count. Needs SGLang (the ``sglang`` nox venv).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64  # SmolLM2-135M's attention
DTYPE = torch.float32
MAX_CONTEXT = 2048
DECODE_LENS = [37, 120, 255, 511, 64, 300, 180, 90]
# (prefix, extend) per request: prefills, a radix hit, a later chunk of a long prompt.
PREFILL = [(0, 128), (0, 96), (192, 64), (256, 128)]


def _pools(layers: int, tokens: int) -> tuple[Any, Any]:
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

    kv = MHATokenToKVPool(
        size=tokens,
        page_size=1,
        dtype=DTYPE,
        head_num=KV_HEADS,
        head_dim=HEAD_DIM,
        layer_num=layers,
        device="cpu",
        enable_memory_saver=False,
        enable_alt_stream=False,
    )
    req = ReqToTokenPool(
        size=16, max_context_len=MAX_CONTEXT, device="cpu", enable_memory_saver=False
    )
    return kv, req


def _layers(count: int) -> list[Any]:
    from sglang.srt.layers.radix_attention import RadixAttention

    return [
        RadixAttention(HEADS, HEAD_DIM, HEAD_DIM**-0.5, KV_HEADS, layer_id=i) for i in range(count)
    ]


def _batch(req_pool: Any, seq_lens: list[int], prefixes: list[int], decode: bool) -> Any:
    """A forward batch: requests in rows 1.., slots laid out one request after another."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    rows = list(range(1, len(seq_lens) + 1))
    slot, new = 1, []
    for row, length, prefix in zip(rows, seq_lens, prefixes, strict=True):
        req_pool.req_to_token[row, :length] = torch.arange(slot, slot + length)
        new.append(torch.arange(slot + prefix, slot + length))
        slot += length
    extend = [length - prefix for length, prefix in zip(seq_lens, prefixes, strict=True)]
    return SimpleNamespace(
        forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND,
        req_pool_indices=torch.tensor(rows, dtype=torch.int64),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
        extend_prefix_lens=None if decode else torch.tensor(prefixes, dtype=torch.int32),
        extend_seq_lens=None if decode else torch.tensor(extend, dtype=torch.int32),
        out_cache_loc=torch.cat(new).to(torch.int64),
        encoder_lens=None,
    )


def _runner(kv: Any, req: Any) -> Any:
    return SimpleNamespace(device="cpu", req_to_token_pool=req, token_to_kv_pool=kv, page_size=1)


def _forward(backend: Any, layers: list[Any], batch: Any, qkv: list[tuple[Any, ...]]) -> None:
    backend.init_forward_metadata(batch)
    run = backend.forward_decode if batch.forward_mode.is_decode() else backend.forward_extend
    for layer, (q, k, v) in zip(layers, qkv, strict=True):
        run(q, k, v, layer, batch)


def _median_s(fn: Callable[[], None], reps: int) -> float:
    samples = []
    for _ in range(reps):
        began = time.thread_time()
        fn()
        samples.append(time.thread_time() - began)
    return statistics.median(samples)


def _side_by_side(fns: dict[str, Callable[[], None]], reps: int) -> dict[str, float]:
    """Median seconds of each fn, alternating their order every repetition, GC off."""
    for fn in fns.values():
        fn()  # warm-up: binding, first-call allocations
    samples: dict[str, list[float]] = {name: [] for name in fns}
    gc.disable()
    try:
        for rep in range(reps):
            names = list(fns) if rep % 2 == 0 else list(reversed(fns))
            for name in names:
                began = time.thread_time()
                fns[name]()
                samples[name].append(time.thread_time() - began)
    finally:
        gc.enable()
    return {name: statistics.median(values) for name, values in samples.items()}


def _case(
    case: str,
    decode: bool,
    reps: int,
    kv: Any,
    req: Any,
    layers: list[Any],
    backends: dict[str, Any],
) -> None:
    """Time one forward of ``case`` through both backends; print the rates and bookkeeping."""
    if decode:
        lens, prefixes = DECODE_LENS, [n - 1 for n in DECODE_LENS]
    else:
        lens = [p + e for p, e in PREFILL]
        prefixes = [p for p, _ in PREFILL]
    batch = _batch(req, lens, prefixes, decode)
    tokens = int(batch.out_cache_loc.shape[0])
    qkv = [
        (
            torch.randn(tokens, HEADS * HEAD_DIM),
            torch.randn(tokens, KV_HEADS, HEAD_DIM),  # RadixAttention.forward's views
            torch.randn(tokens, KV_HEADS, HEAD_DIM),
        )
        for _ in layers
    ]
    fns = {
        name: (lambda b=backend: _forward(b, layers, batch, qkv))
        for name, backend in backends.items()
    }
    seconds = _side_by_side(fns, reps)
    rates = {name: tokens / s for name, s in seconds.items()}
    ratio = rates["sglang_fl"] / rates["torch_native"]
    print(
        f"{case:<10}{tokens:>8}{rates['torch_native']:>21.1f}{rates['sglang_fl']:>18.1f}"
        f"{ratio:>8.2f}"
    )

    # Bookkeeping: metadata once per forward; per layer, the backend's own work around the
    # kernels, measured with the layer's bound kernels swapped for ones that do nothing.
    ours = backends["sglang_fl"]
    metadata_s = _median_s(lambda: ours.init_forward_metadata(batch), reps * 20)
    layer, (q, k, v) = layers[0], qkv[0]
    real = ours._kernels(layer)
    out = torch.empty(q.shape[0], HEADS, HEAD_DIM)

    def nothing(*args: Any) -> torch.Tensor:
        return out

    ours._layers[layer.layer_id] = dataclasses.replace(
        real, store=nothing, decode=nothing, extend=nothing
    )
    method = ours.forward_decode if decode else ours.forward_extend
    calls = 1000

    def backend_calls() -> None:
        for _ in range(calls):
            method(q, k, v, layer, batch)

    def stub_calls() -> None:
        for _ in range(calls):
            nothing(q, k, v)
            nothing(q, k, v, layer, batch)

    try:
        timed = _side_by_side({"backend": backend_calls, "stubs": stub_calls}, reps)
    finally:
        ours._layers[layer.layer_id] = real
    per_layer_us = (timed["backend"] - timed["stubs"]) / calls * 1e6
    kernel_us = seconds["sglang_fl"] / len(layers) * 1e6
    print(
        f"  sglang_fl bookkeeping ({case}): init_forward_metadata {metadata_s * 1e6:.1f} µs "
        f"per forward; {per_layer_us:.1f} µs per layer around the kernels "
        f"(a whole layer: {kernel_us:.0f} µs)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=30)  # SmolLM2-135M has 30
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    from sglang_fl.integrations.sglang import attention_backend

    torch.manual_seed(0)
    kv, req = _pools(args.layers, 8192)
    layers = _layers(args.layers)
    runner = _runner(kv, req)
    backends = {
        "torch_native": TorchNativeAttnBackend(runner),
        "sglang_fl": attention_backend.create_backend(runner),
    }
    print(f"{args.layers} layers, {HEADS}/{KV_HEADS} heads of {HEAD_DIM}, {DTYPE}, CPU")
    print(f"{'case':<10}{'tokens':>8}{'torch_native tok/s':>21}{'sglang_fl tok/s':>18}{'ratio':>8}")
    for case, decode in (("decode", True), ("prefill", False)):
        _case(case, decode, args.reps, kv, req, layers, backends)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
