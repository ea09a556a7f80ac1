"""The ``vllm.general_plugins`` entry point: route vLLM's standard layers through sglang-fl.

vLLM calls :func:`register` once in every process it starts (the front end, the engine core
and its workers). It loads sglang-fl's plugins (the process-wide runtime, as for SGLang), then
wraps ``CustomOp.dispatch_forward``: the method each vLLM layer calls once, in its
``__init__``, to pick the forward it keeps in ``_forward_method``. The wrapper lets vLLM pick as
usual, then, for a layer of a standard op, returns a bridge bound to the implementation
sglang-fl chose.

Enabling: vLLM runs a layer's ``forward_native`` unless ``compilation_config.custom_ops``
enables the layer's custom op, and its default (``"none"`` under torch.compile) cannot say
whether a user asked for it. sglang-fl therefore routes every standard layer, custom ops on or
off, except one whose op the config disables by name (``custom_ops=["-rms_norm"]``): that
layer keeps vLLM's own forward. ``VLLM_PLUGINS`` without ``sglang_fl`` turns sglang-fl off.

It also registers ``sglang_fl`` as a provider of vLLM's norm IR ops (``ir_providers.py``),
which ``kernel_config.ir_op_priority`` can select.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ...dispatch_report import DispatchReport, ReportEvent, Runner
from ...runtime import Runtime, get_runtime
from ..routing import Forward, LayerRouter
from .bridges import BRIDGES
from .compat import DISPATCH_TARGET, VllmApi, find_vllm_api
from .ir_providers import PROVIDER as IR_PROVIDER
from .ir_providers import register_ir_providers

__all__ = ["VllmRouter", "get_router", "register"]

DispatchForward = Callable[[Any, bool], Forward]


class VllmRouter(LayerRouter):
    """Decides, once per layer class and once per instance, which forward a vLLM layer keeps."""

    def __init__(self, api: VllmApi, runtime: Runtime, report: DispatchReport) -> None:
        super().__init__(api.layers, BRIDGES, runtime, report, Runner.VLLM, "vLLM")
        self.api = api

    def dispatch_forward(
        self, original: DispatchForward, layer: Any, compile_native: bool
    ) -> Forward:
        """Around ``CustomOp.dispatch_forward``: runs once per layer instance, in its ``__init__``.

        vLLM calls it from ``CustomOp.__init__``, before the layer's own ``__init__`` has set
        its attributes (weight, head_size, ...), so the bridge is bound on the layer's first
        call, which then replaces itself in ``_forward_method``: once per layer, as in SGLang.
        """
        vllm_forward = original(layer, compile_native)
        cls = type(layer)
        plan = self._plans.get(cls) or self._plan(cls, vllm_forward)
        if plan.resolution is None or plan.bridge is None:
            return vllm_forward
        disabled = self.api.disabled_by_config(layer)
        if disabled is not None:
            reason = f"compilation_config.custom_ops has {disabled!r}; vLLM's own forward runs it"
            self._note_refusal(cls, plan.op_name, reason, vllm_forward)
            return vllm_forward

        bridge, resolution = plan.bridge, plan.resolution

        def bind_on_first_call(*args: Any, **kwargs: Any) -> Any:
            forward = self.bind(layer, bridge, resolution, vllm_forward)
            layer._forward_method = forward
            return forward(*args, **kwargs)

        return bind_on_first_call


_router: VllmRouter | None = None
_router_lock = threading.Lock()


def get_router() -> VllmRouter | None:
    """The router registered in this process, or ``None`` before :func:`register` ran."""
    return _router


def _hook(api: VllmApi, router: VllmRouter) -> None:
    """Wrap ``CustomOp.dispatch_forward`` so that every layer built from now on asks ``router``."""
    original: DispatchForward = api.custom_op.dispatch_forward  # type: ignore[attr-defined]

    def dispatch_forward(layer: Any, compile_native: bool = False) -> Forward:
        return router.dispatch_forward(original, layer, compile_native)

    dispatch_forward.__wrapped__ = original  # type: ignore[attr-defined]
    api.custom_op.dispatch_forward = dispatch_forward  # type: ignore[attr-defined]


def register() -> None:
    """``vllm.general_plugins`` entry point: hook vLLM's forward dispatch (idempotent)."""
    global _router
    with _router_lock:
        if _router is not None:
            return
        api = find_vllm_api()
        runtime = get_runtime()
        report = DispatchReport(runtime.config.dispatch_log)
        router = VllmRouter(api, runtime, report)
        _hook(api, router)
        ir_refusal = register_ir_providers(runtime, report)
        _router = router
    report.emit(
        ReportEvent.PLUGIN,
        engine="vllm",
        vllm_version=api.version,
        hook=DISPATCH_TARGET,
        ir_provider=IR_PROVIDER if ir_refusal is None else None,
        ir_provider_reason=ir_refusal,
        plugins=[p.summary() for p in runtime.plugins],
    )
