"""Hook implementations: the module the ``sglang_fl.backends`` entry point names."""

from __future__ import annotations

from sglang_fl.types import CollectiveGroup, OpRegistry, hookimpl

from .backend import TemplateBackend
from .communicator import Communicator, open_communicator
from .impl.activation import gelu_and_mul, gelu_new, gelu_quick, silu_and_mul
from .impl.attention import clamp_position, decode_attention, extend_attention, store_kv_cache
from .impl.collectives import (
    all_gather,
    all_gather_into_tensor,
    all_gatherv,
    all_reduce,
    all_to_all_single,
    broadcast,
    gather,
    quant_all_reduce,
    recv,
    reduce_scatter,
    reduce_scatter_tensor,
    reduce_scatterv,
    send,
)
from .impl.linear_attention import (
    causal_conv1d_fn,
    causal_conv1d_update,
    chunk_gated_delta_rule,
    fused_gdn_gating,
    fused_qkvzba_split_reshape_cat,
    fused_recurrent_gated_delta_rule,
    fused_sigmoid_gating_delta_rule_update,
    fused_sigmoid_mul,
    rms_norm_gated,
    track_mamba_states,
)
from .impl.linear_attention import (
    fused_qkvzba_split_reshape_cat_contiguous as split_contiguous,
)
from .impl.linear_attention import (
    fused_recurrent_gated_delta_rule_packed_decode as packed_decode,
)
from .impl.moe import fused_moe, topk
from .impl.normalization import gemma_rms_norm, layer_norm, rms_norm
from .impl.quantization import (
    FUSED_MOE_W8A8_FP8,
    FUSED_MOE_W8A8_INT8,
    W8A8_BLOCK_FP8_LINEAR,
    W8A8_FP8_LINEAR,
    W8A8_INT8_LINEAR,
    WNA16_LINEAR,
)
from .impl.rotary import mrotary_embedding, rotary_embedding


@hookimpl
def sglang_fl_register_ops(registry: OpRegistry) -> None:
    """Register this chip's kernels for the standard ops (availability is probed later)."""
    backend = TemplateBackend()
    registry.register_many(
        backend.implementations(
            {
                "silu_and_mul": silu_and_mul,
                "rms_norm": rms_norm,
                "rotary_embedding": rotary_embedding,
                "gelu_and_mul": gelu_and_mul,
                "gelu_new": gelu_new,
                "gelu_quick": gelu_quick,
                "gemma_rms_norm": gemma_rms_norm,
                "layer_norm": layer_norm,
                "mrotary_embedding": mrotary_embedding,
                "clamp_position": clamp_position,
                "topk": topk,
                "fused_moe": fused_moe,
                "store_kv_cache": store_kv_cache,
                "decode_attention": decode_attention,
                "extend_attention": extend_attention,
                "fused_qkvzba_split_reshape_cat": fused_qkvzba_split_reshape_cat,
                "fused_qkvzba_split_reshape_cat_contiguous": split_contiguous,
                "fused_sigmoid_mul": fused_sigmoid_mul,
                "causal_conv1d_fn": causal_conv1d_fn,
                "causal_conv1d_update": causal_conv1d_update,
                "fused_gdn_gating": fused_gdn_gating,
                "chunk_gated_delta_rule": chunk_gated_delta_rule,
                "fused_recurrent_gated_delta_rule": fused_recurrent_gated_delta_rule,
                "fused_recurrent_gated_delta_rule_packed_decode": packed_decode,
                "fused_sigmoid_gating_delta_rule_update": fused_sigmoid_gating_delta_rule_update,
                "rms_norm_gated": rms_norm_gated,
                "track_mamba_states": track_mamba_states,
                "all_reduce": all_reduce,
                "all_gather": all_gather,
                "all_gather_into_tensor": all_gather_into_tensor,
                "all_gatherv": all_gatherv,
                "quant_all_reduce": quant_all_reduce,
                "reduce_scatter_tensor": reduce_scatter_tensor,
                "reduce_scatterv": reduce_scatterv,
                "reduce_scatter": reduce_scatter,
                "broadcast": broadcast,
                "gather": gather,
                "send": send,
                "recv": recv,
                "all_to_all_single": all_to_all_single,
                "w8a8_int8_linear": W8A8_INT8_LINEAR,
                "w8a8_fp8_linear": W8A8_FP8_LINEAR,
                "w8a8_block_fp8_linear": W8A8_BLOCK_FP8_LINEAR,
                "wna16_linear": WNA16_LINEAR,
                "fused_moe_w8a8_int8": FUSED_MOE_W8A8_INT8,
                "fused_moe_w8a8_fp8": FUSED_MOE_W8A8_FP8,
            }
        )
    )


@hookimpl
def sglang_fl_communicator(group: CollectiveGroup) -> Communicator:
    """Set up the collective library for one group (communicator.py): only for groups this
    plugin's collectives serve, on every rank of the group."""
    return open_communicator(group)


@hookimpl
def sglang_fl_platform() -> str | None:
    """A chip SGLang has no in-tree platform for returns its platform class path here."""
    return None
