"""sglang-fl's quantized linear and MoE methods: SGLang's weights, sglang-fl's kernels.

Each method wraps the method SGLang chose for the layer (its ``delegate``): SGLang's
``create_weights`` creates the parameters and its weight loaders fill them, unchanged. Once the
weights are final (``process_weights_after_loading``), the layer is bound: its parameters read
as the op's weights (:mod:`.formats`), the op's candidates each prepare their own layout of
them (:func:`~sglang_fl.dispatch.prepare.prepare_chain`), and the layer keeps one callable
walking that chain (declines reported), wrapped by verify mode. ``apply`` calls it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from sglang.srt.layers import linear as sglang_linear
from sglang.srt.layers.quantization.base_config import FusedMoEMethodBase, LinearMethodBase

from ....dispatch.binder import Decline, FallbackChain
from ....dispatch.prepare import PreparedChain, prepare_chain
from ....dispatch_report import DispatchReport, ReportEvent, Runner
from ....errors import NoImplementationError, SglangFlError
from ....ops.experts import MoeActivation
from ....runtime import Runtime, get_runtime
from ....schema import impl_fields
from ....verify import Verifier
from ...routing import qualname
from ..bridges.moe import runner_config_problem
from .formats import Served

__all__ = ["QuantizationNotServed", "SglangFlLinearMethod", "SglangFlMoEMethod", "routing"]

# Where a bound layer keeps its callable, stand-in and weights.
BOUND_ATTR = "_sglang_fl_quantized"


class QuantizationNotServed(SglangFlError, NotImplementedError):
    """A quantized layer sglang-fl's CPU platform cannot serve (the message says why)."""


@dataclass(frozen=True)
class BoundLayer:
    """What a quantized layer calls: ``fn(obj, x, *weights, ...)`` (the op's arguments)."""

    op: str
    fn: Any
    obj: SimpleNamespace
    weights: tuple[Any, ...]
    impl_id: str  # who serves it (the first of its chain)


class QuantRouting:
    """The process's binding of quantized layers: resolutions, report records, verify."""

    def __init__(self, runtime: Runtime, report: DispatchReport, verifier: Verifier) -> None:
        self.runtime = runtime
        self.report = report
        self.verifier = verifier
        self._reported: set[tuple[str, ...]] = set()
        self._lock = threading.Lock()

    def bind(self, layer: Any, served: Served, sglang_method: str) -> BoundLayer:
        """Prepare and bind ``layer``'s op; report the first layer of each kind, and each
        decline at preparation, once."""
        op = served.op
        label = f"{qualname(type(layer))}[{op}]"
        obj = served.stand_in(layer)
        weights = served.weights(layer)
        try:
            resolution = self.runtime.resolve(op)
            # Under strict mode the chain is the chosen implementation alone (its decline at
            # preparation is an error); the fallbacks it cut off are passed on unprepared and
            # never called, so that the binder turns a declined call into StrictModeError.
            prepared = prepare_chain(op, resolution.chain, obj, weights, strict=resolution.strict)
        except NoImplementationError as exc:
            raise QuantizationNotServed(
                f"{label} ({served.scheme}): {exc}; on sglang-fl's platform SGLang has no other "
                "kernel for it"
            ) from exc
        self._report_declines(prepared)
        cut = resolution.decision.fallbacks if resolution.strict else ()
        chain = FallbackChain(
            op, (*prepared.chain, *cut), strict=resolution.strict, on_decline=self._declined
        )
        fn = self.verifier.wrap(chain.fn, chain.impls[0], label, chain=chain)
        self._report_layer(label, op, served, sglang_method, prepared)
        return BoundLayer(op, fn, obj, weights, chain.impls[0].impl_id)

    def _declined(self, decline: Decline) -> None:
        """A call a layer's chain handed on: one ``fallback`` record per implementation and
        reason in this process (each layer has its own chain)."""
        if self._once("call", decline.op, decline.impl_id, decline.reason):
            self.report.report_decline(decline)

    def _once(self, *key: str) -> bool:
        with self._lock:
            if key in self._reported:
                return False
            self._reported.add(key)
            return True

    def _report_layer(
        self, label: str, op: str, served: Served, sglang_method: str, prepared: PreparedChain
    ) -> None:
        chosen = prepared.chain[0]
        if not self._once("layer", label, chosen.impl_id, served.scheme):
            return
        self.report.emit(
            ReportEvent.LAYER,
            layer=label,
            op=op,
            sglang_forward=sglang_method,
            runner=Runner.SGLANG_FL,
            scheme=served.scheme,
            fallbacks=[impl.impl_id for impl in prepared.chain[1:]],
            **impl_fields(chosen),
        )

    def _report_declines(self, prepared: PreparedChain) -> None:
        for impl, reason in prepared.declined:
            if not self._once("prepare", prepared.op, impl.impl_id, reason):
                continue
            self.report.emit(
                ReportEvent.FALLBACK,
                op=prepared.op,
                impl_id=impl.impl_id,
                next_impl_id=prepared.chain[0].impl_id,
                reason=reason,
                stage="prepare",
                runner=Runner.SGLANG_FL,
            )


_routing: QuantRouting | None = None
_routing_lock = threading.Lock()


def routing() -> QuantRouting:
    """This process's :class:`QuantRouting`: over the SGLang router's runtime, report and
    verifier when sglang-fl's plugin registered here, else its own over the runtime."""
    global _routing
    with _routing_lock:
        if _routing is None:
            from ..router import get_router

            router = get_router()
            if router is not None:
                _routing = QuantRouting(router.runtime, router.report, router.verifier)
            else:
                runtime = get_runtime()
                config = runtime.config
                report = DispatchReport(config.dispatch_log)
                verifier = Verifier(
                    config.verify,
                    config.verify_ops,
                    lambda rec: report.emit(ReportEvent.VERIFY, **rec),
                )
                _routing = QuantRouting(runtime, report, verifier)
        return _routing


