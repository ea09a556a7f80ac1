"""Bridges of SGLang's activation layers beyond ``SiluAndMul`` (``sglang.srt.layers.activation``).

Each layer's forward takes one tensor ``x`` of any rank: :func:`~..routing.rows_forward`.
"""

from __future__ import annotations

from typing import Any

from ....ops.activation.gelu_and_mul import APPROXIMATIONS
from ...routing import Forward, Handoff, rows_forward
from .base import Bridge

__all__ = ["GeluAndMulBridge", "GeluNewBridge", "GeluQuickBridge", "SiluAndMulBridge"]


class SiluAndMulBridge(Bridge):
    op_name = "silu_and_mul"

    def bind(self, layer: Any, fn: Forward, sglang_forward: Forward, handoff: Handoff) -> Forward:
        return rows_forward(layer, fn, halves=True)


class GeluAndMulBridge(Bridge):
    op_name = "gelu_and_mul"

    def refuse_instance(self, layer: Any) -> str | None:
        if layer.approximate not in APPROXIMATIONS:
            return (
                f"GeluAndMul approximate={layer.approximate!r} is outside gelu_and_mul "
                f"({', '.join(APPROXIMATIONS)}); left to SGLang"
            )
        return None

    def bind(self, layer: Any, fn: Forward, sglang_forward: Forward, handoff: Handoff) -> Forward:
        return rows_forward(layer, fn, halves=True)


class GeluNewBridge(Bridge):
    op_name = "gelu_new"

    def bind(self, layer: Any, fn: Forward, sglang_forward: Forward, handoff: Handoff) -> Forward:
        return rows_forward(layer, fn, halves=False)


class GeluQuickBridge(Bridge):
    op_name = "gelu_quick"

    def bind(self, layer: Any, fn: Forward, sglang_forward: Forward, handoff: Handoff) -> Forward:
        return rows_forward(layer, fn, halves=False)
