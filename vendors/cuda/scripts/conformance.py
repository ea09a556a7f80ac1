#!/usr/bin/env python3
"""Hardware conformance of sglang-fl-cuda: each op vs the reference, timed vs SGLang's own.

Run it on a machine with an NVIDIA GPU, a CUDA build of torch, ``sgl_kernel``, and
``sglang-fl`` + ``sglang-fl-cuda`` installed (SGLang too, for the timing baseline)::

    python vendors/cuda/scripts/conformance.py [--op rms_norm] [--dtype bfloat16] [--repeat 100]

For every case and dtype of each op contract it runs the ``vendor.cuda`` implementation on the
GPU through core's conformance check (values within the dtype's tolerance, untouched inputs,
in-place outputs), prints the max absolute and relative error against the reference backend
on the same inputs, and the time per call of this backend divided by the time of SGLang's own
``forward_cuda`` on the same layer and tensors (``n/a`` without SGLang). Exit status: 0 when
every case passes or is declined (``Unsupported``), 1 when one fails, 2 when the backend is
unavailable here (the reason is printed).
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from sglang_fl_cuda import plugin
from sglang_fl_cuda.backend import SGL_KERNEL

from sglang_fl.dispatch.registry import OpRegistry
from sglang_fl.dispatch.types import OpImpl
from sglang_fl.ops import STANDARD_OPS, OpCase, OpContract, OpInputs
from sglang_fl.testing.checks import FAILED, PASSED, check_case

DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.float16, torch.bfloat16)}


@dataclass(frozen=True)
class Row:
    """One line of the report."""

    op: str
    dtype: str
    case: str
    status: str  # passed / failed / skipped (declined)
    max_abs: float | None
    max_rel: float | None
    time_ratio: float | None
    message: str = ""


def implementations() -> dict[str, OpImpl]:
    """The adapters exactly as the plugin registers them."""
    registry = OpRegistry()
    plugin.sglang_fl_register_ops(registry)
    return {op: impl for op in STANDARD_OPS for impl in registry.implementations(op)}


def make_inputs(contract: OpContract, case: OpCase, dtype: torch.dtype, device: str) -> OpInputs:
    seed = zlib.crc32(f"{contract.name}/{case.name}/{dtype}".encode())
    return contract.make_inputs(
        case, dtype, torch.device(device), torch.Generator().manual_seed(seed)
    )


def call(fn: Callable[..., Any], inputs: OpInputs) -> tuple[torch.Tensor, ...]:
    out = fn(inputs.obj, *inputs.args, **inputs.kwargs)
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def max_errors(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> tuple[float, float]:
    """Largest absolute and relative (to ``|want|``, where non-zero) error over all outputs."""
    worst_abs = worst_rel = 0.0
    for g, w in zip(got, want, strict=True):
        error = (g.double() - w.double()).abs()
        worst_abs = max(worst_abs, error.max().item())
        nonzero = w != 0
        if nonzero.any():
            worst_rel = max(worst_rel, (error[nonzero] / w.double()[nonzero].abs()).max().item())
    return worst_abs, worst_rel


def per_call_seconds(
    fn: Callable[[], object], repeat: int, synchronize: Callable[[], None]
) -> float:
    for _ in range(3):
        fn()
    synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    synchronize()
    return (time.perf_counter() - start) / repeat


def sglang_forward(op: str, inputs: OpInputs) -> Callable[[], object] | None:
    """SGLang's own ``forward_cuda`` on the case's tensors, or None without SGLang."""
    try:
        from sglang.srt.layers.activation import SiluAndMul
        from sglang.srt.layers.layernorm import RMSNorm
        from sglang.srt.layers.rotary_embedding import RotaryEmbedding
    except ImportError:
        return None
    obj, args, kwargs = inputs.obj, inputs.args, inputs.kwargs
    if op == "silu_and_mul":
        layer = SiluAndMul()
        return lambda: layer.forward_cuda(args[0])
    if op == "rms_norm":
        norm = RMSNorm(obj.hidden_size, eps=obj.variance_epsilon).to(args[0].device)
        norm.weight.data = obj.weight
        return lambda: norm.forward_cuda(*args)
    query, key, _, _, positions = args
    rope = RotaryEmbedding(
        obj.head_size,
        obj.rotary_dim,
        obj.cos_sin_cache.shape[0],
        10000,
        not kwargs["rotary_interleaved"],
        query.dtype,
    ).to(query.device)
    # SGLang rotates whole heads: hand it the [tokens, heads * head_size] buffers the case's
    # (possibly partial-rotary) views come from.
    q_full = torch.empty(*query.shape[:-1], obj.head_size, dtype=query.dtype, device=query.device)
    k_full = torch.empty(*key.shape[:-1], obj.head_size, dtype=key.dtype, device=key.device)
    q_flat, k_flat = q_full.flatten(1), k_full.flatten(1)
    return lambda: rope.forward_cuda(positions, q_flat, k_flat)


def time_ratio(
    impl: OpImpl, inputs: OpInputs, repeat: int, synchronize: Callable[[], None]
) -> float | None:
    """Time per call of ``impl`` over SGLang's ``forward_cuda`` on the same tensors."""
    theirs = sglang_forward(impl.op_name, inputs)
    if theirs is None:
        return None
    ours = per_call_seconds(lambda: call(impl.fn, inputs), repeat, synchronize)
    return ours / per_call_seconds(theirs, repeat, synchronize)


