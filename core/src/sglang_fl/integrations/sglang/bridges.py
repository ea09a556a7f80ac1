"""Bridges: SGLang layer call arguments -> the standard op signatures, bound once per layer.

A bridge is built once per layer instance, when SGLang resolves that instance's forward. It
closes over the chosen implementation (``fn``), the layer, and SGLang's own forward for the
few argument combinations the standard ops do not cover. Per call it only translates
arguments: no policy read, no registry lookup, no pluggy call.

Whether a class or an instance may be bridged at all is decided here too, once: a bridge must
compute exactly what the layer's ``forward_native`` computes, or the layer stays with SGLang.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

from .. import routing
from ..routing import (
    Forward,
    Handoff,
    NormResult,
    norm_rows,
    rotate_heads,
    rows_forward,
)
from .compat import LAYER_CLASSES

__all__ = ["BRIDGES", "Bridge", "Forward", "Handoff"]


class Bridge(routing.Bridge):
    """How one standard op is bridged to its SGLang layer class."""

    engine = "SGLang"


class SiluAndMulBridge(Bridge):
    op_name = "silu_and_mul"

    def bind(self, layer: Any, fn: Forward, sglang_forward: Forward, handoff: Handoff) -> Forward:
        return rows_forward(layer, fn, halves=True)


def _fuses_input_quant(quant_linear: Any) -> bool:
    """Whether SGLang would fuse ``quant_linear``'s input quantization into this norm."""
    module = importlib.import_module(LAYER_CLASSES["rms_norm"][0])
    probe = getattr(module, "_fp8_static_input_scale", None)
    if probe is None:  # an SGLang without the probe: assume it may fuse, stay with SGLang
        return True
    return probe(quant_linear) is not None


class RMSNormBridge(Bridge):
    op_name = "rms_norm"

    def refuse_instance(self, layer: Any) -> str | None:
        # Options of SGLang's RMSNorm that change its math beyond the standard op.
        options = {
            "variance_size_override": getattr(layer, "variance_size_override", None) is not None,
            "cast_x_before_out_mul": bool(getattr(layer, "cast_x_before_out_mul", False)),
            "fp32_residual": bool(getattr(layer, "fp32_residual", False)),
            "override_orig_dtype": getattr(layer, "override_orig_dtype", None) is not None,
        }
        used = [name for name, on in options.items() if on]
        if used:
            return f"RMSNorm option(s) {', '.join(used)} are outside rms_norm; left to SGLang"
        # Models attach the consuming projection to every norm (fuse_input_quant); SGLang only
        # fuses the quantization when that projection is a static per-tensor FP8 linear.
        quant_linear = getattr(layer, "_quant_linear", None)
        if quant_linear is not None and _fuses_input_quant(quant_linear):
            return (
                "quant_linear: RMSNorm fused with the FP8 input quantization of "
                f"{type(quant_linear).__name__} is SGLang's own path; left to SGLang"
            )
        return None

    def bind(self, layer: Any, fn: Forward, sglang_forward: Forward, handoff: Handoff) -> Forward:
        hidden = layer.hidden_size
        sglang: Callable[..., NormResult] = sglang_forward

        def rms_norm(
            x: torch.Tensor,
            residual: torch.Tensor | None = None,
            post_residual_addition: torch.Tensor | None = None,
            quant_linear: Any = None,
        ) -> NormResult:
            if quant_linear is not None:
                handoff(
                    "a quant_linear argument (norm fused with input quantization) is "
                    "SGLang's own path"
                )
                return sglang(x, residual, post_residual_addition, quant_linear)
            if x.shape[-1] != hidden:
                raise ValueError(f"Expected hidden_size to be {hidden}, but found: {x.shape[-1]}")
            if residual is not None and post_residual_addition is not None:
                residual = residual + post_residual_addition
            return norm_rows(fn, layer, x, residual)

        return rms_norm


class RotaryEmbeddingBridge(Bridge):
    op_name = "rotary_embedding"

    def bind(self, layer: Any, fn: Forward, sglang_forward: Forward, handoff: Handoff) -> Forward:
        sglang: Callable[..., tuple[torch.Tensor, torch.Tensor]] = sglang_forward
        rotate, cos_sin = rotate_heads(layer, fn)

        def rotary_embedding(
            positions: torch.Tensor,
            query: torch.Tensor,
            key: torch.Tensor,
            offsets: torch.Tensor | None = None,
            fused_set_kv_buffer_arg: Any = None,
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if fused_set_kv_buffer_arg is not None:
                handoff(
                    "fused_set_kv_buffer_arg (rope fused with the KV-cache write) is "
                    "SGLang's own path"
                )
                return sglang(positions, query, key, offsets, fused_set_kv_buffer_arg)
            if "sin_cos_cache" in layer.__dict__:
                handoff("a precomputed sin_cos_cache on the layer is SGLang's own path")
                return sglang(positions, query, key, offsets, fused_set_kv_buffer_arg)
            if offsets is not None:
                positions = positions + offsets
            return rotate(positions.reshape(-1), query, key)

        rotary_embedding.cos_sin_halves = cos_sin.halves  # type: ignore[attr-defined]  # inspection
        return rotary_embedding


# The bridges of later op families live in modules of their own; they subclass Bridge above.
from .bridges_activation import GeluAndMulBridge, GeluNewBridge, GeluQuickBridge  # noqa: E402
from .bridges_attention import ClampPositionBridge  # noqa: E402
from .bridges_normalization import GemmaRMSNormBridge, LayerNormBridge  # noqa: E402
from .bridges_rotary import MRotaryEmbeddingBridge  # noqa: E402


def _family_bridges() -> tuple[Bridge, ...]:
    """The bridges kept in family modules; they subclass :class:`Bridge`, so import them late."""
    from .moe import FusedMoEBridge, TopKBridge

    return (
        TopKBridge(),
        FusedMoEBridge(),
    )


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
        *_family_bridges(),
    )
}
