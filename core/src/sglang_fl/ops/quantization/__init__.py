"""Quantized ops: W8A8 int8, FP8 (per channel and 128x128 block) and W4A16/W8A16 linear layers,
and W8A8 int8 / FP8 MoE experts, each with the numerics of the checkpoint format it serves.

``linear`` holds the linear ops, ``moe`` the expert ops, ``numerics`` the quantization
arithmetic their references share (activation rules, dequantization, packing). Each op's
weights are its contract's ``weights``: an implementation may prepare its own layout of them
once, at load (``OpImpl.prepare``).
"""

from __future__ import annotations

from .linear import W8A8_BLOCK_FP8_LINEAR, W8A8_FP8_LINEAR, W8A8_INT8_LINEAR, WNA16_LINEAR
from .moe import FUSED_MOE_W8A8_FP8, FUSED_MOE_W8A8_INT8
from .numerics import ActQuant

__all__ = ["QUANTIZATION_OPS", "ActQuant"]

QUANTIZATION_OPS = (
    W8A8_INT8_LINEAR,
    W8A8_FP8_LINEAR,
    W8A8_BLOCK_FP8_LINEAR,
    WNA16_LINEAR,
    FUSED_MOE_W8A8_INT8,
    FUSED_MOE_W8A8_FP8,
)
