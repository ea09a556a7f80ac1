"""The gated-delta-rule (GDN) family on Ascend: no torch_npu operator; declared, not served.

torch_npu has no GDN operators. SGLang 0.5.23's NPU path imports its own from
``sgl_kernel_npu`` (read in the SGLang wheel: ``models/qwen3_next.py`` binds
``sgl_kernel_npu.fla.utils.fused_qkvzba_split_reshape_cat``; ``gdn_backend.py`` binds
``sgl_kernel_npu.fla.fused_gdn_gating.fused_gdn_gating_npu`` and
``sgl_kernel_npu.mamba.causal_conv1d.causal_conv1d_fn_npu``/``causal_conv1d_update_npu``;
``gdn_triton.py`` binds ``sgl_kernel_npu.fla.chunk.chunk_gated_delta_rule_npu`` and
``..fused_sigmoid_gating_recurrent_decode_optimized``). Those stay SGLang's on an NPU; no
adapter to them is written here yet, so each op is declared with the reason.
"""

from __future__ import annotations

_SGLANG = "torch_npu has no operator; SGLang's NPU path calls sgl_kernel_npu's"
_NONE = "torch_npu has no operator and sgl_kernel_npu none that SGLang 0.5.23 uses"
NO_KERNEL = {
    "fused_qkvzba_split_reshape_cat": f"{_SGLANG} fla.utils.fused_qkvzba_split_reshape_cat",
    "causal_conv1d_fn": f"{_SGLANG} mamba.causal_conv1d.causal_conv1d_fn_npu",
    "causal_conv1d_update": f"{_SGLANG} mamba.causal_conv1d.causal_conv1d_update_npu",
    "fused_gdn_gating": f"{_SGLANG} fla.fused_gdn_gating.fused_gdn_gating_npu",
    "chunk_gated_delta_rule": f"{_SGLANG} fla.chunk.chunk_gated_delta_rule_npu",
    "fused_recurrent_gated_delta_rule": _NONE,
    "fused_recurrent_gated_delta_rule_packed_decode": f"{_NONE} (packed decode is off on NPU)",
    "fused_sigmoid_gating_delta_rule_update": f"{_SGLANG} "
    "fla.fused_sigmoid_gating_recurrent_decode_optimized",
    "rms_norm_gated": _NONE,
    "track_mamba_states": _NONE,
}
