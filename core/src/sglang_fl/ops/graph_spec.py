"""What each op's ``torch.library`` custom op needs beyond its contract: the layer's state.

An implementation takes the layer object first (``fn(obj, x, ...)``); a custom op can only take
tensors and plain values. So each op declares, once, the layer attributes its contract reads
(the attributes the contract's layer stand-ins carry) with their schema types, and which call
arguments an implementation may write. :mod:`sglang_fl.graph` turns that into the op's schema;
the custom op rebuilds a layer stand-in from the attribute values and calls the chosen
implementation with it. ``core/tests/test_graph.py`` checks every declaration against the
contract's own cases, so a new attribute or a new in-place result cannot be missed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from .._strenum import StrEnum

__all__ = ["GRAPH_SPECS", "WITHOUT_GRAPH_SPEC", "FieldType", "GraphSpec", "LayerField"]


class FieldType(StrEnum):
    """A layer attribute's type, spelled as in a ``torch.library`` schema."""

    TENSOR = "Tensor"
    OPTIONAL_TENSOR = "Tensor?"
    FLOAT = "float"
    OPTIONAL_FLOAT = "float?"
    INT = "int"
    OPTIONAL_INT = "int?"
    OPTIONAL_INT_LIST = "int[]?"
    BOOL = "bool"
    OPTIONAL_BOOL = "bool?"
    STR = "str"
    DTYPE = "ScalarType"

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` can be passed as an argument of this schema type."""
        if value is None:
            return self.endswith("?")
        base = self.removesuffix("?")
        if base == "int[]":
            return isinstance(value, (list, tuple)) and all(_is_int(v) for v in value)
        checks: Mapping[str, Callable[[Any], bool]] = {
            "Tensor": lambda v: isinstance(v, torch.Tensor),
            "float": lambda v: isinstance(v, float) or _is_int(v),
            "int": _is_int,
            "bool": lambda v: isinstance(v, bool),
            "str": lambda v: isinstance(v, str),
            "ScalarType": lambda v: isinstance(v, torch.dtype),
        }
        return checks[base](value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class LayerField:
    """One attribute of the layer (``obj.<name>``) that an implementation may read.

    ``optional``: SGLang's layers do not all have it (the contract reads it with a default,
    ``getattr(obj, name, default)``). A layer without it, or with it ``None``, passes ``None``
    (the type is an optional one) and the stand-in the implementation gets lacks it, so the
    contract's default applies as in eager mode.
    """

    name: str
    type: FieldType
    optional: bool = False

    def __post_init__(self) -> None:
        if self.optional and not self.type.endswith("?"):
            raise ValueError(f"optional layer field {self.name!r} needs an optional type")


@dataclass(frozen=True)
class GraphSpec:
    """An op's layer attributes and the call arguments an implementation may write.

    ``layer_fields`` is ``None`` for a kernel function, whose ``obj`` is ``None``. ``fake``
    computes the outputs' shapes and dtypes where the contract's reference cannot run on fake
    tensors (it reads values, e.g. to count tokens per expert); otherwise the reference does.
    """

    layer_fields: tuple[LayerField, ...] | None
    mutates: tuple[str, ...] = ()
    fake: Callable[..., Any] | None = None
    # For an op that returns one tensor alone or a pair (rms_norm without or with ``residual``):
    # the argument the second output is written into, so the custom op always returns one.
    second_output_into: str | None = None
    # Outputs that are arguments written in place (output index -> argument, which ``mutates``
    # names): the custom op does not return them (no copy of a KV or state pool per call), the
    # call returns the arguments themselves.
    in_place_outputs: Mapping[int, str] = field(default_factory=dict)


def _fields(**types: FieldType) -> tuple[LayerField, ...]:
    return tuple(LayerField(name, field_type) for name, field_type in types.items())


def _optional(**types: FieldType) -> tuple[LayerField, ...]:
    return tuple(LayerField(name, field_type, optional=True) for name, field_type in types.items())


def _fused_moe_fake(
    obj: Any,
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
) -> torch.Tensor:
    """``[num_tokens, hidden]`` in ``x``'s dtype: the reference sorts tokens by their values."""
    return x.new_empty((x.shape[0], w2.shape[1]))


def _attention_fake(
    obj: Any, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *rest: Any
) -> torch.Tensor:
    """``[num_tokens, heads, v_head_dim]`` in ``q``'s dtype: the references read lengths."""
    return q.new_empty((q.shape[0], q.shape[1], v_cache.shape[-1]))


def _conv_update_fake(
    obj: Any, x: torch.Tensor, conv_state: torch.Tensor, *rest: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, conv_state)``, ``out`` as ``x``: the reference reads the state indices."""
    return x.new_empty(x.shape), conv_state


def _packed_decode_fake(
    obj: Any,
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor,
    out: torch.Tensor,
    *rest: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both outputs are arguments written in place (the reference reads the indices)."""
    return out, initial_state


def _sigmoid_update_fake(
    obj: Any,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    softplus_beta: float,
    softplus_threshold: float,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    b: torch.Tensor,
    initial_state_source: torch.Tensor,
    *rest: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, initial_state_source)``, ``o`` ``[B, T, HV, V]`` in ``q``'s dtype."""
    return q.new_empty(v.shape), initial_state_source


def _track_fake(
    obj: Any, conv_states: torch.Tensor, ssm_states: torch.Tensor, *rest: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    return conv_states, ssm_states


F = FieldType
_GEMMA_NORM = _fields(weight=F.TENSOR, variance_epsilon=F.FLOAT)
_NORM = (*_GEMMA_NORM, *_fields(hidden_size=F.INT))
_ROPE = _fields(head_size=F.INT, rotary_dim=F.INT, is_neox_style=F.BOOL, cos_sin_cache=F.TENSOR)

_ATTENTION = _fields(
    scaling=F.FLOAT, logit_cap=F.FLOAT, sliding_window_size=F.INT, is_causal=F.BOOL
)

GRAPH_SPECS: Mapping[str, GraphSpec] = MappingProxyType(
    {
        "silu_and_mul": GraphSpec(_fields()),
        "gelu_and_mul": GraphSpec(_fields(approximate=F.STR)),
        "gelu_new": GraphSpec(_fields()),
        "gelu_quick": GraphSpec(_fields()),
        "rms_norm": GraphSpec(_NORM, mutates=("x", "residual"), second_output_into="residual"),
        "gemma_rms_norm": GraphSpec(
            _GEMMA_NORM, mutates=("x", "residual"), second_output_into="residual"
        ),
        "layer_norm": GraphSpec(
            _fields(
                hidden_size=F.INT,
                variance_epsilon=F.FLOAT,
                elementwise_affine=F.BOOL,
                use_bias=F.BOOL,
                dtype=F.DTYPE,
                weight=F.OPTIONAL_TENSOR,
                bias=F.OPTIONAL_TENSOR,
            )
        ),
        "rotary_embedding": GraphSpec(_ROPE, mutates=("query", "key")),
        "mrotary_embedding": GraphSpec(
            (
                *_ROPE,
                *_fields(mrope_section=F.OPTIONAL_INT_LIST, mrope_interleaved=F.BOOL),
            ),
            mutates=("query", "key"),
        ),
        "clamp_position": GraphSpec(_fields()),
        "topk": GraphSpec(
            _fields(
                top_k=F.INT,
                renormalize=F.BOOL,
                scoring_func=F.STR,
                use_grouped_topk=F.BOOL,
                num_expert_group=F.OPTIONAL_INT,
                topk_group=F.OPTIONAL_INT,
                correction_bias=F.OPTIONAL_TENSOR,
                routed_scaling_factor=F.OPTIONAL_FLOAT,
                apply_routed_scaling_factor_on_output=F.BOOL,
            )
        ),
        "fused_moe": GraphSpec(_fields(num_experts=F.INT), fake=_fused_moe_fake),
        "fused_gate_sigmoid_mul": GraphSpec(None, mutates=("addend",)),
        "store_kv_cache": GraphSpec(
            _fields(),
            mutates=("k_cache", "v_cache"),
            in_place_outputs={0: "k_cache", 1: "v_cache"},
        ),
        "decode_attention": GraphSpec(_ATTENTION, fake=_attention_fake),
        "extend_attention": GraphSpec(_ATTENTION, fake=_attention_fake),
        # The gated-delta-rule functions of a decode step (SGLang's graph runners capture
        # decode): pooled states are written in place and returned as the arguments.
        "fused_qkvzba_split_reshape_cat": GraphSpec(None),
        "fused_qkvzba_split_reshape_cat_contiguous": GraphSpec(None),
        "causal_conv1d_update": GraphSpec(
            None,
            mutates=("conv_state",),
            fake=_conv_update_fake,
            in_place_outputs={1: "conv_state"},
        ),
        "fused_gdn_gating": GraphSpec(None),
        "fused_recurrent_gated_delta_rule_packed_decode": GraphSpec(
            None,
            mutates=("initial_state", "out"),
            fake=_packed_decode_fake,
            in_place_outputs={0: "out", 1: "initial_state"},
        ),
        "fused_sigmoid_gating_delta_rule_update": GraphSpec(
            None,
            mutates=("initial_state_source",),
            fake=_sigmoid_update_fake,
            in_place_outputs={1: "initial_state_source"},
        ),
        # SGLang's FusedRMSNormGated has no norm_before_gate or group_size, layernorm_gated's
        # RMSNorm no hidden_size.
        "rms_norm_gated": GraphSpec(
            (
                *_fields(weight=F.TENSOR, eps=F.FLOAT, activation=F.STR),
                *_optional(
                    norm_before_gate=F.OPTIONAL_BOOL,
                    group_size=F.OPTIONAL_INT,
                    hidden_size=F.OPTIONAL_INT,
                ),
            )
        ),
        "track_mamba_states": GraphSpec(
            None,
            mutates=("conv_states", "ssm_states"),
            fake=_track_fake,
            in_place_outputs={0: "conv_states", 1: "ssm_states"},
        ),
    }
)

# Standard ops with no custom-op form yet, and why: they are routed only as SGLang kernel
# functions (integrations/sglang/linear_attention.py), which never wrap them as custom ops.
_PREFILL = (
    "a gated-delta-rule prefill function: SGLang's graph runners capture decode steps only, "
    "so it never runs inside a compiled or captured step"
)
WITHOUT_GRAPH_SPEC: Mapping[str, str] = MappingProxyType(
    {
        op: _PREFILL
        for op in (
            "causal_conv1d_fn",
            "chunk_gated_delta_rule",
            "fused_recurrent_gated_delta_rule",
        )
    }
    | {
        "fused_sigmoid_mul": "Qwen3.5's attention output gate, routed with the GDN functions: "
        "its in-place form returns its input, which a custom op may not alias"
    }
    | {
        op: "quantized layers: each implementation receives the weights in the layout its own "
        "prepare step made (not one schema for every kernel), and sglang-fl's quantized linear "
        "and MoE methods call the bound chain directly, eagerly"
        for op in (
            "w8a8_int8_linear",
            "w8a8_fp8_linear",
            "w8a8_block_fp8_linear",
            "wna16_linear",
            "fused_moe_w8a8_int8",
            "fused_moe_w8a8_fp8",
        )
    }
)
