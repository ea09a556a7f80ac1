"""Route the kernel functions SGLang's model code calls directly (see ``ops.kernel_functions``).

These are plain functions, not fused ops, so the router's ``_resolve_forward_method`` hook never
sees them. Each is replaced where SGLang's model code looks it up, with one ``REPLACE`` hook in
SGLang's ``HookRegistry`` per function: ``apply_hooks()`` (run right after the plugins load,
before any model module is imported) patches the defining module and every module already
holding a ``from ... import`` binding of it, so model modules imported later bind the
replacement too. The op is resolved once, here; the replacement only translates arguments.

A function is replaced when SGLang's own kernel cannot run in this process (its Triton kernel
needs an active Triton driver: a GPU Triton knows), or when a vendor or flagos implementation
was chosen over the reference. Where SGLang's Triton kernel runs and only the reference
implements the op, SGLang keeps its kernel, and the report says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...dispatch.types import BackendImplKind
from ...dispatch_report import DispatchReport, ReportEvent, Runner
from ...errors import NoImplementationError
from ...graph import graph_safe
from ...runtime import Runtime
from ...schema import impl_fields
from .compat import SglangApi

__all__ = ["FUNCTION_ROUTES", "FunctionRoute", "route_kernel_functions", "triton_driver_active"]

Forward = Callable[..., Any]


@dataclass(frozen=True)
class FunctionRoute:
    """One SGLang kernel function, the standard op computing it, and the argument translation."""

    target: str  # dotted path of the function where SGLang defines it
    op_name: str
    adapt: Callable[[Forward], Forward]  # the chosen implementation -> SGLang's signature


def _gate_sigmoid_mul(fn: Forward) -> Forward:
    def fused_gate_sigmoid_mul(
        hidden_states: torch.Tensor, gate_weight: torch.Tensor, shared_output: torch.Tensor
    ) -> torch.Tensor:
        out: torch.Tensor = fn(None, hidden_states, gate_weight, shared_output)
        return out

    return fused_gate_sigmoid_mul


def _gate_sigmoid_mul_add(fn: Forward) -> Forward:
    def fused_gate_sigmoid_mul_add(
        hidden_states: torch.Tensor,
        gate_weight: torch.Tensor,
        shared_output: torch.Tensor,
        final_hidden_states: torch.Tensor,
    ) -> None:
        out = fn(None, hidden_states, gate_weight, shared_output, final_hidden_states)
        if out is not final_hidden_states:
            final_hidden_states.copy_(out)  # SGLang's function adds in place

    return fused_gate_sigmoid_mul_add


_ELEMENTWISE = "sglang.kernels.ops.elementwise.elementwise"
FUNCTION_ROUTES: tuple[FunctionRoute, ...] = (
    FunctionRoute(
        f"{_ELEMENTWISE}.fused_gate_sigmoid_mul", "fused_gate_sigmoid_mul", _gate_sigmoid_mul
    ),
    FunctionRoute(
        f"{_ELEMENTWISE}.fused_gate_sigmoid_mul_add",
        "fused_gate_sigmoid_mul",
        _gate_sigmoid_mul_add,
    ),
)


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


def route_kernel_functions(api: SglangApi, runtime: Runtime, report: DispatchReport) -> None:
    """Register a ``REPLACE`` hook for each function whose op should run through sglang-fl."""
    replace = api.hook_type_replace
    triton_runs = triton_driver_active()
    for route in FUNCTION_ROUTES:
        fields: dict[str, Any] = {"function": route.target, "op": route.op_name}
        try:
            resolution = runtime.resolve(route.op_name)
        except NoImplementationError as exc:
            if runtime.config.strict:
                raise
            report.emit(
                ReportEvent.FUNCTION,
                runner=Runner.SGLANG,
                reason=f"{exc}; left to SGLang",
                **fields,
            )
            continue
        chosen = resolution.decision.chosen
        if triton_runs and chosen.kind is BackendImplKind.REFERENCE:
            report.emit(
                ReportEvent.FUNCTION,
                runner=Runner.SGLANG,
                reason="SGLang's Triton kernel runs here and only the reference implements "
                f"{route.op_name}; left to SGLang",
                **fields,
            )
            continue
        fn = graph_safe(
            route.op_name, resolution.fn, chosen.impl_id, enabled=runtime.config.custom_ops
        )
        replacement = route.adapt(fn)
        replacement.__qualname__ = f"sglang_fl[{chosen.impl_id}]"
        replacement.sglang_fl_impl_id = chosen.impl_id  # type: ignore[attr-defined]
        api.hook_registry.register(route.target, replacement, replace)
        fallbacks = [impl.impl_id for impl in resolution.decision.fallbacks]
        report.emit(
            ReportEvent.FUNCTION,
            runner=Runner.SGLANG_FL,
            fallbacks=fallbacks,
            **impl_fields(chosen),
            **fields,
        )
