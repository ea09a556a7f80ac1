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
from typing import Any

from ...dispatch_report import DispatchReport, ReportEvent, Runner
from ...runtime import Runtime, get_runtime
from ..routing import Forward, LayerRouter
from . import attention_backend
from .bridges import BRIDGES
from .collectives import route_collectives
from .compat import RESOLVE_TARGET, SglangApi, find_sglang_api
from .kernel_functions import route_kernel_functions
from .linear_attention import route_linear_attention

__all__ = ["Router", "get_router", "register"]

_log = logging.getLogger("sglang_fl.integrations.sglang")


class Router(LayerRouter):
    """Decides, once per layer class and once per instance, which forward SGLang caches."""

    def __init__(self, api: SglangApi, runtime: Runtime, report: DispatchReport) -> None:
        super().__init__(api.layers, BRIDGES, runtime, report, Runner.SGLANG, "SGLang")
        self.api = api

    # --- the hook -----------------------------------------------------------------------

    def resolve_forward(self, original: Callable[[Any], Forward], layer: Any) -> Forward:
        """AROUND hook on ``_resolve_forward_method``: runs once per layer instance."""
        sglang_forward = original(layer)
        cls = type(layer)
        plan = self._plans.get(cls) or self._plan(cls, sglang_forward)
        if plan.resolution is None or plan.bridge is None:
            return sglang_forward
        return self._bind(layer, plan.bridge, plan.resolution, sglang_forward)


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
        attention_backend.install()
        route_linear_attention(api, runtime, report)
        route_collectives(api, runtime, report)
        _router = router
    report.emit(
        ReportEvent.PLUGIN,
        sglang_version=api.version,
        hook=RESOLVE_TARGET,
        platform=runtime.platform(),
        plugins=[p.summary() for p in runtime.plugins],
        sglang_force_fused_op_backend=os.environ.get("SGLANG_FORCE_FUSED_OP_BACKEND"),
    )
