#!/usr/bin/env python3
"""Hardware conformance of sglang-fl-ascend: each op vs the reference, timed vs SGLang's own.

Run it on an Ascend machine with CANN, ``torch`` + the matching ``torch_npu``, and
``sglang-fl`` + ``sglang-fl-ascend`` installed (SGLang too, for the timing baseline)::

    python vendors/ascend/scripts/conformance.py [--op rms_norm] [--dtype bfloat16] [--repeat 100]

For every case and dtype of each op contract, the ``vendor.ascend`` implementation runs on the
NPU through core's conformance check (tolerance, untouched inputs, in-place outputs); the
script prints the max absolute and relative error against the reference backend on the same
inputs, and the time per call divided by that of SGLang's ``forward_npu`` on the same layer
(``n/a`` without SGLang). ``npu_mrope`` and the norms have shape limits that only the hardware
tells: a case the operator rejects shows as ``failed`` with the operator's message. Exit status:
0 when all cases pass or are declined, 1 otherwise, 2 when the backend is unavailable.
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch
from sglang_fl_ascend.ascend import TORCH_NPU
from sglang_fl_ascend.register_ops import register_builtins

from sglang_fl.dispatch.registry import OpRegistry
from sglang_fl.dispatch.types import OpImpl
from sglang_fl.ops import STANDARD_OPS, OpCase, OpContract, OpInputs
from sglang_fl.testing.checks import PASSED, check_case


class Result(NamedTuple):
    """One op/dtype/case: verdict, worst errors (when it ran), and time vs forward_npu."""

    op: str
    dtype: torch.dtype
    case: str
    verdict: str
    errors: tuple[float, float] | None = None
    speed: float | None = None
    detail: str = ""


def ascend_impls() -> dict[str, OpImpl]:
    registry = OpRegistry()
    register_builtins(registry)
    return {op: impl for op in STANDARD_OPS for impl in registry.implementations(op)}


def inputs_for(contract: OpContract, case: OpCase, dtype: torch.dtype, device: str) -> OpInputs:
    generator = torch.Generator().manual_seed(zlib.crc32(f"{case.name}/{dtype}".encode()))
    return contract.make_inputs(case, dtype, torch.device(device), generator)


def outputs(fn: Callable[..., Any], inputs: OpInputs) -> list[torch.Tensor]:
    result = fn(inputs.obj, *inputs.args, **inputs.kwargs)
    return list(result) if isinstance(result, tuple) else [result]


def worst_errors(ours: list[torch.Tensor], reference: list[torch.Tensor]) -> tuple[float, float]:
    """Max |ours - reference| and max of that over |reference| (non-zero entries), in float64."""
    pairs = [(o.cpu().double(), r.cpu().double()) for o, r in zip(ours, reference, strict=True)]
    absolute = max((o - r).abs().max().item() for o, r in pairs)
    relative = max(
        ((o - r).abs()[r != 0] / r[r != 0].abs()).max().item() if bool((r != 0).any()) else 0.0
        for o, r in pairs
    )
    return absolute, relative


def forward_npu(op: str, inputs: OpInputs) -> Callable[[], object] | None:
    """SGLang's ``forward_npu`` for the case's layer and tensors; None without SGLang."""
    try:
        from sglang.srt.layers.activation import SiluAndMul
        from sglang.srt.layers.layernorm import RMSNorm
        from sglang.srt.layers.rotary_embedding import RotaryEmbedding
    except ImportError:
        return None
    obj, args = inputs.obj, inputs.args
    if op == "silu_and_mul":
        return lambda: SiluAndMul().forward_npu(args[0])
    if op == "rms_norm":
        layer = RMSNorm(obj.hidden_size, eps=obj.variance_epsilon)
        layer.weight.data = obj.weight
        return lambda: layer.forward_npu(*args)
    query, key, *_, positions = args
    rope = RotaryEmbedding(
        obj.head_size,
        obj.rotary_dim,
        obj.cos_sin_cache.shape[0],
        10000,
        obj.is_neox_style,
        query.dtype,
    ).to(query.device)
    tokens = query.shape[0]
    # SGLang takes whole heads, flattened: [tokens, heads * head_size].
    q = torch.zeros(tokens, query.shape[1] * obj.head_size, dtype=query.dtype, device=query.device)
    k = torch.zeros(tokens, key.shape[1] * obj.head_size, dtype=key.dtype, device=key.device)
    return lambda: rope.forward_npu(positions, q, k)


def seconds_per_call(fn: Callable[[], object], repeat: int) -> float:
    fn()
    torch.npu.synchronize()  # type: ignore[attr-defined]  # torch.npu exists once torch_npu is in
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    torch.npu.synchronize()  # type: ignore[attr-defined]
    return (time.perf_counter() - start) / repeat


def relative_speed(impl: OpImpl, inputs: OpInputs, repeat: int) -> float | None:
    """Seconds per call of ``impl`` over those of SGLang's ``forward_npu``; None without SGLang."""
    baseline = forward_npu(impl.op_name, inputs)
    if baseline is None:
        return None
    ours = seconds_per_call(lambda: outputs(impl.fn, inputs), repeat)
    return ours / seconds_per_call(baseline, repeat)


