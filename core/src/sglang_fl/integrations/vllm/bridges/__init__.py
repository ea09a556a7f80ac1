"""Bridges: vLLM layer call arguments -> the standard op signatures, bound once per layer.

The op implementations are the ones SGLang's bridges call; only the call shapes differ
(vLLM's rope takes ``(positions, query, key=None)``, its ``LayerNorm`` keeps ``eps`` and
reduces in the wider of the input and weight dtypes, ...). A bridge must compute exactly what
the layer's ``forward_native`` computes, or the layer (or the one call) stays with vLLM.

One module per op family (``activation``, ``normalization``, ``rotary``), each subclassing
:class:`~.base.VllmBridge`; this module gathers them into :data:`BRIDGES`, the table
:mod:`..plugin` routes with.
"""

from __future__ import annotations

from .activation import GeluAndMulBridge, GeluNewBridge, GeluQuickBridge, SiluAndMulBridge
from .base import VllmBridge
from .normalization import GemmaRMSNormBridge, LayerNormBridge, RMSNormBridge
from .rotary import MRotaryEmbeddingBridge, RotaryEmbeddingBridge

__all__ = ["BRIDGES", "VllmBridge"]

BRIDGES: dict[str, VllmBridge] = {
    bridge.op_name: bridge
    for bridge in (
        SiluAndMulBridge(),
        GeluAndMulBridge(),
        GeluNewBridge(),
        GeluQuickBridge(),
        RMSNormBridge(),
        GemmaRMSNormBridge(),
        LayerNormBridge(),
        RotaryEmbeddingBridge(),
        MRotaryEmbeddingBridge(),
    )
}
