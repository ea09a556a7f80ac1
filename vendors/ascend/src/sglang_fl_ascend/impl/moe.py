"""MoE adapters on ``torch_npu``'s MoE operators, as SGLang's NPU path uses them
(``sglang/srt/hardware_backend/npu/moe/``: ``topk.py``, ``init_routing.py``, ``matmul.py``,
``finalize_routing.py``, SGLang 0.5.23).

- ``topk``: ungrouped softmax without a bias on ``npu_moe_gating_top_k_softmax(x, k=)`` ->
  ``(y, expert_idx, row_idx)`` (``k <= 1024``), renormalised here in float32; everything else
  on ``npu_moe_gating_top_k`` (CANN ``aclnnMoeGatingTopK``: softmax/sigmoid ``norm_type``, a
  bias added for the choice only, groups scored by their max (``group_select_mode=0``) or their
  best two (``1``)). Its pages disagree on whether softmax weights are divided by their sum
  (the formula says always, the equivalent code only for sigmoid), so the adapter passes
  ``routed_scaling_factor=1`` and divides (and scales) the float32 weights itself: right under
  either reading. Sigmoid weights are always divided, so ``renormalize=False`` is declined.
  Which layouts the operator takes depends on the torch_npu release the probe read
  (:func:`~sglang_fl_ascend.backend.platform`):

  - torch_npu 2.7.1 and later (Ascend Extension for PyTorch 7.2.0+, CANN 8.3.RC1+; torch_npu
    API page of ``npu_moe_gating_top_k``, op-plugin ``docs/context`` of branch 7.2.0): at most
    2048 experts; ``group_count`` dividing them into groups of more than 2 experts, with
    ``align32(experts / group_count) * group_count <= 2048``; softmax or sigmoid; a bias or not.
  - older releases (the 7.0.0/7.1.0 builds of torch_npu 2.1.0/2.5.1/2.6.0, CANN 8.1/8.2; the
    7.1.0 page): exactly 256 experts, ``k`` in [1, 32], a bias, ``k_group`` 4 of
    ``group_count`` 8, and only the sigmoid, best-two-per-group mode all of its branches
    document: DeepSeek-V3 routing, nothing else.
- ``fused_moe``: ``npu_moe_init_routing_v2`` (tokens sorted by expert, with the cumulative
  per-expert counts), ``npu_grouped_matmul`` (gate/up), ``npu_swiglu``, ``npu_grouped_matmul``
  (down), ``npu_moe_finalize_routing`` (weighted sum back to token order). The group list is
  the cumulative form (``group_list_type=0``): the per-group-count form may not have length 1
  (``npu_grouped_matmul`` page, ``group_list``), which a single expert would give.
  ``quant_mode=-1`` (no quantization) is always passed: its default differs across branches.

Strided inputs are packed with ``.contiguous()`` (the contract only reads them); an empty batch
returns its empty outputs without a call (the API reference does not cover empty tensors).
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.ops.moe import RENORMALIZE_SUM_EPSILON, MoeActivation, ScoringFunc, check_activation
from sglang_fl.types import Unsupported

from ..backend import TORCH_NPU, NpuPlatform, platform

# aclnnMoeGatingTopK: "x ... the number of experts must not exceed 2048"; the groups' experts,
# each group padded to 32, too; each group needs more than 2 experts.
_GATING_MAX_EXPERTS = 2048
_GATING_GROUP_ALIGNMENT = 32
_GATING_MIN_GROUP_EXPERTS = 3
# npu_moe_gating_top_k_softmax: "k <= 1024".
_GATING_SOFTMAX_MAX_K = 1024
# The one layout the 7.0.0/7.1.0 operator takes: (experts, group_count, k_group, max k).
_RESTRICTED_GATING = (256, 8, 4, 32)
_NORM_TYPE = {ScoringFunc.SOFTMAX: 0, ScoringFunc.SIGMOID: 1}
_GROUP_SELECT_MAX, _GROUP_SELECT_TOP2_SUM = 0, 1
_NO_QUANT = -1  # npu_moe_init_routing_v2 quant_mode: leave the activations unquantized
_CUMSUM = 0  # expert_tokens_num_type / group_list_type: cumulative row counts


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
    # The contract scores grouped routing with a bias by sigmoid, whatever scoring_func says.
    norm = ScoringFunc.SIGMOID if grouped and bias is not None else scoring
    groups = obj.num_expert_group if grouped else 1
    k_group = obj.topk_group if grouped else 1
    select = _GROUP_SELECT_TOP2_SUM if grouped and bias is not None else _GROUP_SELECT_MAX
    if fast and obj.top_k > _GATING_SOFTMAX_MAX_K:
        raise Unsupported(f"npu_moe_gating_top_k_softmax takes k <= {_GATING_SOFTMAX_MAX_K}")
    if not fast:
        if not obj.renormalize:
            raise Unsupported(
                "npu_moe_gating_top_k divides sigmoid weights by their sum (and its pages "
                "disagree for softmax); renormalize=False declined"
            )
        _check_gating_layout(platform(), experts, groups, k_group, obj.top_k, norm, select, bias)
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
    chosen, ids, _norm_out = gating(
        router_logits.float().contiguous(),
        k=obj.top_k,
        bias=None if bias is None else bias.float(),
        k_group=k_group,
        group_count=groups,
        group_select_mode=select,
        renorm=0,  # normalise (softmax/sigmoid) first, then choose: the only documented mode
        norm_type=_NORM_TYPE[norm],
        out_flag=False,
        routed_scaling_factor=1.0,  # scaled below, after the division the pages disagree on
        eps=RENORMALIZE_SUM_EPSILON,
    )
    weights = chosen.float()
    weights = weights / (weights.sum(dim=-1, keepdim=True) + RENORMALIZE_SUM_EPSILON)
    return weights * scale if scale != 1.0 else weights, ids.to(torch.int32)


def _check_gating_layout(
    found: NpuPlatform,
    experts: int,
    groups: int,
    k_group: int,
    top_k: int,
    norm: ScoringFunc,
    select: int,
    bias: torch.Tensor | None,
) -> None:
    """``Unsupported`` unless this release's ``npu_moe_gating_top_k`` takes the layout."""
    if not found.general_gating:
        restricted = (experts, groups, k_group)
        max_experts, max_groups, max_k_group, max_k = _RESTRICTED_GATING
        if (
            restricted != (max_experts, max_groups, max_k_group)
            or not 1 <= top_k <= max_k
            or bias is None
            or norm is not ScoringFunc.SIGMOID
            or select != _GROUP_SELECT_TOP2_SUM
        ):
            raise Unsupported(
                f"{found.describe()}: its npu_moe_gating_top_k (before Ascend Extension for "
                f"PyTorch 7.2.0) takes only {max_experts} experts in {max_groups} groups, "
                f"k_group {max_k_group}, k <= {max_k}, with a bias, sigmoid scores and groups "
                f"by their best two; got {experts} experts, {groups} groups, k_group "
                f"{k_group}, k {top_k}, {norm.value}, "
                f"{'a bias' if bias is not None else 'no bias'}"
            )
        return
    per_group = experts // groups
    padded = -(-per_group // _GATING_GROUP_ALIGNMENT) * _GATING_GROUP_ALIGNMENT
    if experts > _GATING_MAX_EXPERTS or per_group < _GATING_MIN_GROUP_EXPERTS:
        raise Unsupported(
            f"npu_moe_gating_top_k takes at most {_GATING_MAX_EXPERTS} experts and groups of "
            f"more than 2; got {experts} experts in {groups} groups"
        )
    if padded * groups > _GATING_MAX_EXPERTS:
        raise Unsupported(
            f"npu_moe_gating_top_k needs align32(experts / groups) * groups <= "
            f"{_GATING_MAX_EXPERTS}; got {groups} groups of {per_group} ({padded * groups})"
        )


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
        expert_tokens_num_type=_CUMSUM,
        expert_tokens_num_flag=True,
        active_expert_range=[0, experts],
        quant_mode=_NO_QUANT,
    )
    ends = tokens_per_expert.to(torch.int64)  # cumulative: the end row of each expert

    def project(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = grouped_matmul(  # the SDK is untyped
            x=[rows],
            weight=[weight.transpose(1, 2)],  # [experts, in, out]
            split_item=2,
            group_list_type=_CUMSUM,
            group_type=0,
            group_list=ends,
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
