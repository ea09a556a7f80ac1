"""``topk`` and ``fused_moe`` on template: the MoE router and the unquantized experts."""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.types import Unsupported


def topk(obj: Any, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # Replace with the chip kernel: router_logits [num_tokens, experts] -> (float32 weights,
    # int32 ids), both [num_tokens, obj.top_k]. Options on obj: renormalize, scoring_func
    # ("softmax"/"sigmoid"), correction_bias (choice only), use_grouped_topk, num_expert_group,
    # topk_group, routed_scaling_factor + apply_routed_scaling_factor_on_output. Raise
    # Unsupported for an option the kernel lacks; router_logits stays untouched.
    raise Unsupported("template: topk is not implemented")


def fused_moe(
    obj: Any,
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
) -> torch.Tensor:
    # Replace with the chip kernel: x [num_tokens, hidden], w13 [experts, 2 * inter, hidden]
    # (gate rows, then up rows), w2 [experts, hidden, inter]; return a new [num_tokens, hidden]
    # tensor: sum over k of topk_weights * w2 @ act(gate) * up, activation "silu" or "gelu"
    # (tanh). No input is written.
    raise Unsupported("template: fused_moe is not implemented")
