"""Quantized checkpoints on sglang-fl's platform: SGLang's configs, run by the quantized ops.

``configs`` holds the configs the platform answers SGLang's ``get_quantization_config`` with,
``methods`` the linear and MoE methods they return (binding each layer to its op's chain once
its weights are loaded), ``formats`` how each SGLang method's parameters read as the ops'
weights. Imported only when SGLang asks for a quantization config (it imports SGLang's
quantization package).
"""

from __future__ import annotations

__all__ = ["SERVED", "quantization_config"]

# The names SGLang passes (a checkpoint's ``quant_method``) that sglang-fl's platform serves.
SERVED = ("compressed-tensors", "fp8", "w8a8_int8", "awq")


def quantization_config(name: str) -> type | None:
    """sglang-fl's config class for SGLang's quantization ``name``, or ``None`` (SGLang's own)."""
    if name not in SERVED:
        return None
    from .configs import CONFIGS

    return CONFIGS[name]
