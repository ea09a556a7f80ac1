"""Bridges of vLLM's activation layers (``vllm.model_executor.layers.activation``)."""

from __future__ import annotations

from typing import Any

from ....ops.activation.gelu_and_mul import APPROXIMATIONS
from ...routing import Forward, Handoff, rows_forward
from .base import VllmBridge

__all__ = ["GeluAndMulBridge", "GeluNewBridge", "GeluQuickBridge", "SiluAndMulBridge"]


class SiluAndMulBridge(VllmBridge):
    op_name = "silu_and_mul"

    def bind(self, layer: Any, fn: Forward, vllm_forward: Forward, handoff: Handoff) -> Forward:
        return rows_forward(layer, fn, halves=True)


class GeluAndMulBridge(VllmBridge):
    op_name = "gelu_and_mul"

    def refuse_instance(self, layer: Any) -> str | None:
        if layer.approximate not in APPROXIMATIONS:
            return (
                f"GeluAndMul approximate={layer.approximate!r} is outside gelu_and_mul "
                f"({', '.join(APPROXIMATIONS)}); left to vLLM"
            )
        return None

    def bind(self, layer: Any, fn: Forward, vllm_forward: Forward, handoff: Handoff) -> Forward:
        return rows_forward(layer, fn, halves=True)


class ElementwiseBridge(VllmBridge):
    """``NewGELU`` and ``QuickGELU``: one tensor in, one of the same shape out."""

    def bind(self, layer: Any, fn: Forward, vllm_forward: Forward, handoff: Handoff) -> Forward:
        return rows_forward(layer, fn, halves=False)


class GeluNewBridge(ElementwiseBridge):
    op_name = "gelu_new"


class GeluQuickBridge(ElementwiseBridge):
    op_name = "gelu_quick"
