"""Gated-delta-rule (GDN) linear-attention kernels on template (Qwen3-Next and its family).

Each stub has its op's standard signature (``sglang-fl ops`` prints the contracts). State pools
are ``[N, HV, V, K]`` and are updated in place through the index arguments; an index outside the
pool must be an error, never a write elsewhere. Decline a call you cannot serve (a head ratio, a
dtype, a state dtype) with ``Unsupported`` before writing anything: the next candidate serves it.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.types import Unsupported

Tensor = torch.Tensor


def fused_qkvzba_split_reshape_cat(
    obj: Any, mixed_qkvz: Tensor, mixed_ba: Tensor, num_heads_qk: int, num_heads_v: int,
    head_qk: int, head_v: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    # (mixed_qkv [T, 2*H*head_qk + HV*head_v], z [T, HV, head_v], b [T, HV], a [T, HV]); exact.
    raise Unsupported("template: fused_qkvzba_split_reshape_cat is not implemented")


def fused_qkvzba_split_reshape_cat_contiguous(
    obj: Any, mixed_qkvz: Tensor, mixed_ba: Tensor, num_heads_qk: int, num_heads_v: int,
    head_qk: int, head_v: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    # Qwen3.5's [all q | all k | all v | all z], [all b | all a]; outputs as the split above.
    raise Unsupported("template: fused_qkvzba_split_reshape_cat_contiguous is not implemented")


def fused_sigmoid_mul(obj: Any, attn_output: Tensor, gate: Tensor, inplace: bool = False) -> Tensor:
    # Qwen3.5's attention output gate: attn_output * sigmoid(gate); gate may be [T, heads, dim]
    # with any strides; inplace=True writes into attn_output and returns it.
    raise Unsupported("template: fused_sigmoid_mul is not implemented")


def causal_conv1d_fn(
    obj: Any, x: Tensor, weight: Tensor, bias: Tensor | None, conv_states: Tensor,
    query_start_loc: Tensor, seq_lens_cpu: Any, cache_indices: Tensor | None = None,
    has_initial_state: Tensor | None = None, activation: Any = "silu", pad_slot_id: int = -1,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    # (out [dim, T], conv_states written in place); x [dim, T] is usually a transposed view.
    raise Unsupported("template: causal_conv1d_fn is not implemented")


def causal_conv1d_update(
    obj: Any, x: Tensor, conv_state: Tensor, weight: Tensor, bias: Tensor | None = None,
    activation: Any = None, conv_state_indices: Tensor | None = None, pad_slot_id: int = -1,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    # (out shaped as x, conv_state written in place).
    raise Unsupported("template: causal_conv1d_update is not implemented")


def fused_gdn_gating(
    obj: Any, A_log: Tensor, a: Tensor, b: Tensor, dt_bias: Tensor, beta: float = 1.0,
    threshold: float = 20.0,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    # float32 (g, beta) [1, T, HV]: g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b).
    raise Unsupported("template: fused_gdn_gating is not implemented")


def chunk_gated_delta_rule(
    obj: Any, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
    scale: float | None = None, initial_state: Tensor | None = None,
    initial_state_indices: Tensor | None = None, cu_seqlens: Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False, inplace_update: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    # (o [1, T, HV, V], h [1, NT, HV, V, K] per 64-token chunk, the state pool in place).
    raise Unsupported("template: chunk_gated_delta_rule is not implemented")


def fused_recurrent_gated_delta_rule(
    obj: Any, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor | None = None,
    scale: float | None = None, initial_state: Tensor | None = None,
    output_final_state: bool = False, cu_seqlens: Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    # (o, final_state [N, HV, V, K] float32); initial_state is not written.
    raise Unsupported("template: fused_recurrent_gated_delta_rule is not implemented")


def fused_recurrent_gated_delta_rule_packed_decode(
    obj: Any, mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
    scale: float, initial_state: Tensor, out: Tensor, ssm_state_indices: Tensor,
    use_qk_l2norm_in_kernel: bool = False,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    # (out [B, 1, HV, V] written in place, the state pool in place); index -1 is padding.
    raise Unsupported("template: fused_recurrent_gated_delta_rule_packed_decode is not implemented")


def fused_sigmoid_gating_delta_rule_update(
    obj: Any, A_log: Tensor, a: Tensor, dt_bias: Tensor, softplus_beta: float,
    softplus_threshold: float, q: Tensor, k: Tensor, v: Tensor, b: Tensor,
    initial_state_source: Tensor, initial_state_indices: Tensor, scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False, cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    # (o [1, T, HV, V], the state pool in place); index -1 starts from zeros, writes nothing.
    raise Unsupported("template: fused_sigmoid_gating_delta_rule_update is not implemented")


def rms_norm_gated(obj: Any, x: Tensor, gate: Tensor) -> Tensor:
    # rmsnorm(x) * obj.weight * act(gate), act from obj.activation ("swish"/"silu"/"sigmoid").
    raise Unsupported("template: rms_norm_gated is not implemented")


def track_mamba_states(
    obj: Any, conv_states: Tensor, ssm_states: Tensor, cache_indices: Tensor,
    mamba_track_mask: Tensor, mamba_track_indices: Tensor, batch_size: int,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    # Copy the masked rows' states, every layer ([L, N, ...] pools); exact; pools in place.
    raise Unsupported("template: track_mamba_states is not implemented")