def results(
    ops: Sequence[str], dtypes: Sequence[torch.dtype], device: str, repeat: int
) -> Iterator[Result]:
    impls = ascend_impls()
    for op in ops:
        contract = STANDARD_OPS[op]
        for dtype in dtypes:
            for case in contract.cases:
                outcome = check_case(impls[op], case, dtype, device)
                if outcome.status != PASSED:
                    yield Result(op, dtype, case.name, outcome.status, detail=outcome.message)
                    continue
                errors = worst_errors(
                    outputs(impls[op].fn, inputs_for(contract, case, dtype, device)),
                    outputs(contract.reference, inputs_for(contract, case, dtype, device)),
                )
                speed = (
                    relative_speed(impls[op], inputs_for(contract, case, dtype, device), repeat)
                    if repeat
                    else None
                )
                yield Result(op, dtype, case.name, PASSED, errors, speed)


def main(argv: Sequence[str] | None = None) -> int:
    dtypes = {
        str(d).removeprefix("torch."): d for d in (torch.float32, torch.float16, torch.bfloat16)
    }
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--op", action="append", choices=sorted(STANDARD_OPS))
    parser.add_argument("--dtype", action="append", choices=sorted(dtypes))
    parser.add_argument("--device", default="npu")
    parser.add_argument("--repeat", type=int, default=100, help="timed calls; 0 skips timing")
    options = parser.parse_args(argv)

    state = TORCH_NPU.probe()
    if not state.available:
        print(f"sglang-fl-ascend is unavailable here: {state.reason}", file=sys.stderr)
        return 2
    print(f"sglang-fl-ascend: {state.reason}")
    failures = 0
    print(f"{'op':<17}{'dtype':<10}{'verdict':<9}{'max abs':>10}{'max rel':>10}{'vs npu':>8}  case")
    for r in results(
        options.op or list(STANDARD_OPS),
        [dtypes[d] for d in options.dtype or dtypes],
        options.device,
        options.repeat,
    ):
        errors = "".join(f"{e:10.2e}" for e in r.errors) if r.errors else f"{'-':>10}" * 2
        speed = f"{r.speed:8.2f}" if r.speed is not None else f"{'n/a':>8}"
        dtype = str(r.dtype).removeprefix("torch.")
        print(f"{r.op:<17}{dtype:<10}{r.verdict:<9}{errors}{speed}  {r.case}")
        if r.verdict not in (PASSED, "skipped"):
            failures += 1
            print("    " + r.detail.replace("\n", "\n    "))
    print(f"{failures} case(s) failed" if failures else "all cases passed or were declined")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