def _release(layer: Any, names: tuple[str, ...]) -> None:
    """Free the storage of parameters re-laid out into the op's weights; keep their shapes."""
    shapes = getattr(layer, "_sglang_fl_released", {})
    for name in names:
        param = getattr(layer, name)
        shapes.setdefault(name, tuple(param.shape))
        param.data = param.data.new_empty(0)
    layer._sglang_fl_released = shapes


def _restore(layer: Any) -> None:
    """Give released parameters back their shapes (SGLang is about to load them again)."""
    for name, shape in getattr(layer, "_sglang_fl_released", {}).items():
        param = getattr(layer, name)
        param.data = param.data.new_empty(shape)
    layer._sglang_fl_released = {}


class SglangFlLinearMethod(LinearMethodBase):
    """A quantized linear layer: SGLang's parameters, the op sglang-fl chose.

    SGLang's linear layers pick their weight loader by the method's class name
    (``linear.py`` ``WEIGHT_LOADER_V2_SUPPORTED``); every method this one wraps creates
    SGLang's parameter classes (``ModelWeightParameter``, ``BlockQuantScaleParameter``,
    ``PackedvLLMParameter``, ...), which that loader fills, so the name is listed there.
    """

    def __init__(self, delegate: Any, served: Served) -> None:
        self.delegate = delegate
        self.served = served
        self.quant_config = getattr(delegate, "quant_config", None)

    def create_weights(self, layer: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        self.delegate.create_weights(layer, *args, **kwargs)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        bound = routing().bind(layer, self.served, type(self.delegate).__name__)
        setattr(layer, BOUND_ATTR, bound)
        if self.served.replaces:
            _release(layer, self.served.replaces)

    def restore_weights_before_loading(self, layer: torch.nn.Module) -> None:
        _restore(layer)

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        bound: BoundLayer = getattr(layer, BOUND_ATTR)
        if x.dim() == 2:
            out: torch.Tensor = bound.fn(bound.obj, x, *bound.weights, bias)
            return out
        rows = x.reshape(-1, x.shape[-1])
        out = bound.fn(bound.obj, rows, *bound.weights, bias)
        return out.reshape(*x.shape[:-1], out.shape[-1])


def moe_runner_problem(layer: Any, config: Any) -> str | None:
    """Why a MoE layer's runner configuration is outside the quantized MoE ops, or ``None``."""
    problem = runner_config_problem(config)
    if problem is not None:
        return problem
    local, total = layer.num_local_experts, layer.num_experts
    if local != total:
        return f"expert parallelism ({local} of {total} experts here)"
    if getattr(layer, "with_bias", False) or getattr(layer, "gate_up_interleaved", False):
        return "expert biases or interleaved gate/up weights"
    return None


class SglangFlMoEMethod(FusedMoEMethodBase):
    """Quantized MoE experts: SGLang's parameters and routing, the op sglang-fl chose."""

    def __init__(self, delegate: Any, served: Served) -> None:
        self.delegate = delegate
        self.served = served
        self.quant_config = getattr(delegate, "quant_config", None)
        self.activation = MoeActivation.SILU.value

    @property
    def load_up_proj_weight_first(self) -> bool:  # read by FusedMoE's weight loader
        return bool(getattr(self.delegate, "load_up_proj_weight_first", False))

    def create_weights(self, layer: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        self.delegate.create_weights(layer, *args, **kwargs)

    def create_moe_runner(self, layer: torch.nn.Module, moe_runner_config: Any) -> None:
        problem = moe_runner_problem(layer, moe_runner_config)
        if problem is not None:
            raise QuantizationNotServed(
                f"{qualname(type(layer))} ({self.served.scheme}): {problem} is outside "
                f"{self.served.op}; on sglang-fl's platform SGLang has no other kernel for it"
            )
        self.activation = moe_runner_config.activation
        self.moe_runner_config = moe_runner_config

    def get_moe_runner_backend(self, layer: torch.nn.Module) -> Any:
        return None  # a direct kernel consuming SGLang's standard top-k output

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        bound = routing().bind(layer, self.served, type(self.delegate).__name__)
        setattr(layer, BOUND_ATTR, bound)

    def apply(self, layer: torch.nn.Module, dispatch_output: Any) -> Any:
        from sglang.srt.layers.moe.token_dispatcher import StandardCombineInput
        from sglang.srt.layers.moe.topk import TopKOutputChecker

        bound: BoundLayer = getattr(layer, BOUND_ATTR)
        topk_output = dispatch_output.topk_output
        if not TopKOutputChecker.format_is_standard(topk_output):
            raise QuantizationNotServed(
                f"{bound.op}: a non-standard top-k output ({type(topk_output).__name__}) "
                "reached sglang-fl's quantized MoE; it takes SGLang's standard top-k output"
            )
        out = bound.fn(
            bound.obj,
            dispatch_output.hidden_states,
            *bound.weights,
            topk_output.topk_weights,
            topk_output.topk_ids,
            self.activation,
        )
        return StandardCombineInput(hidden_states=out)


if SglangFlLinearMethod.__name__ not in sglang_linear.WEIGHT_LOADER_V2_SUPPORTED:
    sglang_linear.WEIGHT_LOADER_V2_SUPPORTED.append(SglangFlLinearMethod.__name__)