def run(
    ops: Sequence[str],
    dtypes: Sequence[torch.dtype],
    *,
    device: str,
    repeat: int,
    synchronize: Callable[[], None],
    baseline: bool = True,
) -> list[Row]:
    """Check and time every case of ``ops`` in ``dtypes`` on ``device``."""
    impls = implementations()
    rows: list[Row] = []
    for op in ops:
        contract, impl = STANDARD_OPS[op], impls[op]
        for dtype in dtypes:
            for case in contract.cases:
                name = str(dtype).removeprefix("torch.")
                outcome = check_case(impl, case, dtype, device)
                if outcome.status != PASSED:
                    rows.append(
                        Row(op, name, case.name, outcome.status, None, None, None, outcome.message)
                    )
                    continue
                got = call(impl.fn, make_inputs(contract, case, dtype, device))
                want = call(contract.reference, make_inputs(contract, case, dtype, device))
                max_abs, max_rel = max_errors(got, want)
                ratio = (
                    time_ratio(
                        impl, make_inputs(contract, case, dtype, device), repeat, synchronize
                    )
                    if baseline
                    else None
                )
                rows.append(Row(op, name, case.name, PASSED, max_abs, max_rel, ratio))
    return rows


def render(rows: Sequence[Row]) -> str:
    lines = [
        f"{'op':<17} {'dtype':<9} {'status':<7} {'max_abs':>9} {'max_rel':>9} {'t/sglang':>8}  case"
    ]
    for r in rows:
        numbers = (
            f"{r.max_abs:9.2e} {r.max_rel:9.2e}" if r.max_abs is not None else f"{'-':>9} {'-':>9}"
        )
        ratio = f"{r.time_ratio:8.2f}" if r.time_ratio is not None else f"{'n/a':>8}"
        lines.append(f"{r.op:<17} {r.dtype:<9} {r.status:<7} {numbers} {ratio}  {r.case}")
        if r.status == FAILED:
            lines.append("    " + r.message.replace("\n", "\n    "))
    return "\n".join(lines)


def summary(rows: Sequence[Row]) -> str:
    counts = {s: sum(r.status == s for r in rows) for s in ("passed", "failed", "skipped")}
    ratios = sorted(r.time_ratio for r in rows if r.time_ratio is not None)
    text = ", ".join(f"{n} {s}" for s, n in counts.items())
    if ratios:
        text += f"; time vs SGLang forward_cuda: median {ratios[len(ratios) // 2]:.2f}x"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--op", action="append", choices=sorted(STANDARD_OPS), help="repeatable")
    parser.add_argument("--dtype", action="append", choices=sorted(DTYPES), help="repeatable")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeat", type=int, default=100, help="timed calls per case")
    parser.add_argument("--no-baseline", action="store_true", help="skip SGLang timing")
    options = parser.parse_args(argv)

    availability = SGL_KERNEL.probe()
    if not availability.available:
        print(f"sglang-fl-cuda is unavailable here: {availability.reason}", file=sys.stderr)
        return 2
    print(f"sglang-fl-cuda: {availability.reason}; {torch.cuda.get_device_name(options.device)}")
    rows = run(
        options.op or list(STANDARD_OPS),
        [DTYPES[d] for d in options.dtype] if options.dtype else list(DTYPES.values()),
        device=options.device,
        repeat=options.repeat,
        synchronize=torch.cuda.synchronize,
        baseline=not options.no_baseline,
    )
    print(render(rows))
    print(summary(rows))
    return 1 if any(r.status == FAILED for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
