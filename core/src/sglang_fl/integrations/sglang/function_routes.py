"""Routing SGLang's plain kernel functions: one registration loop for every family of them.

Fused ops reach sglang-fl through the router's ``_resolve_forward_method`` hook; the functions
SGLang's model and backend code calls directly (``kernel_functions``, ``linear_attention``) are
each replaced or wrapped by one hook in SGLang's ``HookRegistry`` instead. For each
:class:`FunctionRoute`, :func:`route_functions` resolves the op once, binds its fallback chain
(a decline is a ``function`` record naming who declined, why, and who served), puts the
process's verifier around it (verify mode checks a function's first calls against the op's
reference, labelled by the function's dotted path), registers the hook the route's adapter
builds around it, and reports the outcome as one ``function`` record. That record says what
was *bound*, when the plugin loaded; a model that never calls the function leaves it at that.
The function's first call adds a ``called`` record naming the implementation that served it
(the chosen one, or the candidate a decline handed the call to).
A route is left to SGLang where no implementation survives (an error under
``SGLANG_FL_STRICT=1``), and where SGLang's Triton kernel runs here and only the reference
implements the op.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...dispatch.binder import Decline, DeclineSink, FirstCallSink
from ...dispatch.types import BackendImplKind, OpImpl
from ...dispatch_report import DispatchReport, ReportEvent, Runner
from ...errors import NoImplementationError
from ...graph import graph_safe
from ...ops.graph_spec import GRAPH_SPECS
from ...runtime import Runtime
from ...schema import impl_fields
from ...verify import Verifier
from .compat import SglangApi

__all__ = [
    "FunctionRoute",
    "report_declines",
    "report_first_call",
    "route_functions",
    "triton_driver_active",
]

Forward = Callable[..., Any]


@dataclass(frozen=True)
class FunctionRoute:
    """One SGLang function (or module method), the standard op computing it, the translation.

    ``adapt(fn)`` returns the hook registered for ``target``: SGLang's signature (an
    ``AROUND`` hook takes SGLang's original first), calling ``fn`` (the op's standard
    signature) for what the op's contract covers.
    """

    target: str  # dotted path of the function where SGLang defines it
    op_name: str
    adapt: Callable[[Forward], Forward]


def triton_driver_active() -> bool:
    """Whether Triton has a driver for a device here (what SGLang's Triton kernels need)."""
    try:
        from triton.backends import backends
    except ImportError:
        return False
    for backend in backends.values():
        try:
            if backend.driver.is_active():
                return True
        except Exception:  # a broken backend probe means "not this backend"
            continue
    return False


def route_functions(
    api: SglangApi,
    runtime: Runtime,
    report: DispatchReport,
    routes: Sequence[FunctionRoute],
    hook_type: Any,
    *,
    verifier: Verifier | None = None,
) -> None:
    """Register a ``hook_type`` hook for each route whose op runs through sglang-fl.

    An op with a graph spec (a decode step's function) is bound reachable under
    ``torch.compile`` when ``SGLANG_FL_CUSTOM_OPS`` asks for it (:func:`~sglang_fl.graph.
    graph_safe`); the others (prefill-only functions) never run in a compiled step.
    ``verifier`` (the router's, so that a process has one) checks the routed calls in verify
    mode.
    """
    triton_runs = triton_driver_active()
    for route in routes:
        fields: dict[str, Any] = {"function": route.target, "op": route.op_name}
        try:
            resolution = runtime.resolve(route.op_name)
        except NoImplementationError as exc:
            if runtime.config.strict:
                raise
            reason = f"{exc}; left to SGLang"
            rejected = report.rejected_once(exc.decision)
            report.emit(
                ReportEvent.FUNCTION, runner=Runner.SGLANG, reason=reason, **rejected, **fields
            )
            continue
        decision = resolution.decision
        chosen = decision.chosen
        if triton_runs and chosen.kind is BackendImplKind.REFERENCE:
            report.emit(
                ReportEvent.FUNCTION,
                runner=Runner.SGLANG,
                reason="SGLang's Triton kernel runs here and only the reference implements "
                f"{route.op_name}; left to SGLang",
                **report.rejected_once(decision),
                **fields,
            )
            continue
        runtime.bound(route.op_name, chosen)
        chain = resolution.bind(
            report_declines(report, route.target), report_first_call(report, route.target)
        )
        fn = chain.fn
        if route.op_name in GRAPH_SPECS:
            fn = graph_safe(
                route.op_name,
                fn,
                chosen.impl_id,
                enabled=runtime.config.custom_ops,
                traceable=chain.traceable,
            )
        if verifier is not None:  # after graph_safe: it steps aside while dynamo traces
            fn = verifier.wrap(fn, chosen, route.target, chain=chain)
        hook = route.adapt(fn)
        hook.__qualname__ = f"sglang_fl[{chosen.impl_id}]"
        hook.sglang_fl_impl_id = chosen.impl_id  # type: ignore[attr-defined]
        api.hook_registry.register(route.target, hook, hook_type)
        report.emit(
            ReportEvent.FUNCTION,
            runner=Runner.SGLANG_FL,
            **report.decision_fields(decision),
            **fields,
        )


def report_declines(report: DispatchReport, target: str) -> DeclineSink:
    """The decline sink of ``target``'s chain: a ``function`` record naming the implementation
    that declined, why, and the one the call went to."""

    def report_decline(decline: Decline) -> None:
        report.emit(
            ReportEvent.FUNCTION,
            runner=Runner.SGLANG_FL,
            function=target,
            op=decline.op,
            declined_by=decline.impl_id,
            reason=decline.reason,
            served_by=decline.next_impl_id,
        )

    return report_decline


def report_first_call(report: DispatchReport, target: str) -> FirstCallSink:
    """The first-call sink of ``target``'s chain: a ``called`` record naming the function, its
    op and the implementation that served the call (with its provenance)."""

    def report_called(impl: OpImpl) -> None:
        report.emit(
            ReportEvent.CALLED,
            runner=Runner.SGLANG_FL,
            function=target,
            op=impl.op_name,
            **impl_fields(impl),
        )

    return report_called
