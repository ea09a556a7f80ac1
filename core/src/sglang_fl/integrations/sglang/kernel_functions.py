"""Route the kernel functions SGLang's model code calls directly (see ``ops.kernel_functions``).

These are plain functions, not fused ops, so the router's ``_resolve_forward_method`` hook never
sees them. Each is replaced where SGLang's model code looks it up, with one ``REPLACE`` hook in
SGLang's ``HookRegistry`` per function: ``apply_hooks()`` (run right after the plugins load,
before any model module is imported) patches the defining module and every module already
holding a ``from ... import`` binding of it, so model modules imported later bind the
replacement too. The op is resolved once (:func:`.function_routes.route_functions`); the
replacement only translates arguments.

A function is replaced when SGLang's own kernel cannot run in this process (its Triton kernel
needs an active Triton driver: a GPU Triton knows), or when a vendor or flagos implementation
was chosen over the reference. Where SGLang's Triton kernel runs and only the reference
implements the op, SGLang keeps its kernel, and the report says so.
"""

from __future__ import annotations

import torch

from ...dispatch_report import DispatchReport
from ...runtime import Runtime
from ...verify import Verifier
from .compat import SglangApi
from .function_routes import Forward, FunctionRoute, route_functions

__all__ = ["FUNCTION_ROUTES", "route_kernel_functions"]


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


def route_kernel_functions(
    api: SglangApi, runtime: Runtime, report: DispatchReport, verifier: Verifier | None = None
) -> None:
    """Register a ``REPLACE`` hook for each function whose op should run through sglang-fl."""
    route_functions(api, runtime, report, FUNCTION_ROUTES, api.hook_type_replace, verifier=verifier)
