"""Discovery: the installed wheel's entry point loads and registers the ops (no chip needed)."""

from __future__ import annotations

from sglang_fl_template.backend import TemplateBackend

from sglang_fl import get_runtime
from sglang_fl.types import Availability

# What plugin.py registers (`sglang-fl new-vendor --ops` writes both): keep it in step when you
# add or drop an op.
REGISTERED_OPS = {
    "silu_and_mul",
    "rms_norm",
    "rotary_embedding",
    "gelu_and_mul",
    "gelu_new",
    "gelu_quick",
    "gemma_rms_norm",
    "layer_norm",
    "mrotary_embedding",
    "clamp_position",
    "topk",
    "fused_moe",
    "store_kv_cache",
    "decode_attention",
    "extend_attention",
    "fused_qkvzba_split_reshape_cat",
    "fused_qkvzba_split_reshape_cat_contiguous",
    "fused_sigmoid_mul",
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "fused_gdn_gating",
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gated_delta_rule_packed_decode",
    "fused_sigmoid_gating_delta_rule_update",
    "rms_norm_gated",
    "track_mamba_states",
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gatherv",
    "reduce_scatter_tensor",
    "reduce_scatterv",
    "reduce_scatter",
    "quant_all_reduce",
    "broadcast",
    "gather",
    "send",
    "recv",
    "all_to_all_single",
    "w8a8_int8_linear",
    "w8a8_fp8_linear",
    "w8a8_block_fp8_linear",
    "wna16_linear",
    "fused_moe_w8a8_int8",
    "fused_moe_w8a8_fp8",
}


def test_entry_point_loads_and_registers_the_ops() -> None:
    runtime = get_runtime()
    plugin = runtime.plugin("template")
    assert plugin.status == "loaded", plugin.error
    assert plugin.distribution == "sglang-fl-template"
    registered = {
        impl.op_name
        for op in runtime.registry.ops()
        for impl in runtime.registry.implementations(op)
        if impl.provenance is not None and impl.provenance.plugin == "template"
    }
    assert registered == REGISTERED_OPS


def test_availability_probe_answers_with_a_reason() -> None:
    availability = TemplateBackend().is_available()
    assert isinstance(availability, (bool, Availability))
    assert not isinstance(availability, Availability) or availability.reason
