"""The hardware conformance runner behind each vendor's ``scripts/conformance.py``.

A vendor script describes its backend with a :class:`HardwareTarget` (how it registers, how it
is probed, its device and synchronize call, the SGLang method it is timed against) and hands
its command line to :func:`run_hardware_conformance`::

    TARGET = HardwareTarget(
        title="sglang-fl-acme",
        register=register_builtins,
        probe=ACME_SDK.probe,
        device="acme",
        synchronize=torch.acme.synchronize,
        sglang_forward="forward_acme",
    )
    sys.exit(run_hardware_conformance(None, TARGET))

For every case and dtype of each op contract the vendor implements, the implementation runs on
the device through :func:`~sglang_fl.testing.checks.check_case` (tolerance, untouched inputs,
in-place outputs); the report gives the max absolute and relative error against the reference
on the same inputs, computed on the host (:data:`REFERENCE_DEVICE`: PyTorch's CPU kernels, not
the chip's aten ops, whose math may differ: torch_npu documents ``F.gelu`` ignoring
``approximate``), then moved to the device, and the time per call divided by that of SGLang's
own layer method on the same tensors (``n/a`` without SGLang, which is imported only for that
baseline). Exit status: 0 when every case passes or is declined (``Unsupported``), 1 when one
fails, 2 when the backend is unavailable (the probe's reason is printed).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from ..dispatch.registry import OpRegistry
from ..dispatch.types import Availability, OpImpl
from ..ops import STANDARD_OPS, OpCase, OpInputs
from .checks import (
    FAILED,
    PASSED,
    SKIPPED,
    CheckStatus,
    _make_inputs,
    call_arguments,
    check_case,
    dtype_name,
    registered_by,
)

__all__ = [
    "DTYPES",
    "REFERENCE_DEVICE",
    "SGLANG_BASELINE_OPS",
    "HardwareTarget",
    "Row",
    "load_script",
    "max_errors",
    "render",
    "run_cases",
    "run_hardware_conformance",
    "summary",
]

# Where the reference runs: the host, whose PyTorch kernels compute the contracts' math as
# written (half-precision ops accumulate in float32 there); the inputs are the same values.
REFERENCE_DEVICE = "cpu"

# Every dtype some contract covers (float ones, and the index dtypes of clamp_position).
DTYPES: dict[str, torch.dtype] = {
    dtype_name(d): d for contract in STANDARD_OPS.values() for d in contract.dtypes
}


@dataclass(frozen=True)
class HardwareTarget:
    """What one vendor's conformance script knows and core does not."""

    title: str  # the distribution, e.g. "sglang-fl-cuda": heads the report and its errors
    register: Callable[[OpRegistry], object]  # the vendor's registration, as its plugin runs it
    probe: Callable[[], Availability]  # whether the backend can run here, and why (not)
    device: str  # the default --device
    synchronize: Callable[[], None]  # waits for the device's queued work (timing only)
    sglang_forward: str  # SGLang's layer method timed as the baseline, e.g. "forward_cuda"
    device_name: Callable[[str], str] | None = None  # the device's name for the heading


@dataclass(frozen=True)
class Row:
    """One line of the report: an op, dtype and case, its verdict and its numbers."""

    op: str
    dtype: str
    case: str
    status: CheckStatus  # skipped: declined with Unsupported
    max_abs: float | None = None
    max_rel: float | None = None
    time_ratio: float | None = None  # ours / SGLang's, per call; None when not timed
    message: str = ""


def run_cases(
    target: HardwareTarget,
    ops: Sequence[str] | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    *,
    device: str | None = None,
    repeat: int = 100,
) -> list[Row]:
    """Check (and, for ``repeat`` > 0, time) every case of ``ops`` in ``dtypes`` on ``device``.

    ``ops`` defaults to those the vendor implements (a requested op it does not implement is a
    failed row), ``dtypes`` to each op's contract dtypes (a requested dtype an op's contract
    does not cover is left out for that op), ``device`` to the target's.
    """
    registry = registered_by(target.register)
    if ops is None:
        ops = [op for op in STANDARD_OPS if registry.implementations(op)]
    device = device or target.device
    rows: list[Row] = []
    for op in ops:
        impls = registry.implementations(op)
        if not impls:
            message = f"{target.title} registers no implementation of op {op!r}"
            rows.append(Row(op, "-", "-", FAILED, message=message))
        contract = STANDARD_OPS[op]
        if contract.collective is not None:
            # One rank cannot run a collective: say so in the report rather than drop it.
            message = (
                f"{op} is a collective: its cases run on 2 and 4 ranks at once, which this "
                "single-process script cannot do; run the kit's multi-process checks "
                "(sglang_fl.testing.collectives.run_collective_checks, or pytest with "
                "conformance_tests) for it"
            )
            rows.extend(Row(op, "-", "-", SKIPPED, message=message) for _ in impls[:1])
            continue
        op_dtypes = [d for d in dtypes or contract.dtypes if d in contract.dtypes]
        for impl in impls:
            for dtype in op_dtypes:
                for case in contract.cases:
                    rows.append(_case_row(target, impl, case, dtype, device, repeat))
    return rows


