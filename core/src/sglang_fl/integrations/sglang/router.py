"""The process's SGLang layer router: the state the entry point sets and the backends read.

:func:`~sglang_fl.integrations.sglang.plugin.register` builds one :class:`Router` per process
and keeps it here (:func:`keep_router`); SGLang's attention backend, built later by SGLang
itself, binds its kernels through the same router (:func:`get_router`), so both report into one
dispatch report and share one verifier.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ...dispatch_report import DispatchReport, Runner
from ...runtime import Runtime
from ..routing import Forward, LayerRouter
from .bridges import BRIDGES
from .compat import SglangApi

__all__ = ["Router", "get_router", "keep_router"]


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
        return self.bind(layer, plan.bridge, plan.resolution, sglang_forward)


_router: Router | None = None
_router_lock = threading.Lock()


def get_router() -> Router | None:
    """The router registered in this process, or ``None`` before the plugin registered."""
    return _router


def keep_router(start: Callable[[], Router]) -> Router | None:
    """Run ``start`` and keep the router it returns, unless this process kept one already.

    Returns the new router, or ``None`` when one was kept before (``start`` did not run). A
    ``start`` that raises keeps nothing, so a later call tries again.
    """
    global _router
    with _router_lock:
        if _router is not None:
            return None
        _router = start()
        return _router
