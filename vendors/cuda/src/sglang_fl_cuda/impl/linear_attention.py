"""The gated-delta-rule (GDN) family on CUDA: SGLang's own Triton kernels stay in place.

sgl_kernel has no GDN kernels; on CUDA SGLang 0.5.23 runs its Triton ones (read in the wheel:
``sglang/kernels/ops/attention/fla/chunk.py``, ``fla/fused_recurrent.py``,
``attention/linear/fused_gdn_gating.py``, ``linear/fused_sigmoid_gating_recurrent.py``,
``triton_gdn_fused_proj.py``, ``mamba/causal_conv1d_triton.py`` and the CUDA
``layers/attention/mamba/causal_conv1d.py``, ``fla/fused_norm_gate.py``,
``mamba/mamba_state_scatter_triton.py``). sglang-fl leaves a function to SGLang where its
Triton kernel runs and only the reference implements the op, so nothing is registered here.
"""

from __future__ import annotations

_TRITON = "sgl_kernel has none; SGLang's own Triton kernel"
NO_KERNEL = {
    "fused_qkvzba_split_reshape_cat": f"{_TRITON} (triton_gdn_fused_proj) stays in place",
    "causal_conv1d_fn": "sgl_kernel has none; SGLang's CUDA causal_conv1d stays in place",
    "causal_conv1d_update": f"{_TRITON} (mamba/causal_conv1d_triton) stays in place",
    "fused_gdn_gating": f"{_TRITON} (attention/linear/fused_gdn_gating) stays in place",
    "chunk_gated_delta_rule": f"{_TRITON} (fla/chunk) stays in place",
    "fused_recurrent_gated_delta_rule": f"{_TRITON} (fla/fused_recurrent) stays in place",
    "fused_recurrent_gated_delta_rule_packed_decode": f"{_TRITON} (fla/fused_recurrent) stays "
    "in place",
    "fused_sigmoid_gating_delta_rule_update": f"{_TRITON} "
    "(linear/fused_sigmoid_gating_recurrent) stays in place",
    "rms_norm_gated": f"{_TRITON} (fla/fused_norm_gate) stays in place",
    "track_mamba_states": f"{_TRITON} (mamba/mamba_state_scatter_triton) stays in place",
}
