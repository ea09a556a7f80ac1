"""The quantized ops' references against a float layer of the same shape, side by side.

``python benchmarks/quantization.py [--quick]`` (the ``quantization`` part of ``nox -s bench``)
prints one table: for each reference quantized GEMM (``w8a8_int8_linear`` with both activation
rules, ``w8a8_fp8_linear``, ``w8a8_block_fp8_linear``, ``wna16_linear``) and the quantized
experts (``fused_moe_w8a8_int8``, ``fused_moe_w8a8_fp8`` with 128x128 blocks), at decode and
prefill batch sizes, its time over the float32 computation of the same shape (``F.linear`` of
the dequantized weight; ``fused_moe``'s reference for the experts), both measured in one
interleaved run (``timing.interleaved``). The target is <= 1.5x; the table says what limits a
row that misses it. Wall-clock medians, and the same ratio in thread CPU time (which leaves out
time other processes took on a shared machine).

Both sides run on one intra-op thread by default (``--threads``): on a shared machine each
parallel region waits for its other threads to be scheduled, which on 2 busy cores made small
element-wise ops (a 16-token activation quantization) a hundred times slower and the ratios
noise; ``--threads 0`` keeps torch's own count.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from timing import Call, cpu_ratio, interleaved, ratio

from sglang_fl.ops import get_contract
from sglang_fl.ops.quantization.linear import dequantize_wna16
from sglang_fl.ops.quantization.numerics import FP8_DTYPE, dequantize_block, pack_int32

TARGET = 1.5
K = N = 2048
EXPERTS, TOP_K, HIDDEN, INTER = 8, 2, 1024, 512
# Why a row may miss the target on a CPU: what the reference has to do per call that a float
# layer does not.
LIMITS = {
    "w8a8_int8_linear": "torch._int_mm has no matrix-vector path: a 1-token call costs what a "
    "64-token one does (float32 F.linear has a GEMV); plus quantizing x and the int32 epilogue",
    "fused_moe_w8a8_int8": "torch._int_mm per expert without a matrix-vector path, plus each "
    "expert's activation quantization",
    "w8a8_fp8_linear": "no float8 arithmetic on this CPU: the weight is converted per call",
    "w8a8_block_fp8_linear": "no float8 arithmetic: weight converted and block-scaled per call",
    "wna16_linear": "no 4-bit arithmetic: the weight is unpacked and dequantized per call",
    "fused_moe_w8a8_fp8": "no float8 arithmetic: each expert's weights converted per call",
}


def _linear_cases(tokens: int, g: torch.Generator) -> dict[str, tuple[Call, Call]]:
    """op label -> (the reference's call, the float call of the same shape)."""
    x = torch.randn(tokens, K, generator=g)
    int8 = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    scale = torch.rand(N, generator=g) / 1000
    fp8 = torch.randn(N, K, generator=g).mul(64).to(FP8_DTYPE)
    block_scale = torch.rand(N // 128, K // 128, generator=g) / 1000
    q4 = torch.randint(-8, 8, (N, K), generator=g, dtype=torch.int8)
    s4 = (torch.rand(N, K // 128, generator=g) / 100).to(torch.float32)
    packed = pack_int32(q4, 4)
    dense_int8 = int8.float() * scale[:, None]
    dense_fp8 = fp8.float() * scale[:, None]
    dense_block = dequantize_block(fp8, block_scale, (128, 128))
    dense_w4 = dequantize_wna16(packed, s4, None, 4, 128)

    def op(name: str) -> Any:
        return get_contract(name).reference

    ct = SimpleNamespace(act_quant="compressed-tensors")
    absmax = SimpleNamespace(act_quant="absmax")
    block = SimpleNamespace(act_quant="absmax", weight_block_size=(128, 128))
    w4 = SimpleNamespace(num_bits=4, group_size=128)
    return {
        "w8a8_int8_linear (compressed-tensors)": (
            Call(op("w8a8_int8_linear"), (ct, x, int8, scale)), Call(F.linear, (x, dense_int8))
        ),
        "w8a8_int8_linear (absmax)": (
            Call(op("w8a8_int8_linear"), (absmax, x, int8, scale)), Call(F.linear, (x, dense_int8))
        ),
        "w8a8_fp8_linear": (
            Call(op("w8a8_fp8_linear"), (ct, x, fp8, scale)), Call(F.linear, (x, dense_fp8))
        ),
        "w8a8_block_fp8_linear": (
            Call(op("w8a8_block_fp8_linear"), (block, x, fp8, block_scale)),
            Call(F.linear, (x, dense_block)),
        ),
        "wna16_linear": (
            Call(op("wna16_linear"), (w4, x, packed, s4)), Call(F.linear, (x, dense_w4))
        ),
    }  # fmt: skip


def _moe_cases(tokens: int, g: torch.Generator) -> dict[str, tuple[Call, Call]]:
    x = torch.randn(tokens, HIDDEN, generator=g)
    ids = torch.rand(tokens, EXPERTS, generator=g).argsort(dim=-1)[:, :TOP_K].to(torch.int32)
    weights = torch.rand(tokens, TOP_K, generator=g).softmax(dim=-1)
    w13 = torch.randint(-127, 128, (EXPERTS, 2 * INTER, HIDDEN), generator=g, dtype=torch.int8)
    w2 = torch.randint(-127, 128, (EXPERTS, HIDDEN, INTER), generator=g, dtype=torch.int8)
    s13, s2 = torch.rand(EXPERTS, 2 * INTER) / 3000, torch.rand(EXPERTS, HIDDEN) / 3000
    f13 = torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=g).mul(64).to(FP8_DTYPE)
    f2 = torch.randn(EXPERTS, HIDDEN, INTER, generator=g).mul(64).to(FP8_DTYPE)
    b13 = torch.rand(EXPERTS, 2 * INTER // 128, HIDDEN // 128) / 3000
    b2 = torch.rand(EXPERTS, HIDDEN // 128, INTER // 128) / 3000
    float_moe = get_contract("fused_moe").reference
    dense13 = w13.float() * s13[..., None]
    dense2 = w2.float() * s2[..., None]
    moe_float = Call(float_moe, (None, x, dense13, dense2, weights, ids))
    fp8_float = Call(
        float_moe,
        (None, x, dequantize_block(f13, b13, (128, 128)), dequantize_block(f2, b2, (128, 128)),
         weights, ids),
    )  # fmt: skip
    int8_obj = SimpleNamespace(act_quant="compressed-tensors")
    fp8_obj = SimpleNamespace(act_quant="absmax", weight_block_size=(128, 128))
    return {
        "fused_moe_w8a8_int8": (
            Call(get_contract("fused_moe_w8a8_int8").reference,
                 (int8_obj, x, w13, w2, s13, s2, weights, ids)),
            moe_float,
        ),
        "fused_moe_w8a8_fp8": (
            Call(get_contract("fused_moe_w8a8_fp8").reference,
                 (fp8_obj, x, f13, f2, b13, b2, weights, ids)),
            fp8_float,
        ),
    }  # fmt: skip


def measure(quick: bool) -> list[tuple[str, int, float, float]]:
    """``(op, tokens, wall ratio, cpu ratio)`` for every case."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    budget = 1_000_000_000 if quick else 4_000_000_000
    reps = 5 if quick else 15
    rows = []
    for tokens, build in (
        *((t, _linear_cases) for t in (1, 16, 256)),
        *((t, _moe_cases) for t in (1, 64)),
    ):
        for name, (quantized, dense) in build(tokens, g).items():
            samples = interleaved({"q": quantized, "f": dense}, repetitions=reps, budget_ns=budget)
            rows.append((name, tokens, ratio(samples, "q", "f"), cpu_ratio(samples, "q", "f")))
            print(f"  {name:<40} {tokens:>4} tokens  {rows[-1][2]:5.2f}x", flush=True)
    return rows


def table(rows: list[tuple[str, int, float, float]]) -> str:
    lines = [
        f"Reference quantized layers vs the float32 layer of the same shape (K = N = {K}; "
        f"experts {EXPERTS}, top-{TOP_K}, hidden {HIDDEN}, intermediate {INTER}; "
        f"{torch.get_num_threads()} intra-op thread(s)); target <= {TARGET}x",
        "",
        "| op | tokens | time ratio | CPU-time ratio | within target | what limits it |",
        "| --- | ---: | ---: | ---: | :---: | --- |",
    ]
    for name, tokens, wall, cpu in rows:
        ok = cpu <= TARGET
        limit = "" if ok else LIMITS.get(name.split(" ")[0], "")
        lines.append(
            f"| {name} | {tokens} | {wall:.2f}x | {cpu:.2f}x | {'yes' if ok else 'no'} | {limit} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)"
    )
    args = parser.parse_args(argv)
    if args.threads < 0:
        parser.error(f"--threads must be 0 (torch's default) or more, got {args.threads}")
    if args.threads:
        torch.set_num_threads(args.threads)
    print("quantized references vs float layers (side by side):", flush=True)
    print()
    print(table(measure(args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
