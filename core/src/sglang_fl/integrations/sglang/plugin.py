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
SGLang's choice. The router itself and the process's one instance live in :mod:`.router`,
which the attention backend reads too.
"""

from __future__ import annotations

import os

from ...dispatch_report import DispatchReport, ReportEvent
from ...runtime import get_runtime
from . import attention_backend
from .collectives import route_collectives
from .compat import RESOLVE_TARGET, find_sglang_api
from .kernel_functions import route_kernel_functions
from .linear_attention import route_linear_attention
from .router import Router, get_router, keep_router

__all__ = ["Router", "get_router", "register"]


def register() -> None:
    """``sglang.srt.plugins`` entry point: hook SGLang's op resolution (idempotent)."""
    router = keep_router(_start)
    if router is None:
        return
    router.report.emit(
        ReportEvent.PLUGIN,
        sglang_version=router.api.version,
        hook=RESOLVE_TARGET,
        platform=router.runtime.platform(),
        plugins=[p.summary() for p in router.runtime.plugins],
        sglang_force_fused_op_backend=os.environ.get("SGLANG_FORCE_FUSED_OP_BACKEND"),
    )


def _start() -> Router:
    """The process's router, with every SGLang seam hooked (kept by :func:`keep_router`)."""
    api = find_sglang_api()
    runtime = get_runtime()
    report = DispatchReport(runtime.config.dispatch_log)
    router = Router(api, runtime, report)
    api.hook_registry.register(RESOLVE_TARGET, router.resolve_forward, api.hook_type_around)
    route_kernel_functions(api, runtime, report, router.verifier)
    attention_backend.install()
    route_linear_attention(api, runtime, report, router.verifier)
    route_collectives(api, runtime, report)
    return router
