"""Bridges of SGLang's Gemma norms and ``LayerNorm`` (``sglang.srt.layers.layernorm``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

from ...routing import Forward, Handoff, NormResult, norm_rows
from ..compat import LAYER_CLASSES
from .base import Bridge

__all__ = ["EpsilonAlias", "GemmaRMSNormBridge", "LayerNormBridge", "RMSNormBridge"]


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


Norm = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


class EpsilonAlias:
    """A layer seen under the contract's attribute names: its ``eps`` as ``variance_epsilon``.

    ``Gemma3RMSNorm`` keeps its epsilon in ``eps``; ``GemmaRMSNorm`` and the FlagOS kernels use
    ``variance_epsilon``. Every other attribute reads through to the layer (live, so reloaded
    weights are seen); attributes an implementation sets stay on this per-layer view.
    """

    def __init__(self, layer: Any) -> None:
        self.layer = layer

    @property
    def variance_epsilon(self) -> float:
        return float(self.layer.eps)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.layer, name)


class GemmaRMSNormBridge(Bridge):
    """``GemmaRMSNorm(x, residual, post_residual_addition)`` and ``Gemma3RMSNorm(x, residual)``."""

    op_name = "gemma_rms_norm"

    def bind(self, layer: Any, fn: Forward, sglang_forward: Forward, handoff: Handoff) -> Forward:
        if not hasattr(layer, "variance_epsilon"):  # Gemma3RMSNorm: eps
            obj = EpsilonAlias(layer)

            def gemma3_rms_norm(x: torch.Tensor, residual: torch.Tensor | None = None) -> Norm:
                return norm_rows(fn, obj, x, residual)

            return gemma3_rms_norm

        def gemma_rms_norm(
            x: torch.Tensor,
            residual: torch.Tensor | None = None,
            post_residual_addition: torch.Tensor | None = None,
        ) -> Norm:
            if residual is not None and post_residual_addition is not None:
                residual = residual + post_residual_addition  # as forward_native adds it first
            return norm_rows(fn, layer, x, residual)

        return gemma_rms_norm


class LayerNormBridge(Bridge):
    op_name = "layer_norm"

    def bind(self, layer: Any, fn: Forward, sglang_forward: Forward, handoff: Handoff) -> Forward:
        hidden = layer.hidden_size

        def layer_norm(x: torch.Tensor) -> torch.Tensor:
            if x.shape[-1] != hidden:
                raise ValueError(f"Expected hidden_size to be {hidden}, but found: {x.shape[-1]}")
            if x.dim() == 2:
                normed: torch.Tensor = fn(layer, x)
                return normed
            rows: torch.Tensor = fn(layer, x.reshape(-1, hidden))
            return rows.reshape(x.shape)

        return layer_norm
