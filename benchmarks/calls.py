"""Per-call cost of every way an op can run, measured side by side (issue parts 1 and 3).

For each op, shape and dtype one interleaved run times six variants on the same tensors:

- ``direct``: the reference implementation called with the standard arguments;
- ``bound``: the callable ``get_runtime().resolve(op).fn`` hands out in this environment (the
  chosen implementation itself when nothing can take an ``Unsupported`` call);
- ``bound_fallback``: what is handed out when a fallback exists (an available vendor candidate
  with the reference behind it), i.e. the one closure core adds per call;
- ``routed_layer``: the real SGLang layer after ``sglang.srt.plugins.load_plugins()``, so its
  forward is sglang-fl's bridge bound to the chosen implementation;
- ``torch_layer``: the same layer called with ``backend=KernelBackend.TORCH`` (SGLang's own
  ``forward_native`` through ``BaseFusedOp.forward``);
- ``forward_native``: SGLang's ``forward_native`` method called directly (same math as the
  reference, no dispatch);
- ``routed_plain``: a second instance of the layer bound as with ``SGLANG_FL_CUSTOM_OPS=0``
  (the op's bridge around the chosen implementation, nothing else): ``routed_layer/routed_plain``
  is what having the custom ops available costs an eager call. With them, ``graph_safe`` hands
  the bridge the implementation itself (dynamo alone sees the custom op), which each row
  records as ``custom_ops_bind_fn_itself``; the ratio is then the noise floor of the row.

Runs in an environment with SGLang and the sglang-fl wheels installed (``nox -s bench``).
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from timing import Call, cpu_ratio, interleaved, paired_ratio, ratio

# Shapes: 1 token (decode, where per-call overhead matters most), 32 and 512 tokens.
SIZES: dict[str, int] = {"small": 1, "medium": 32, "large": 512}
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
HIDDEN = 2048  # rms_norm hidden size; silu_and_mul's d
Q_HEADS, KV_HEADS, HEAD_SIZE = 16, 4, 128
MAX_POSITIONS = 4096

# Benchmark case -> standard op it exercises.
CASES: dict[str, str] = {
    "silu_and_mul": "silu_and_mul",
    "rms_norm": "rms_norm",
    "rms_norm+residual": "rms_norm",
    "rotary_embedding": "rotary_embedding",
}
VARIANTS = (
    "direct",
    "bound",
    "bound_fallback",
    "routed_layer",
    "torch_layer",
    "forward_native",
    "routed_plain",
)


@dataclass
class CaseInputs:
    """One case's layer and the two argument conventions (standard op, SGLang layer)."""

    layer: Any
    op_args: tuple[Any, ...]
    layer_args: tuple[Any, ...]


def make_case(case: str, tokens: int, dtype: torch.dtype, seed: int = 0) -> CaseInputs:
    """Real SGLang layer and inputs for ``case``; standard args mirror what the bridge passes."""
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.rotary_embedding import RotaryEmbedding

    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)

    if case == "silu_and_mul":
        x = randn(tokens, 2 * HIDDEN)
        layer = SiluAndMul()
        return CaseInputs(layer, (layer, x), (x,))
    if case in ("rms_norm", "rms_norm+residual"):
        layer = RMSNorm(HIDDEN).to(dtype)  # a model's norms hold weights in its dtype
        with torch.no_grad():
            layer.weight.copy_(1.0 + 0.1 * randn(HIDDEN))
        x = randn(tokens, HIDDEN)
        if case == "rms_norm":
            return CaseInputs(layer, (layer, x), (x,))
        residual = randn(tokens, HIDDEN)
        return CaseInputs(layer, (layer, x, residual), (x, residual))
    if case == "rotary_embedding":
        layer = RotaryEmbedding(HEAD_SIZE, HEAD_SIZE, MAX_POSITIONS, 10000, True, dtype)
        positions = torch.randint(0, MAX_POSITIONS, (tokens,), generator=gen)
        query = randn(tokens, Q_HEADS * HEAD_SIZE)
        key = randn(tokens, KV_HEADS * HEAD_SIZE)
        # What the bridge hands the op: head views, the cache halves in the query dtype (cached
        # once per layer by the bridge), neox style, in place.
        cos, sin = (h.contiguous() for h in layer.cos_sin_cache.to(dtype).chunk(2, dim=-1))
        q = query.view(tokens, Q_HEADS, HEAD_SIZE)
        k = key.view(tokens, KV_HEADS, HEAD_SIZE)
        op_args = (layer, q, k, cos, sin, positions, False, True)
        return CaseInputs(layer, op_args, (positions, query, key))
    raise ValueError(f"unknown case {case!r}")


