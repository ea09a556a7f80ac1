"""sglang-fl as a provider of vLLM's IR ops (``kernel_config.ir_op_priority``).

vLLM 0.32 moves its norms onto IR ops: ``RMSNorm.forward_native`` and ``GemmaRMSNorm``'s call
``vllm.ir.ops.rms_norm`` / ``fused_add_rms_norm``, and each IR op runs the first provider of its
priority list that supports the call. This module registers the provider ``sglang_fl`` for
both, backed by the ``rms_norm`` implementation sglang-fl chose, so
``ir_op_priority={"rms_norm": ["sglang_fl"], "fused_add_rms_norm": ["sglang_fl"]}`` sends
those ops to it wherever vLLM calls them (vLLM appends its own defaults, ``native`` last).

An IR op has no layer: each call hands ``fn`` a stand-in carrying ``weight`` and
``variance_epsilon``. Calls the standard op does not cover (no weight; statistics over part of
the row) are declined through ``supports_args``, so vLLM runs its next provider.

No ``from __future__ import annotations`` here: vLLM derives each provider's torch schema from
its annotations and requires it to equal the native implementation's.
"""

from types import SimpleNamespace
from typing import Any

from torch import Tensor

from ...dispatch_report import DispatchReport, ReportEvent, Runner
from ...errors import NoImplementationError
from ...runtime import Runtime

__all__ = ["PROVIDER", "register_ir_providers"]

PROVIDER = "sglang_fl"


def _layer(weight: Tensor, epsilon: float) -> SimpleNamespace:
    return SimpleNamespace(weight=weight, variance_epsilon=epsilon, hidden_size=weight.shape[0])


def _rows(x: Tensor) -> Tensor:
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def _supports_rms_norm(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> bool:
    return weight is not None and variance_size is None


def _supports_fused_add_rms_norm(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None = None,
) -> bool:
    return weight is not None and variance_size is None


def _providers(fn: Any) -> tuple[Any, Any]:
    """The two IR provider functions, closing over ``fn`` (the chosen ``rms_norm``)."""

    def rms_norm(
        x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
    ) -> Tensor:
        assert weight is not None  # supports_args declines the call otherwise
        out: Tensor = fn(_layer(weight, epsilon), _rows(x))
        return out.reshape(x.shape)

    def fused_add_rms_norm(
        x: Tensor,
        x_residual: Tensor,
        weight: Tensor | None,
        epsilon: float,
        variance_size: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        assert weight is not None  # supports_args declines the call otherwise
        out, residual = fn(_layer(weight, epsilon), _rows(x), _rows(x_residual))
        return out.reshape(x.shape), residual.reshape(x_residual.shape)

    return rms_norm, fused_add_rms_norm


def register_ir_providers(runtime: Runtime, report: DispatchReport) -> str | None:
    """Register ``sglang_fl`` on vLLM's norm IR ops; returns why not, or ``None`` when done."""
    try:
        from vllm import ir
    except ImportError as exc:  # a vLLM before its IR ops: CustomOp routing is the only path
        return f"vllm.ir is not importable ({exc})"
    rms_norm_op = getattr(ir.ops, "rms_norm", None)
    fused_op = getattr(ir.ops, "fused_add_rms_norm", None)
    if rms_norm_op is None or fused_op is None or not hasattr(fused_op, "maybe_inplace"):
        return "vllm.ir.ops lacks rms_norm or an in-place fused_add_rms_norm"
    try:
        resolution = runtime.resolve("rms_norm")
    except NoImplementationError as exc:
        if runtime.config.strict:
            raise
        return f"{exc}; vLLM's own providers only"
    rms_norm, fused_add_rms_norm = _providers(resolution.fn)
    rms_norm_op.register_impl(PROVIDER, supports_args=_supports_rms_norm)(rms_norm)
    # The standard op may write both results into x and residual: vLLM clones for the
    # functional form of an in-place provider.
    fused_op.register_impl(PROVIDER, supports_args=_supports_fused_add_rms_norm, inplace=True)(
        fused_add_rms_norm
    )
    for op in (rms_norm_op, fused_op):
        report.emit(
            ReportEvent.FUNCTION,
            function=f"vllm.ir.ops.{op.name}",
            op="rms_norm",
            provider=PROVIDER,
            runner=Runner.SGLANG_FL,
            **report.decision_fields(resolution.decision),
        )
    return None
