"""Bridges: SGLang layer call arguments -> the standard op signatures, bound once per layer.

A bridge is built once per layer instance, when SGLang resolves that instance's forward. It
closes over the chosen implementation (``fn``), the layer, and SGLang's own forward for the
few argument combinations the standard ops do not cover. Per call it only translates
arguments: no policy read, no registry lookup, no pluggy call.

Whether a class or an instance may be bridged at all is decided here too, once: a bridge must
compute exactly what the layer's ``forward_native`` computes, or the layer stays with SGLang.

The package holds one module per op family (``activation``, ``normalization``, ``rotary``,
``moe``, ``attention``), each subclassing :class:`~.base.Bridge`; this module only gathers them
into :data:`BRIDGES`, the table :mod:`..plugin` routes with. A new family adds a module and one
line here.
"""

from __future__ import annotations

from ...routing import Forward, Handoff
from .activation import GeluAndMulBridge, GeluNewBridge, GeluQuickBridge, SiluAndMulBridge
from .attention import ClampPositionBridge
from .base import Bridge
from .moe import FusedMoEBridge, TopKBridge
from .normalization import GemmaRMSNormBridge, LayerNormBridge, RMSNormBridge
from .rotary import MRotaryEmbeddingBridge, RotaryEmbeddingBridge

__all__ = ["BRIDGES", "Bridge", "Forward", "Handoff"]

BRIDGES: dict[str, Bridge] = {
    bridge.op_name: bridge
    for bridge in (
        SiluAndMulBridge(),
        RMSNormBridge(),
        RotaryEmbeddingBridge(),
        GeluAndMulBridge(),
        GeluNewBridge(),
        GeluQuickBridge(),
        GemmaRMSNormBridge(),
        LayerNormBridge(),
        MRotaryEmbeddingBridge(),
        ClampPositionBridge(),
        TopKBridge(),
        FusedMoEBridge(),
    )
}
