"""The expert loop every MoE reference shares: tokens sorted by expert, weighted sum in float32.

SGLang's ``moe_forward_native`` shape, once: the unquantized ``fused_moe`` (``moe``) and the
quantized MoE ops (``quantization``) differ only in how one expert projects its rows, which
each passes in as ``project``. Below the families, so both use it without importing each other.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import torch
import torch.nn.functional as F

__all__ = ["MoeActivation", "check_activation", "gated_activation", "run_experts"]


class MoeActivation(str, enum.Enum):
    """The gated activation between the two expert projections (``activation``)."""

    SILU = "silu"  # silu(gate) * up, SGLang's SiluAndMul
    GELU = "gelu"  # gelu_tanh(gate) * up, SGLang's GeluAndMul() (approximate="tanh")


def check_activation(activation: str, op_name: str = "fused_moe") -> MoeActivation:
    """The :class:`MoeActivation` named ``activation``; a ``ValueError`` naming the allowed."""
    try:
        return MoeActivation(activation)
    except ValueError:
        allowed = ", ".join(repr(a.value) for a in MoeActivation)
        raise ValueError(f"{op_name}: activation {activation!r} is not one of {allowed}") from None


def gated_activation(gate_up: torch.Tensor, activation: MoeActivation) -> torch.Tensor:
    """``act(gate) * up`` of rows holding the gate half then the up half."""
    d = gate_up.shape[-1] // 2
    if activation is MoeActivation.SILU:
        return F.silu(gate_up[..., :d]) * gate_up[..., d:]
    return F.gelu(gate_up[..., :d], approximate="tanh") * gate_up[..., d:]


# project(expert, rows) -> that expert's output rows [rows, hidden]
ExpertProjection = Callable[[int, torch.Tensor], torch.Tensor]


def run_experts(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    hidden_out: int,
    project: ExpertProjection,
) -> torch.Tensor:
    """``sum_k w_k * project(e_k, x)`` per token, as ``moe_forward_native``: the token copies
    sorted by expert, one expert at a time, the outputs weighted in ``topk_weights``' dtype
    (float32) and returned in ``x``'s dtype."""
    tokens, top_k = topk_ids.shape
    if tokens == 0:
        return x.new_empty((0, hidden_out))
    counts = topk_ids.new_zeros((tokens, num_experts))
    counts.scatter_(1, topk_ids.to(torch.int64), 1)
    tokens_per_expert = counts.sum(dim=0).tolist()
    order = topk_ids.reshape(-1).argsort()
    sorted_tokens = x[order // top_k]
    outputs = []
    start = 0
    for expert, count in enumerate(tokens_per_expert):
        if count == 0:
            continue
        outputs.append(project(expert, sorted_tokens[start : start + count]))
        start += count
    expert_out = torch.cat(outputs, dim=0)
    unsorted = torch.empty_like(expert_out)
    unsorted[order] = expert_out
    return (
        unsorted.view(tokens, top_k, -1)
        .type(topk_weights.dtype)
        .mul_(topk_weights.unsqueeze(dim=-1))
        .sum(dim=1)
        .type(x.dtype)
    )