def max_errors(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> tuple[float, float]:
    """Largest absolute and relative (to ``|want|``, where non-zero) error over all outputs."""
    worst_abs = worst_rel = 0.0
    for g, w in zip(got, want, strict=True):
        if w.numel() == 0:
            continue  # an empty batch's output: nothing can be off
        ours, exact = g.detach().to("cpu", torch.float64), w.detach().to("cpu", torch.float64)
        error = (ours - exact).abs()
        if error.numel() == 0:  # a case with no tokens: nothing to compare
            continue
        worst_abs = max(worst_abs, error.max().item())
        nonzero = exact != 0
        if bool(nonzero.any()):
            worst_rel = max(worst_rel, (error[nonzero] / exact[nonzero].abs()).max().item())
    return worst_abs, worst_rel


def render(rows: Sequence[Row]) -> str:
    """The report table; each failure is followed by its message, indented."""
    lines = [
        f"{'op':<17} {'dtype':<9} {'status':<7} {'max_abs':>9} {'max_rel':>9} {'t/sglang':>8}  case"
    ]
    for r in rows:
        numbers = (
            f"{r.max_abs:9.2e} {r.max_rel:9.2e}"
            if r.max_abs is not None and r.max_rel is not None
            else f"{'-':>9} {'-':>9}"
        )
        ratio = f"{r.time_ratio:8.2f}" if r.time_ratio is not None else f"{'n/a':>8}"
        lines.append(f"{r.op:<17} {r.dtype:<9} {r.status:<7} {numbers} {ratio}  {r.case}")
        if r.status == FAILED:
            lines.append("    " + r.message.replace("\n", "\n    "))
    return "\n".join(lines)


def summary(rows: Sequence[Row], sglang_forward: str) -> str:
    """``12 passed, 0 failed, 3 skipped; time vs SGLang forward_cuda: median 0.91x``."""
    counts = {s: sum(r.status == s for r in rows) for s in (PASSED, FAILED, SKIPPED)}
    ratios = sorted(r.time_ratio for r in rows if r.time_ratio is not None)
    text = ", ".join(f"{n} {s}" for s, n in counts.items())
    if ratios:
        text += f"; time vs SGLang {sglang_forward}: median {ratios[len(ratios) // 2]:.2f}x"
    return text


def load_script(path: str | os.PathLike[str]) -> ModuleType:
    """A vendor's ``scripts/conformance.py``, imported from its file as a fresh module (scripts
    are not part of the installed wheel), for the vendor's tests of its wiring."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"{path.parents[1].name}_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import the conformance script {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_hardware_conformance(argv: Sequence[str] | None, target: HardwareTarget) -> int:
    """The vendor script's command line: 0 all passed or declined, 1 a failure, 2 unavailable."""
    parser = argparse.ArgumentParser(
        description=f"Hardware conformance of {target.title}: each op vs the reference, "
        f"timed vs SGLang's {target.sglang_forward}."
    )
    parser.add_argument("--op", action="append", choices=sorted(STANDARD_OPS), help="repeatable")
    parser.add_argument("--dtype", action="append", choices=sorted(DTYPES), help="repeatable")
    parser.add_argument("--device", default=target.device)
    parser.add_argument(
        "--repeat", type=int, default=100, help="timed calls per case; 0 skips timing"
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip SGLang timing")
    options = parser.parse_args(argv)
    if options.repeat < 0:
        parser.error("--repeat must be 0 or more")

    availability = target.probe()
    if not availability.available:
        print(f"{target.title} is unavailable here: {availability.reason}", file=sys.stderr)
        return 2
    name = f"; {target.device_name(options.device)}" if target.device_name else ""
    print(f"{target.title}: {availability.reason}{name}")
    rows = run_cases(
        target,
        options.op,
        [DTYPES[d] for d in options.dtype] if options.dtype else None,
        device=options.device,
        repeat=0 if options.no_baseline else options.repeat,
    )
    print(render(rows))
    print(summary(rows, target.sglang_forward))
    return 1 if any(r.status == FAILED for r in rows) else 0


# -- internals ----------------------------------------------------------------------------------


def _case_row(
    target: HardwareTarget, impl: OpImpl, case: OpCase, dtype: torch.dtype, device: str, repeat: int
) -> Row:
    """Check one case; when it passes, measure its errors and (``repeat`` > 0) its time ratio."""
    contract, name = STANDARD_OPS[impl.op_name], dtype_name(dtype)
    outcome = check_case(impl, case, dtype, device, reference_device=REFERENCE_DEVICE)
    if outcome.status != PASSED:
        return Row(impl.op_name, name, case.name, outcome.status, message=outcome.message)
    inputs = partial(_make_inputs, contract, case, dtype, device)  # fresh, same seed each call
    host = _make_inputs(contract, case, dtype, REFERENCE_DEVICE)
    max_abs, max_rel = max_errors(
        contract.canonical_output(_call(impl, inputs())),
        contract.canonical_output(_call_fn(contract.reference, host)),
    )
    timed = repeat > 0 and not _empty_batch(inputs())
    ratio = _time_ratio(target, impl, inputs(), repeat) if timed else None
    return Row(impl.op_name, name, case.name, PASSED, max_abs, max_rel, ratio)


def _empty_batch(inputs: OpInputs) -> bool:
    """Whether the op's leading tensor (``x``, ``query``) has no elements: nothing to time, and
    SGLang's own method may refuse it (``forward_npu``'s ``npu_swiglu`` does)."""
    leading = inputs.args[0] if inputs.args else None
    return isinstance(leading, torch.Tensor) and leading.numel() == 0


def _call_fn(fn: Callable[..., Any], inputs: OpInputs) -> tuple[torch.Tensor, ...]:
    out = fn(inputs.obj, *inputs.args, **inputs.kwargs)
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _call(impl: OpImpl, inputs: OpInputs) -> tuple[torch.Tensor, ...]:
    """``impl`` on ``inputs``, its weights prepared first if it prepares them (not timed: a
    layer prepares once, at load)."""
    args, kwargs = call_arguments(STANDARD_OPS[impl.op_name], impl, inputs)
    return _call_fn(impl.fn, OpInputs(inputs.obj, args, kwargs))


def _time_ratio(
    target: HardwareTarget, impl: OpImpl, inputs: OpInputs, repeat: int
) -> float | None:
    """Time per call of ``impl`` over SGLang's own method on the same tensors; None without it."""
    theirs = _sglang_layer_call(target.sglang_forward, impl.op_name, inputs)
    if theirs is None:
        return None
    args, kwargs = call_arguments(STANDARD_OPS[impl.op_name], impl, inputs)
    prepared = OpInputs(inputs.obj, args, kwargs)
    ours = _seconds_per_call(lambda: _call_fn(impl.fn, prepared), repeat, target.synchronize)
    return ours / _seconds_per_call(theirs, repeat, target.synchronize)


def _seconds_per_call(
    fn: Callable[[], object], repeat: int, synchronize: Callable[[], None]
) -> float:
    for _ in range(3):  # warm-up: kernel compilation, caches, allocator
        fn()
    synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    synchronize()
    return (time.perf_counter() - start) / repeat


def _sglang_layer_call(method: str, op: str, inputs: OpInputs) -> Callable[[], object] | None:
    """SGLang's layer for the case, its ``method`` bound to the case's tensors; None without
    SGLang (imported here only, never at import of this module) or a layer for ``op``."""
    build = _SGLANG_LAYERS.get(op)
    if build is None:
        return None  # no SGLang layer to time this op against here
    try:
        return build(method, inputs)
    except ImportError:
        return None


def _gelu_and_mul(method: str, inputs: OpInputs) -> Callable[[], object]:
    from sglang.srt.layers.activation import GeluAndMul

    forward, (x,) = getattr(GeluAndMul(inputs.obj.approximate), method), inputs.args
    return lambda: forward(x)


def _elementwise(class_name: str) -> Callable[[str, OpInputs], Callable[[], object]]:
    """An activation layer without options: ``SiluAndMul``, ``NewGELU``, ``QuickGELU``."""

    def build(method: str, inputs: OpInputs) -> Callable[[], object]:
        from sglang.srt.layers import activation

        forward, (x,) = getattr(getattr(activation, class_name)(), method), inputs.args
        return lambda: forward(x)

    return build


def _norm(class_name: str) -> Callable[[str, OpInputs], Callable[[], object]]:
    """RMSNorm / GemmaRMSNorm over the case's weight and epsilon."""

    def build(method: str, inputs: OpInputs) -> Callable[[], object]:
        from sglang.srt.layers import layernorm

        obj, args = inputs.obj, inputs.args
        hidden = obj.weight.shape[0]
        norm = getattr(layernorm, class_name)(hidden, eps=obj.variance_epsilon)
        norm = norm.to(args[0].device)
        norm.weight.data = obj.weight
        forward = getattr(norm, method)
        return lambda: forward(*args)

    return build


def _layer_norm(method: str, inputs: OpInputs) -> Callable[[], object]:
    from sglang.srt.layers.layernorm import LayerNorm

    obj, (x,) = inputs.obj, inputs.args
    norm = LayerNorm(
        obj.hidden_size,
        eps=obj.variance_epsilon,
        elementwise_affine=obj.elementwise_affine,
        bias=obj.use_bias,
        dtype=obj.dtype,
    ).to(x.device)
    norm.weight.data, norm.bias.data = obj.weight, obj.bias
    forward = getattr(norm, method)
    return lambda: forward(x)


def _rotary_embedding(method: str, inputs: OpInputs) -> Callable[[], object]:
    from sglang.srt.layers.rotary_embedding import RotaryEmbedding

    obj, args = inputs.obj, inputs.args
    query, key, *_, positions = args
    rope = RotaryEmbedding(
        obj.head_size,
        obj.rotary_dim,
        obj.cos_sin_cache.shape[0],
        10000,
        obj.is_neox_style,
        query.dtype,
    ).to(query.device)
    # SGLang rotates whole heads, flattened: [tokens, heads * head_size], where the case's
    # (possibly partial-rotary) query and key are [tokens, heads, rotary_dim] views.
    tokens, head_size = query.shape[0], obj.head_size
    q = torch.zeros(tokens, query.shape[1] * head_size, dtype=query.dtype, device=query.device)
    k = torch.zeros(tokens, key.shape[1] * head_size, dtype=key.dtype, device=key.device)
    forward = getattr(rope, method)
    return lambda: forward(positions, q, k)


def _mrotary_embedding(method: str, inputs: OpInputs) -> Callable[[], object]:
    from sglang.srt.layers.rotary_embedding import MRotaryEmbedding

    obj, (positions, query, key) = inputs.obj, inputs.args
    rope = MRotaryEmbedding(
        obj.head_size,
        obj.rotary_dim,
        obj.cos_sin_cache.shape[0],
        10000,
        obj.is_neox_style,
        query.dtype,
        mrope_section=obj.mrope_section,
        mrope_interleaved=obj.mrope_interleaved,
    ).to(query.device)
    rope.cos_sin_cache = obj.cos_sin_cache
    forward = getattr(rope, method)
    return lambda: forward(positions, query, key)


def _clamp_position(method: str, inputs: OpInputs) -> Callable[[], object]:
    from sglang.kernels.ops.attention.clamp_position import ClampPositionOp

    forward, (seq_lens,) = getattr(ClampPositionOp(), method), inputs.args
    return lambda: forward(seq_lens)


# Standard op -> how to build SGLang's own layer call for a case (the timing baseline).
_SGLANG_LAYERS: dict[str, Callable[[str, OpInputs], Callable[[], object]]] = {
    "silu_and_mul": _elementwise("SiluAndMul"),
    "rms_norm": _norm("RMSNorm"),
    "rotary_embedding": _rotary_embedding,
    "gelu_and_mul": _gelu_and_mul,
    "gelu_new": _elementwise("NewGELU"),
    "gelu_quick": _elementwise("QuickGELU"),
    "gemma_rms_norm": _norm("GemmaRMSNorm"),
    "layer_norm": _layer_norm,
    "mrotary_embedding": _mrotary_embedding,
    "clamp_position": _clamp_position,
}
# The ops timed against SGLang's own layer; the others (MoE routing and experts, kernel
# functions) are checked, not timed.
SGLANG_BASELINE_OPS = tuple(_SGLANG_LAYERS)
