"""MoE adapters on ``torch_npu``'s MoE operators, as SGLang's NPU path uses them
(``sglang/srt/hardware_backend/npu/moe/``: ``topk.py``, ``init_routing.py``, ``matmul.py``,
``finalize_routing.py``, SGLang 0.5.23).

- ``topk``: ungrouped softmax without a bias on ``npu_moe_gating_top_k_softmax(x, k=)`` ->
  ``(y, expert_idx, row_idx)``, renormalised here in float32; everything else on
  ``npu_moe_gating_top_k`` (CANN ``aclnnMoeGatingTopK``: softmax/sigmoid ``norm_type``, a bias
  added for the choice only, groups scored by their max (``group_select_mode=0``) or their best
  two (``1``), then ``y / (sum(y) + eps) * routed_scaling_factor``). That operator always
  divides by the sum, so it serves ``renormalize=True`` only.
- ``fused_moe``: ``npu_moe_init_routing_v2`` (tokens sorted by expert, with per-expert counts),
  ``npu_grouped_matmul`` (gate/up), ``npu_swiglu``, ``npu_grouped_matmul`` (down),
  ``npu_moe_finalize_routing`` (weighted sum back to token order). ``quant_mode=-1`` (no
  quantization) is always passed: its default differs across torch_npu branches.

Strided inputs are packed with ``.contiguous()`` (the contract only reads them); an empty batch
returns its empty outputs without a call (the API reference does not cover empty tensors).
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.ops.moe import RENORMALIZE_SUM_EPSILON, MoeActivation, ScoringFunc, check_activation
from sglang_fl.types import Unsupported

from ..backend import TORCH_NPU

# aclnnMoeGatingTopK: "x ... the number of experts must not exceed 2048".
_GATING_MAX_EXPERTS = 2048
_NORM_TYPE = {ScoringFunc.SOFTMAX: 0, ScoringFunc.SIGMOID: 1}
_NO_QUANT = -1  # npu_moe_init_routing_v2 quant_mode: leave the activations unquantized
_GROUP_LIST_COUNTS = 1  # npu_grouped_matmul group_list_type: per-group counts, not a cumsum


def _operator(torch_npu: Any, name: str) -> Any:
    operator = getattr(torch_npu, name, None)
    if operator is None:
        version = getattr(torch_npu, "__version__", "?")
        raise Unsupported(f"torch_npu {version} has no {name}")
    return operator


def topk(obj: Any, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``router_logits`` ``[num_tokens, experts]`` -> float32 weights, int32 expert ids."""
    scoring = ScoringFunc(obj.scoring_func)
    tokens, experts = router_logits.shape
    grouped, bias = obj.use_grouped_topk, obj.correction_bias
    fast = not grouped and bias is None and scoring is ScoringFunc.SOFTMAX
    if not fast and not obj.renormalize:
        raise Unsupported("npu_moe_gating_top_k always renormalises; renormalize=False declined")
    if not fast and experts > _GATING_MAX_EXPERTS:
        raise Unsupported(f"npu_moe_gating_top_k takes at most {_GATING_MAX_EXPERTS} experts")
    scale = (
        obj.routed_scaling_factor
        if obj.apply_routed_scaling_factor_on_output and obj.routed_scaling_factor is not None
        else 1.0
    )
    if tokens == 0:
        empty = router_logits.new_empty((0, obj.top_k))
        return empty.float(), empty.to(torch.int32)
    torch_npu = TORCH_NPU.require()
    if fast:
        gating_softmax = _operator(torch_npu, "npu_moe_gating_top_k_softmax")
        weights, ids, _ = gating_softmax(router_logits.contiguous(), k=obj.top_k)
        weights = weights.float()
        if obj.renormalize:
            total = weights.sum(dim=-1, keepdim=True)
            weights = weights / (total + RENORMALIZE_SUM_EPSILON)
        return weights * scale if scale != 1.0 else weights, ids.to(torch.int32)
    gating = _operator(torch_npu, "npu_moe_gating_top_k")
    # The contract scores grouped routing with a bias by sigmoid, whatever scoring_func says.
    norm_type = _NORM_TYPE[ScoringFunc.SIGMOID if grouped and bias is not None else scoring]
    weights, ids, _ = gating(
        router_logits.float().contiguous(),
        k=obj.top_k,
        bias=None if bias is None else bias.float(),
        k_group=obj.topk_group if grouped else 1,
        group_count=obj.num_expert_group if grouped else 1,
        group_select_mode=1 if grouped and bias is not None else 0,
        renorm=0,  # normalise (softmax/sigmoid) first, then choose: the only documented mode
        norm_type=norm_type,
        out_flag=False,
        routed_scaling_factor=float(scale),
        eps=RENORMALIZE_SUM_EPSILON,
    )
    return weights.float(), ids.to(torch.int32)


def fused_moe(
    obj: Any,
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
) -> torch.Tensor:
    """``x`` ``[num_tokens, hidden]`` through the selected experts with grouped matmuls."""
    if check_activation(activation) is not MoeActivation.SILU:
        raise Unsupported("the torch_npu MoE path fuses silu only (npu_swiglu)")
    tokens, top_k = topk_ids.shape
    if tokens == 0:
        return x.new_empty((0, w2.shape[1]))
    torch_npu = TORCH_NPU.require()
    init_routing = _operator(torch_npu, "npu_moe_init_routing_v2")
    grouped_matmul = _operator(torch_npu, "npu_grouped_matmul")
    finalize = _operator(torch_npu, "npu_moe_finalize_routing")
    experts = w13.shape[0]
    ids = topk_ids.to(torch.int32)
    sorted_x, expanded_row_idx, tokens_per_expert, _ = init_routing(
        x.contiguous(),
        ids,
        active_num=tokens * top_k,
        expert_num=experts,
        expert_tokens_num_type=_GROUP_LIST_COUNTS,
        expert_tokens_num_flag=True,
        active_expert_range=[0, experts],
        quant_mode=_NO_QUANT,
    )
    counts = tokens_per_expert.to(torch.int64)

    def project(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = grouped_matmul(  # the SDK is untyped
            x=[rows],
            weight=[weight.transpose(1, 2)],  # [experts, in, out]
            split_item=2,
            group_list_type=_GROUP_LIST_COUNTS,
            group_type=0,
            group_list=counts,
            output_dtype=x.dtype,
        )[0]
        return out

    hidden = torch_npu.npu_swiglu(project(sorted_x, w13))
    combined: torch.Tensor = finalize(
        project(hidden, w2),
        skip1=None,
        skip2=None,
        bias=None,
        scales=topk_weights.to(x.dtype),
        expanded_src_to_dst_row=expanded_row_idx,
        export_for_source_row=ids,
        drop_pad_mode=0,
    )
    return combined
