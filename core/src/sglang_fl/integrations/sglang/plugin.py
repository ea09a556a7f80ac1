"""The ``sglang.srt.plugins`` entry point: route SGLang's standard layers through sglang-fl.

SGLang calls :func:`register` once in every process it starts (main, scheduler workers,
detokenizer). It loads sglang-fl's plugins (the process-wide runtime), then registers one
``AROUND`` hook with SGLang's ``HookRegistry`` on ``BaseFusedOp._resolve_forward_method``: the
method each fused-op instance calls once, lazily, to pick the forward it caches. The hook lets
SGLang resolve as usual, then, for a layer of a standard op, returns a bridge bound to the
implementation sglang-fl chose. Works the same on in-tree platforms (CUDA, NPU, ...) and on
out-of-tree ones, and leaves SGLang's per-call switches alone: an explicit ``backend=`` and
``SGLANG_FORCE_FUSED_OP_BACKEND`` are honoured by ``BaseFusedOp.forward`` before the cached
forward is consulted. Instances SGLang pinned in their ``__init__`` never resolve, so they keep
SGLang's choice.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...dispatch.resolve import Resolution
from ...errors import NoImplementationError
from ...graph import graph_safe
from ...runtime import Runtime, get_runtime
from ...schema import impl_fields
from .bridges import BRIDGES, Bridge
from .compat import RESOLVE_TARGET, SglangApi, find_sglang_api
from .kernel_functions import route_kernel_functions
from .report import DispatchReport, ReportEvent, Runner

__all__ = ["Router", "get_router", "register"]

_log = logging.getLogger("sglang_fl.integrations.sglang")

Forward = Callable[..., Any]


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _method_name(method: Any) -> str:
    return getattr(method, "__name__", None) or repr(method)


@dataclass(frozen=True)
class _Plan:
    """What happens to every instance of one layer class in this process."""

    op_name: str | None
    bridge: Bridge | None
    resolution: Resolution | None


class Router:
    """Decides, once per layer class and once per instance, which forward SGLang caches."""

    def __init__(self, api: SglangApi, runtime: Runtime, report: DispatchReport) -> None:
        self.api = api
        self.runtime = runtime
        self.report = report
        self._plans: dict[type, _Plan] = {}
        # (event, layer class, reason) already reported: refusals and handoffs, once each.
        self._reported: set[tuple[ReportEvent, type, str]] = set()
        self._lock = threading.RLock()

    # --- the hook -----------------------------------------------------------------------

    def resolve_forward(self, original: Callable[[Any], Forward], layer: Any) -> Forward:
        """AROUND hook on ``_resolve_forward_method``: runs once per layer instance."""
        sglang_forward = original(layer)
        cls = type(layer)
        plan = self._plans.get(cls) or self._plan(cls, sglang_forward)
        if plan.resolution is None or plan.bridge is None:
            return sglang_forward
        reason = plan.bridge.refuse_instance(layer)
        if reason is not None:
            self._note_refusal(cls, plan.op_name, reason, sglang_forward)
            return sglang_forward
        impl_id = plan.resolution.decision.chosen.impl_id
        fn = graph_safe(
            plan.resolution.op, plan.resolution.fn, impl_id, enabled=self.runtime.config.custom_ops
        )
        forward = plan.bridge.bind(layer, fn, sglang_forward, self._handoff(cls, sglang_forward))
        # SGLang's fused-op trace labels a cached forward by its name: make it say who runs.
        forward.__name__ = forward.__qualname__ = f"sglang_fl[{impl_id}]"
        forward.sglang_fl_impl_id = impl_id  # type: ignore[attr-defined]
        return forward

    # --- once per class -----------------------------------------------------------------

    def _layer_base(self, cls: type) -> type | None:
        """The nearest class in ``cls``'s MRO that stands for a standard op, if any."""
        return next((klass for klass in cls.__mro__ if klass in self.api.layers), None)

    def _op_of(self, cls: type) -> str | None:
        base = self._layer_base(cls)
        return None if base is None else self.api.layers[base]

    def _plan(self, cls: type, sglang_forward: Forward) -> _Plan:
        with self._lock:
            plan = self._plans.get(cls)
            if plan is not None:
                return plan
            layer_base = self._layer_base(cls)
            op_name = None if layer_base is None else self.api.layers[layer_base]
            bridge = BRIDGES.get(op_name) if op_name else None
            resolution = None
            reason = "no standard sglang-fl op for this layer; SGLang runs it"
            if bridge is not None and op_name is not None and layer_base is not None:
                refusal = bridge.refuse_class(cls, layer_base)
                if refusal is not None:
                    reason = refusal
                else:
                    try:
                        resolution = self.runtime.resolve(op_name)
                    except NoImplementationError as exc:
                        if self.runtime.config.strict:
                            raise
                        reason = f"{exc}; left to SGLang"
            plan = _Plan(op_name, bridge, resolution)
            self._plans[cls] = plan
            fields: dict[str, Any] = {
                "layer": _qualname(cls),
                "op": op_name,
                "sglang_forward": _method_name(sglang_forward),
            }
            if resolution is not None:
                decision = resolution.decision
                fields.update(runner=Runner.SGLANG_FL, **impl_fields(decision.chosen))
                fields["fallbacks"] = [impl.impl_id for impl in decision.fallbacks]
            else:
                fields.update(runner=Runner.SGLANG, reason=reason)
            self.report.emit(ReportEvent.LAYER, **fields)
            return plan

    # --- rare paths, reported once --------------------------------------------------------

    def _note_refusal(
        self, cls: type, op_name: str | None, reason: str, sglang_forward: Forward
    ) -> None:
        self._report_once(ReportEvent.LAYER, cls, op_name, reason, sglang_forward, scope="instance")

    def _handoff(self, cls: type, sglang_forward: Forward) -> Callable[[str], None]:
        def handoff(reason: str) -> None:
            self._report_once(ReportEvent.HANDOFF, cls, self._op_of(cls), reason, sglang_forward)

        return handoff

    def _report_once(
        self,
        event: ReportEvent,
        cls: type,
        op_name: str | None,
        reason: str,
        sglang_forward: Forward,
        **extra: str,
    ) -> None:
        """Report that SGLang runs ``cls`` (or one call of it) for ``reason``, once per process."""
        key = (event, cls, reason)
        if key in self._reported:  # the common case per call: no lock
            return
        with self._lock:
            if key in self._reported:
                return
            self._reported.add(key)
        self.report.emit(
            event,
            layer=_qualname(cls),
            op=op_name,
            runner=Runner.SGLANG,
            sglang_forward=_method_name(sglang_forward),
            reason=reason,
            **extra,
        )


_router: Router | None = None
_router_lock = threading.Lock()


def get_router() -> Router | None:
    """The router registered in this process, or ``None`` before :func:`register` ran."""
    return _router


def register() -> None:
    """``sglang.srt.plugins`` entry point: hook SGLang's op resolution (idempotent)."""
    global _router
    with _router_lock:
        if _router is not None:
            return
        api = find_sglang_api()
        runtime = get_runtime()
        report = DispatchReport(runtime.config.dispatch_log)
        router = Router(api, runtime, report)
        api.hook_registry.register(RESOLVE_TARGET, router.resolve_forward, api.hook_type_around)
        route_kernel_functions(api, runtime, report)
        _router = router
    report.emit(
        ReportEvent.PLUGIN,
        sglang_version=api.version,
        hook=RESOLVE_TARGET,
        platform=runtime.platform(),
        plugins=[p.summary() for p in runtime.plugins],
        sglang_force_fused_op_backend=os.environ.get("SGLANG_FORCE_FUSED_OP_BACKEND"),
    )