def fallback_chain(op_name: str, fn: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """What core hands out when a fallback exists: an available vendor impl, reference behind.

    Built with core's own registry and resolver; the vendor's ``fn`` is the reference function
    itself (or ``fn``) so the difference to calling it directly is exactly the closure that
    catches ``Unsupported``.
    """
    from sglang_fl.config import Settings
    from sglang_fl.dispatch.availability import AvailabilityCache
    from sglang_fl.dispatch.policy import SelectionPolicy
    from sglang_fl.dispatch.registry import OpRegistry
    from sglang_fl.dispatch.resolve import resolve
    from sglang_fl.dispatch.types import BackendImplKind, BackendPriority, OpImpl, Provenance
    from sglang_fl.ops import STANDARD_OPS

    reference = STANDARD_OPS[op_name].reference
    vendor_fn = fn or reference
    registry = OpRegistry()
    with registry.plugin_scope(Provenance("bench", "bench-vendor", "0")):
        registry.register(
            OpImpl(
                op_name=op_name,
                impl_id=f"vendor.bench.{op_name}",
                kind=BackendImplKind.VENDOR,
                fn=vendor_fn,
                vendor="bench",
                priority=BackendPriority.VENDOR,
            )
        )
        registry.register(
            OpImpl(
                op_name=op_name,
                impl_id=f"reference.bench.{op_name}",
                kind=BackendImplKind.REFERENCE,
                fn=reference,
                priority=BackendPriority.REFERENCE,
            )
        )
    resolution = resolve(
        op_name, registry, SelectionPolicy(Settings.from_environment({})), AvailabilityCache()
    )
    if resolution.fn is vendor_fn or len(resolution.decision.fallbacks) != 1:
        raise RuntimeError(f"expected a fallback closure for {op_name}, got {resolution.fn!r}")
    return resolution.fn


def _outputs(result: Any) -> tuple[torch.Tensor, ...]:
    return tuple(result) if isinstance(result, tuple) else (result,)


def _clone_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def _max_diff(a: Any, b: Any) -> float:
    return max(
        (x.float() - y.float()).abs().max().item()
        for x, y in zip(_outputs(a), _outputs(b), strict=True)
    )


def check_same_math(
    case: str, inputs: CaseInputs, routed_fn: Callable[..., Any], torch_backend: Any
) -> dict[str, float]:
    """Max |difference| of the reference and the routed layer against ``forward_native``.

    On fresh clones of the inputs: the rotary op writes ``query``/``key`` in place.
    """
    from sglang_fl.ops import STANDARD_OPS

    reference = STANDARD_OPS[CASES[case]].reference
    native = inputs.layer.forward_native(*_clone_args(inputs.layer_args))
    op_args = _clone_args(inputs.op_args)
    ref = reference(*op_args)
    if case == "rotary_embedding":  # the op returns head views; compare the full tensors
        ref = (op_args[1].reshape(native[0].shape), op_args[2].reshape(native[1].shape))
    routed = routed_fn(*_clone_args(inputs.layer_args))
    torch_layer = inputs.layer(*_clone_args(inputs.layer_args), backend=torch_backend)
    return {
        "reference_vs_native": _max_diff(ref, native),
        "routed_vs_native": _max_diff(routed, native),
        "torch_layer_vs_native": _max_diff(torch_layer, native),
    }


def route_sglang_layers() -> str:
    """Run SGLang's own plugin loading (sglang-fl's entry point among them); its version."""
    import sglang
    from sglang.srt.plugins import load_plugins

    from sglang_fl.integrations.sglang.plugin import get_router

    load_plugins()
    if get_router() is None:
        raise RuntimeError(
            "sglang.srt.plugins.load_plugins() did not register sglang-fl's router: is the "
            "sglang-fl wheel (with its sglang.srt.plugins entry point) installed here?"
        )
    return getattr(sglang, "__version__", "unknown")


def bind_without_custom_ops(case: str, layer: Any, fn: Callable[..., Any]) -> None:
    """Bind ``layer`` as sglang-fl's router does with ``SGLANG_FL_CUSTOM_OPS=0``: the op's
    bridge around ``fn`` itself, with no graph-safe wrapper in between."""
    from sglang_fl.integrations.sglang.bridges import BRIDGES

    def handoff(reason: str) -> None:
        raise RuntimeError(f"{case}: the benchmark call was handed to SGLang ({reason})")

    layer._forward_method = BRIDGES[CASES[case]].bind(layer, fn, layer.forward_native, handoff)


def measure_case(case: str, size: str, dtype_name: str, *, repetitions: int) -> dict[str, Any]:
    """All variants of one case, one interleaved run; medians, ratios, numerics check."""
    from sglang.kernels.spec import KernelBackend

    from sglang_fl import get_runtime
    from sglang_fl.graph import graph_safe
    from sglang_fl.integrations.sglang.plugin import get_router

    op_name = CASES[case]
    dtype = DTYPES[dtype_name]
    tokens = SIZES[size]
    inputs = make_case(case, tokens, dtype)
    resolution = get_runtime().resolve(op_name)
    reference = resolution.decision.chosen.fn
    layer = inputs.layer
    layer(*_clone_args(inputs.layer_args))  # first call: SGLang resolves and caches the forward
    forward = layer._forward_method
    if getattr(forward, "__self__", None) is layer:
        raise RuntimeError(
            f"{type(layer).__name__} was not routed through sglang-fl (cached forward: "
            f"{forward!r}); see the sglang-fl dispatch report"
        )
    if not get_runtime().config.custom_ops:
        raise RuntimeError("SGLANG_FL_CUSTOM_OPS is off: routed_layer would equal routed_plain")
    impl_id = resolution.decision.chosen.impl_id
    binds_fn_itself = graph_safe(op_name, resolution.fn, impl_id) is resolution.fn
    plain = make_case(case, tokens, dtype)
    bind_without_custom_ops(case, plain.layer, resolution.fn)
    diffs = check_same_math(case, inputs, layer, KernelBackend.TORCH)
    router = get_router()
    assert router is not None  # route_sglang_layers() checked it
    # With verify off (this environment), the verifier hands the bridge the chosen callable
    # itself: the routed layer below is exactly what it is without verify mode.
    verify_off_is_fn = (
        router.verifier.calls == 0
        and router.verifier.wrap(resolution.fn, resolution.decision.chosen, case) is resolution.fn
    )
    variants = {
        "routed_plain": Call(plain.layer, plain.layer_args),
        "bound_fallback": Call(fallback_chain(op_name), inputs.op_args),
        "bound": Call(resolution.fn, inputs.op_args),
        "direct": Call(reference, inputs.op_args),
        "forward_native": Call(layer.forward_native, inputs.layer_args),
        "torch_layer": Call(layer, inputs.layer_args, {"backend": KernelBackend.TORCH}),
        "routed_layer": Call(layer, inputs.layer_args),
    }
    with torch.inference_mode():
        samples = interleaved(variants, repetitions=repetitions)
    pairs = {
        "bound/direct": ("bound", "direct"),
        "bound_fallback/direct": ("bound_fallback", "direct"),
        "routed_layer/torch_layer": ("routed_layer", "torch_layer"),
        "direct/forward_native": ("direct", "forward_native"),
        "routed_layer/routed_plain": ("routed_layer", "routed_plain"),
    }
    return {
        "case": case,
        "op": op_name,
        "size": size,
        "tokens": tokens,
        "dtype": dtype_name,
        "chosen": resolution.decision.chosen.impl_id,
        "bound_is_chosen_fn": resolution.fn is reference,
        "verify_off_is_fn": verify_off_is_fn,
        "custom_ops_bind_fn_itself": binds_fn_itself,
        "iterations_per_batch": samples["direct"].iterations,
        "repetitions": len(samples["direct"].per_call_ns),
        "median_ns": {name: samples[name].median_ns for name in VARIANTS},
        "quartiles_ns": {name: samples[name].quartiles_ns for name in VARIANTS},
        "median_cpu_ns": {name: samples[name].median_cpu_ns for name in VARIANTS},
        "ratios": {key: ratio(samples, *pair) for key, pair in pairs.items()},
        "paired_ratios": {key: paired_ratio(samples, *pair) for key, pair in pairs.items()},
        "cpu_ratios": {key: cpu_ratio(samples, *pair) for key, pair in pairs.items()},
        "max_abs_diff": diffs,
    }


def _noop_rotary(
    obj: Any,
    query: Any,
    key: Any,
    cos: Any,
    sin: Any,
    position_ids: Any,
    rotary_interleaved: bool = False,
    inplace: bool = True,
) -> tuple[Any, Any]:
    return query, key


def _noop_rms_norm(obj: Any, x: Any, residual: Any = None) -> Any:
    return x


def _verify_spent(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` wrapped by verify mode (one checked call per layer class), that call spent."""
    from sglang_fl.dispatch.types import BackendImplKind, OpImpl
    from sglang_fl.verify import Verifier

    impl = OpImpl(op_name="rms_norm", impl_id="bench.noop", kind=BackendImplKind.VENDOR, fn=fn)
    wrapped = Verifier(1, None, lambda record: None).wrap(fn, impl, "bench.Norm")
    wrapped(None, 1, 2)  # the one checked call (no tensors: recorded as unchecked)
    return wrapped


def dispatch_overhead(repetitions: int) -> dict[str, Any]:
    """Nanoseconds the fallback closure adds per call, on implementations that do nothing.

    On real kernels this cost drowns in the kernel's own time and the machine's noise; on a
    no-op it is the whole difference. Arguments as the bridges pass them (all positional).
    """
    rotary_args = (None, 1, 2, 3, 4, 5, False, True)
    rms_args = (None, 1, 2)
    variants = {
        "rotary_direct": Call(_noop_rotary, rotary_args),
        "rotary_fallback": Call(fallback_chain("rotary_embedding", _noop_rotary), rotary_args),
        "rms_norm_direct": Call(_noop_rms_norm, rms_args),
        "rms_norm_fallback": Call(fallback_chain("rms_norm", _noop_rms_norm), rms_args),
    }
    variants["rms_norm_verify_spent"] = Call(_verify_spent(_noop_rms_norm), rms_args)
    samples = interleaved(variants, repetitions=repetitions, batch_ns=200_000)
    return {
        "median_ns": {name: s.median_ns for name, s in samples.items()},
        # What a verified layer class costs per call once its checked calls are spent.
        "verify_spent_ns": samples["rms_norm_verify_spent"].median_ns
        - samples["rms_norm_direct"].median_ns,
        "closure_ns": {
            "rotary_embedding (8 args)": samples["rotary_fallback"].median_ns
            - samples["rotary_direct"].median_ns,
            "rms_norm (3 args)": samples["rms_norm_fallback"].median_ns
            - samples["rms_norm_direct"].median_ns,
        },
    }


def run(*, repetitions: int = 31, quick: bool = False) -> dict[str, Any]:
    """Every case x size x dtype; single-threaded torch so the 2-core machines stay comparable."""
    import sglang_fl

    torch.set_num_threads(1)
    sglang_version = route_sglang_layers()
    sizes = ["small", "large"] if quick else list(SIZES)
    dtypes = ["float32"] if quick else list(DTYPES)
    results = []
    for case in CASES:
        for size in sizes:
            for dtype_name in dtypes:
                result = measure_case(case, size, dtype_name, repetitions=repetitions)
                results.append(result)
                r, c = result["ratios"], result["cpu_ratios"]
                print(
                    f"  {case:<18} {size:<6} {dtype_name:<8} "
                    f"direct {result['median_ns']['direct']:>11,.0f} ns  "
                    f"bound {r['bound/direct']:.3f}x  fallback {r['bound_fallback/direct']:.3f}x  "
                    f"routed/torch {r['routed_layer/torch_layer']:.3f}x  "
                    f"ref/native {r['direct/forward_native']:.3f}x  "
                    f"custom ops on/off {r['routed_layer/routed_plain']:.3f}x  "
                    f"(cpu: {c['bound/direct']:.3f} {c['bound_fallback/direct']:.3f} "
                    f"{c['routed_layer/torch_layer']:.3f} {c['direct/forward_native']:.3f})",
                    flush=True,
                )
    overhead = dispatch_overhead(repetitions)
    print(
        "  fallback closure on no-op implementations: "
        + ", ".join(f"{op} +{ns:.0f} ns" for op, ns in overhead["closure_ns"].items()),
        flush=True,
    )
    return {
        "dispatch_overhead": overhead,
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "sglang": sglang_version,
            "sglang_fl": sglang_fl.__version__,
            "machine": platform.machine(),
            "processor": platform.processor() or platform.machine(),
        },
        "shapes": {
            "hidden": HIDDEN,
            "rotary": {"q_heads": Q_HEADS, "kv_heads": KV_HEADS, "head_size": HEAD_SIZE},
            "tokens": SIZES,
        },
        "results": results,
    }
