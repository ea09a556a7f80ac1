"""The gated-delta-rule (GDN) linear-attention family: every kernel SGLang 0.5.23's Qwen3-Next
path calls, as standard ops (see ``docs/architecture.md``, "Hybrid linear attention").

In call order for one GDN layer: ``fused_qkvzba_split_reshape_cat`` (unpack the projections;
``..._contiguous`` for Qwen3.5's layout),
``causal_conv1d_fn`` / ``causal_conv1d_update`` (short conv, prefill / decode),
``fused_gdn_gating`` (prefill gates), ``chunk_gated_delta_rule`` (prefill),
``fused_recurrent_gated_delta_rule_packed_decode`` or ``fused_sigmoid_gating_delta_rule_update``
(decode), ``rms_norm_gated`` (the output norm); ``track_mamba_states`` snapshots decode
states for the hybrid radix cache. ``fused_recurrent_gated_delta_rule`` is FLA's
token-by-token form (the FlagOS plugin routes it too).

:func:`check_state_indices` is the pool-index check the references make and vendor adapters
share (their kernels do not check the bound): it raises the exception kind its caller names.
"""

from __future__ import annotations

from ..contract import OpContract
from .conv import CAUSAL_CONV1D_FN, CAUSAL_CONV1D_UPDATE
from .delta_rule import (
    CHUNK_GATED_DELTA_RULE,
    FUSED_RECURRENT_GATED_DELTA_RULE,
    FUSED_RECURRENT_GATED_DELTA_RULE_PACKED_DECODE,
    FUSED_SIGMOID_GATING_DELTA_RULE_UPDATE,
)
from .norm import RMS_NORM_GATED
from .projection import (
    FUSED_GDN_GATING,
    FUSED_QKVZBA_SPLIT_RESHAPE_CAT,
    FUSED_QKVZBA_SPLIT_RESHAPE_CAT_CONTIGUOUS,
)
from .state_indices import PAD_SLOT_ID, check_state_indices
from .track import TRACK_MAMBA_STATES

__all__ = ["LINEAR_ATTENTION_OPS", "PAD_SLOT_ID", "check_state_indices"]

LINEAR_ATTENTION_OPS: tuple[OpContract, ...] = (
    FUSED_QKVZBA_SPLIT_RESHAPE_CAT,
    FUSED_QKVZBA_SPLIT_RESHAPE_CAT_CONTIGUOUS,
    CAUSAL_CONV1D_FN,
    CAUSAL_CONV1D_UPDATE,
    FUSED_GDN_GATING,
    CHUNK_GATED_DELTA_RULE,
    FUSED_RECURRENT_GATED_DELTA_RULE,
    FUSED_RECURRENT_GATED_DELTA_RULE_PACKED_DECODE,
    FUSED_SIGMOID_GATING_DELTA_RULE_UPDATE,
    RMS_NORM_GATED,
    TRACK_MAMBA_STATES,
)
