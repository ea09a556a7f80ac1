"""Bridges of SGLang's activation layers beyond ``SiluAndMul`` (``sglang.srt.layers.activation``).

Each layer's forward takes one tensor ``x`` of any rank; the standard ops take
``[num_tokens, width]``, so leading dims are flattened and restored around the call.
"""

from __future__ import annotations

from typing import Any

import torch

from ...ops.gelu_and_mul import APPROXIMATIONS
from .bridges import Bridge, Forward, Handoff

__all__ = ["GeluAndMulBridge", "GeluNewBridge", "GeluQuickBridge"]


def rows_forward(layer: Any, fn: Forward, *, halves: bool) -> Forward:
    """``forward(x)`` calling ``fn(layer, x_2d)``; ``halves``: the op halves the last dim."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            rows: torch.Tensor = fn(layer, x)
            return rows
        lead, width = x.shape[:-1], x.shape[-1]
        out: torch.Tensor = fn(layer, x.reshape(-1, width))
        return out.reshape(*lead, width // 2 if halves else width)

    return forward


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
