"""The standard operators: one :class:`OpContract` each, read by registry, kit and docs.

One package per family (``activation``, ``normalization``, ``rotary``, ``moe``, ``attention``,
``kernel_functions``, ``linear_attention``, ``collectives``, ``quantization``), one module per op
or small group of ops; ``contract`` (the :class:`OpContract` type and case helpers),
``graph_spec`` and ``experts`` (the expert loop of the MoE references) are shared by all.
Families import only those, never each other (the ``ops-families`` import-linter contract).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from types import MappingProxyType

from ..errors import UnknownOpError
from .activation.gelu_and_mul import CONTRACT as GELU_AND_MUL
from .activation.gelu_new import CONTRACT as GELU_NEW
from .activation.gelu_quick import CONTRACT as GELU_QUICK
from .activation.silu_and_mul import CONTRACT as SILU_AND_MUL
from .attention import (
    DECODE_ATTENTION,
    EXTEND_ATTENTION,
    SGLANG_ATTENTION_BACKEND,
    STORE_KV_CACHE,
)
from .attention.clamp_position import CONTRACT as CLAMP_POSITION
from .collectives import COLLECTIVES
from .contract import OpCase, OpContract, OpInputs, Tolerance
from .graph_runner import SGLANG_GRAPH_RUNNER
from .kernel_functions.fused_gate_sigmoid_mul import FUSED_GATE_SIGMOID_MUL
from .kernel_functions.fused_sigmoid_mul import FUSED_SIGMOID_MUL
from .linear_attention import LINEAR_ATTENTION_OPS
from .moe import FUSED_MOE, TOPK
from .normalization.gemma_rms_norm import CONTRACT as GEMMA_RMS_NORM
from .normalization.layer_norm import CONTRACT as LAYER_NORM
from .normalization.rms_norm import CONTRACT as RMS_NORM
from .quantization import QUANTIZATION_OPS
from .rotary.mrotary_embedding import CONTRACT as MROTARY_EMBEDDING
from .rotary.rotary_embedding import CONTRACT as ROTARY_EMBEDDING

__all__ = [
    "SELECTIONS",
    "STANDARD_OPS",
    "OpCase",
    "OpContract",
    "OpInputs",
    "Tolerance",
    "get_contract",
    "unknown_op_message",
]

STANDARD_OPS: Mapping[str, OpContract] = MappingProxyType(
    {
        c.name: c
        for c in (
            SILU_AND_MUL,
            RMS_NORM,
            ROTARY_EMBEDDING,
            GELU_AND_MUL,
            GELU_NEW,
            GELU_QUICK,
            GEMMA_RMS_NORM,
            LAYER_NORM,
            MROTARY_EMBEDDING,
            CLAMP_POSITION,
            TOPK,
            FUSED_MOE,
            FUSED_GATE_SIGMOID_MUL,
            FUSED_SIGMOID_MUL,
            STORE_KV_CACHE,
            DECODE_ATTENTION,
            EXTEND_ATTENTION,
            *LINEAR_ATTENTION_OPS,
            *COLLECTIVES,
            *QUANTIZATION_OPS,
        )
    }
)

# Choices the policy makes like an op's but whose candidates are not kernels (no contract, not
# in the registry): a name here is a valid ``per_op`` key and ``sglang-fl explain`` argument.
SELECTIONS: tuple[str, ...] = (SGLANG_ATTENTION_BACKEND, SGLANG_GRAPH_RUNNER)


def unknown_op_message(name: str) -> str:
    """``unknown op 'rms_nrom' (did you mean 'rms_norm'?); known ops: ...``."""
    message = f"unknown op {name!r}"
    close = difflib.get_close_matches(name, STANDARD_OPS, n=1)
    if close:
        message += f" (did you mean {close[0]!r}?)"
    return message + f"; known ops: {', '.join(STANDARD_OPS)}; selections: {', '.join(SELECTIONS)}"


def get_contract(name: str) -> OpContract:
    """The contract of a standard op; an unknown name raises :class:`UnknownOpError`."""
    try:
        return STANDARD_OPS[name]
    except KeyError:
        raise UnknownOpError(unknown_op_message(name)) from None
