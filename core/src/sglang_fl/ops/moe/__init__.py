"""Mixture-of-Experts ops: ``topk`` (SGLang's ``TopK``) and ``fused_moe`` (its experts).

``topk`` turns router logits into each token's experts and weights; ``fused_moe`` runs the
selected experts (gate/up projection, gated activation, down projection) and sums their outputs
with those weights. Both follow SGLang's ``forward_native`` numerics on a machine without
SGLang's CPU kernels (``sglang/srt/layers/moe/topk.py``: ``fused_topk_torch_native``,
``grouped_topk_gpu``, ``biased_grouped_topk_impl``; ``fused_moe_native.moe_forward_native``).
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from ..contract import (
    STANDARD_DTYPES,
    STANDARD_TOLERANCES,
    OpCase,
    OpContract,
    OpInputs,
    Tolerance,
    axis,
    case_grid,
    layer,
    random_tensor,
)
from ..experts import MoeActivation, check_activation, gated_activation, run_experts

__all__ = ["FUSED_MOE", "TOPK", "MoeActivation", "ScoringFunc", "check_activation"]

# SGLang adds this to the fp32 sum before dividing (topk.py, _RENORMALIZE_SUM_EPSILON): a token
# whose selected sigmoid scores all underflow to 0 gets 0 weights, not NaN.
RENORMALIZE_SUM_EPSILON = 1e-20


class ScoringFunc(str, enum.Enum):
    """How router logits become expert scores (``obj.scoring_func``)."""

    SOFTMAX = "softmax"
    SIGMOID = "sigmoid"


# --- topk -------------------------------------------------------------------------------------


def _topk_signature(obj: Any, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Select ``obj.top_k`` experts per token from ``router_logits`` ``[num_tokens, experts]``.

    Returns ``(topk_weights, topk_ids)``, both ``[num_tokens, top_k]``: float32 weights and
    int32 expert ids; the order of the experts within a row is unspecified. ``obj`` carries the
    routing configuration (SGLang passes the layer's ``topk_config``; vLLM's ``FusedMoE`` layer
    has the same attribute names):

    - ``top_k`` (int), ``renormalize`` (bool: divide the weights by their fp32 sum);
    - ``scoring_func``: ``"softmax"`` or ``"sigmoid"`` (:class:`ScoringFunc`);
    - ``correction_bias``: ``None`` or ``[experts]``; added to the scores to *choose* experts,
      never to the weights (DeepSeek-V3 style);
    - ``use_grouped_topk``, ``num_expert_group``, ``topk_group``: grouped routing chooses the
      ``topk_group`` best of ``num_expert_group`` equal groups first (a group scores its best
      expert; with a correction bias the sum of its best two biased scores, and the scores are
      sigmoid whatever ``scoring_func`` says, as SGLang's biased grouped top-k), then ``top_k``
      experts inside them;
    - ``routed_scaling_factor`` (float or ``None``), multiplied into the weights only when
      ``apply_routed_scaling_factor_on_output`` is true (otherwise the model applies it later).

    Inputs are never written. An implementation that cannot honour one of these options raises
    :class:`~sglang_fl.Unsupported` before computing anything.
    """
    raise NotImplementedError


def _scores(router_logits: torch.Tensor, scoring_func: str) -> torch.Tensor:
    if scoring_func == ScoringFunc.SOFTMAX:
        return router_logits.softmax(dim=-1)
    if scoring_func == ScoringFunc.SIGMOID:
        return router_logits.sigmoid()
    allowed = ", ".join(repr(s.value) for s in ScoringFunc)
    raise ValueError(f"topk: scoring_func {scoring_func!r} is not one of {allowed}")


def _group_mask(group_scores: torch.Tensor, topk_group: int, experts: int) -> torch.Tensor:
    """``[tokens, experts]`` bool: the experts of each token's ``topk_group`` best groups."""
    tokens, groups = group_scores.shape
    group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores)
    group_mask.scatter_(1, group_idx, 1)
    return (
        group_mask.unsqueeze(-1)
        .expand(tokens, groups, experts // groups)
        .reshape(tokens, experts)
        .bool()
    )


def topk_reference(obj: Any, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Same math as ``TopK.forward_native`` (``select_experts`` with ``torch_native``)."""
    top_k, bias = obj.top_k, obj.correction_bias
    tokens, experts = router_logits.shape
    if obj.use_grouped_topk:
        groups, topk_group = obj.num_expert_group, obj.topk_group
        if bias is None:  # grouped_topk_gpu: scores in the logits' dtype, best expert per group
            scores = _scores(router_logits, obj.scoring_func)
            group_scores = scores.view(tokens, groups, experts // groups).max(dim=-1).values
            masked = scores.masked_fill(~_group_mask(group_scores, topk_group, experts), 0.0)
            weights, ids = torch.topk(masked, k=top_k, dim=-1, sorted=False)
        else:  # biased_grouped_topk_impl: sigmoid, groups by their best two biased scores
            scores = router_logits.sigmoid()
            choice = scores.view(tokens, experts) + bias.view(-1, experts)
            per_group = choice.view(tokens, groups, experts // groups)
            group_scores = per_group.topk(2, dim=-1)[0].sum(dim=-1)
            masked = choice.masked_fill(
                ~_group_mask(group_scores, topk_group, experts), float("-inf")
            )
            ids = torch.topk(masked, k=top_k, dim=-1, sorted=False)[1]
            weights = scores.gather(1, ids)
    elif bias is not None:  # fused_topk_torch_native with a correction bias
        scores = _scores(router_logits, obj.scoring_func)
        choice = scores.view(-1, experts) + bias.unsqueeze(0)
        ids = torch.topk(choice, k=top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, ids)
    else:  # fused_topk_torch_native: scores in float32
        weights, ids = torch.topk(_scores(router_logits.float(), obj.scoring_func), top_k, dim=-1)
    if obj.renormalize:
        total = weights.sum(dim=-1, keepdim=True, dtype=torch.float32)
        weights = weights / (total + RENORMALIZE_SUM_EPSILON)
    weights = weights.to(torch.float32)
    if obj.apply_routed_scaling_factor_on_output and obj.routed_scaling_factor is not None:
        weights = weights * obj.routed_scaling_factor
    return weights, ids.to(torch.int32)


def canonical_topk(output: Any) -> Any:
    """Each row's experts in ascending id order (the contract leaves their order open)."""
    if not (isinstance(output, (tuple, list)) and len(output) == 2):
        return output
    weights, ids = output
    if not (isinstance(weights, torch.Tensor) and isinstance(ids, torch.Tensor)):
        return output
    if weights.shape != ids.shape or ids.is_floating_point():
        return output
    order = ids.argsort(dim=-1)
    return weights.gather(-1, order), ids.gather(-1, order)


def _routing(
    scoring: ScoringFunc, renormalize: bool, grouped: bool, bias: bool, scaled: bool
) -> dict[str, Any]:
    """One routing form: correction bias, and scaling factor applied on output (``scaled``)."""
    return {
        "scoring_func": scoring.value,
        "renormalize": renormalize,
        "grouped": grouped,
        "bias": bias,
        "scaled": scaled,
    }


_ROUTINGS = (
    _routing(ScoringFunc.SOFTMAX, renormalize=True, grouped=False, bias=False, scaled=False),
    _routing(ScoringFunc.SOFTMAX, renormalize=False, grouped=False, bias=False, scaled=False),
    _routing(ScoringFunc.SIGMOID, renormalize=True, grouped=False, bias=False, scaled=False),
    _routing(ScoringFunc.SIGMOID, renormalize=True, grouped=False, bias=True, scaled=True),
    _routing(ScoringFunc.SOFTMAX, renormalize=True, grouped=True, bias=False, scaled=False),
    _routing(ScoringFunc.SIGMOID, renormalize=True, grouped=True, bias=True, scaled=False),
)
# (experts, top_k): Mixtral-like, Qwen2-MoE-like (60, not a power of two), DeepSeek-like.
_EXPERTS_TOPK = (
    {"experts": 8, "top_k": 2},
    {"experts": 60, "top_k": 4},
    {"experts": 64, "top_k": 8},
)
_TOPK_GROUPS = (4, 2)  # num_expert_group, topk_group of the grouped cases
# DeepSeek-V3's grouped layout (256 experts, 8 groups, best 4 groups, top 8): groups of 32, the
# one layout every release of Ascend's npu_moe_gating_top_k takes (older ones take no other;
# the newer need more than 2 experts per group, which 8 experts in 4 groups do not have).
_DEEPSEEK_LAYOUT = {"experts": 256, "top_k": 8, "groups": 8, "topk_group": 4}
ROUTED_SCALING_FACTOR = 2.5


def _experts_name(p: Mapping[str, Any]) -> str:
    """``tokens=..,experts=..,top_k=..``: how the MoE cases' names begin."""
    return f"tokens={p['tokens']},experts={p['experts']},top_k={p['top_k']}"


def _strided_suffix(p: Mapping[str, Any]) -> str:
    return "" if p["contiguous"] else ",strided"


def _topk_case_name(p: Mapping[str, Any]) -> str:
    routing = ",".join(
        (
            *(("grouped",) if p["grouped"] else ()),
            p["scoring_func"],
            *(("bias",) if p["bias"] else ()),
            *(("renormalize",) if p["renormalize"] else ()),
            *(("scaled",) if p["scaled"] else ()),
        )
    )
    layout = p.get("groups", _TOPK_GROUPS[0]), p.get("topk_group", _TOPK_GROUPS[1])
    groups = f",groups={layout[0]}/{layout[1]}" if layout != _TOPK_GROUPS else ""
    return f"{_experts_name(p)},{routing}{groups}{_strided_suffix(p)}"


_GROUPED_ROUTINGS = tuple(r for r in _ROUTINGS if r["grouped"])
_TOPK_CASES = (
    *case_grid(
        _topk_case_name,
        axis("tokens", (0, 1, 33)),
        _EXPERTS_TOPK,
        _ROUTINGS,
        axis("contiguous", (True,)),
    ),
    # Router logits as a strided view (a slice of a wider projection), once per routing.
    *case_grid(
        _topk_case_name,
        axis("tokens", (33,)),
        _EXPERTS_TOPK[:1],
        _ROUTINGS,
        axis("contiguous", (False,)),
    ),
    *case_grid(
        _topk_case_name,
        axis("tokens", (1, 33)),
        (_DEEPSEEK_LAYOUT,),
        _GROUPED_ROUTINGS,
        axis("contiguous", (True,)),
    ),
)


def _distinct_rows(
    tokens: int, experts: int, step: float, generator: torch.Generator
) -> torch.Tensor:
    """Per row a shuffled ladder ``(rank - experts/2) * step``: no two experts tie, in any dtype."""
    ranks = torch.rand(tokens, experts, generator=generator).argsort(dim=-1).float()
    return (ranks - experts / 2) * step


def _make_topk_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    p = case.params
    tokens, experts = p["tokens"], p["experts"]
    num_groups, topk_group = p.get("groups", _TOPK_GROUPS[0]), p.get("topk_group", _TOPK_GROUPS[1])
    # Logits spread so that rounding to the dtype never creates a tie or swaps two experts;
    # sigmoid needs a narrow range (it saturates), softmax a wide one.
    step = 0.25 if p["scoring_func"] == ScoringFunc.SOFTMAX else 4.0 / experts
    logits = _distinct_rows(tokens, experts, step, generator).to(device, dtype)
    if not p["contiguous"]:  # every other column of a [tokens, 2 * experts] buffer
        logits = torch.stack((logits, torch.zeros_like(logits)), dim=-1)[..., 0]
    bias = None
    if p["bias"]:
        # Spaced wider than any score difference, so the choice is the bias's alone and is the
        # same in every precision; grouped: each group's band is far from the others.
        groups = num_groups if p["grouped"] else 1
        per_group = experts // groups
        within = torch.rand(groups, per_group, generator=generator).argsort(dim=-1).float()
        band = torch.rand(groups, generator=generator).argsort().float() * (2 * per_group + 2)
        bias = (within + band.unsqueeze(-1)).reshape(experts).to(device)
    obj = layer(
        top_k=p["top_k"],
        renormalize=p["renormalize"],
        scoring_func=p["scoring_func"],
        use_grouped_topk=p["grouped"],
        num_expert_group=num_groups if p["grouped"] else None,
        topk_group=topk_group if p["grouped"] else None,
        correction_bias=bias,
        routed_scaling_factor=ROUTED_SCALING_FACTOR if p["bias"] else None,
        apply_routed_scaling_factor_on_output=p["scaled"],
    )
    return OpInputs(obj=obj, args=(logits,), preserved=("router_logits",))


# A device graph replays the kernels one step launched: a reference that reads values on the
# host computes the capture's batch again at every replay.
_HOST_COUNTS = {
    "captured": "the reference counts the tokens per expert on the host (.tolist()): a device "
    "graph would replay the capture's counts"
}

TOPK = OpContract(
    name="topk",
    sglang_layer="TopK",
    summary="MoE router: softmax/sigmoid scores, optional bias and groups -> experts, weights",
    signature=inspect.signature(_topk_signature),
    details=inspect.getdoc(_topk_signature) or "",
    reference=topk_reference,
    dtypes=STANDARD_DTYPES,
    tolerances=STANDARD_TOLERANCES,
    cases=_TOPK_CASES,
    make_inputs=_make_topk_inputs,
    canonical_output=canonical_topk,
)


# --- fused_moe --------------------------------------------------------------------------------


def _fused_moe_signature(
    obj: Any,
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
) -> torch.Tensor:
    """Unquantized experts: ``sum_k w_k * down_e(act(gate_e(x)) * up_e(x))`` per token.

    ``x`` ``[num_tokens, hidden]``; ``w13`` ``[experts, 2 * intermediate, hidden]`` (gate rows
    then up rows); ``w2`` ``[experts, hidden, intermediate]``; ``topk_weights`` float32 and
    ``topk_ids`` int32 (each in ``[0, experts)``), both ``[num_tokens, top_k]`` as ``topk``
    returns them. ``activation`` is ``"silu"`` or ``"gelu"`` (tanh approximation):
    :class:`MoeActivation`. Returns a new ``[num_tokens, hidden]`` tensor in ``x``'s dtype;
    no input is written. Projections run in ``x``'s dtype, the weighted sum in float32.

    ``obj`` is the MoE layer (SGLang's ``FusedMoE``): the reference reads nothing from it; an
    implementation may read ``obj.num_experts`` and keep derived weight layouts (transposed,
    packed) on it, keyed by the ``w13``/``w2`` tensors it was given.
    """
    raise NotImplementedError


def fused_moe_reference(
    obj: Any,
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
) -> torch.Tensor:
    """Same math as SGLang's ``moe_forward_native``: tokens sorted by expert, one expert at a
    time, outputs weighted in float32."""
    act = check_activation(activation)

    def project(expert: int, rows: torch.Tensor) -> torch.Tensor:
        return F.linear(gated_activation(F.linear(rows, w13[expert]), act), w2[expert])

    return run_experts(x, topk_weights, topk_ids, w13.shape[0], w2.shape[1], project)


def _fused_moe_case_name(p: Mapping[str, Any]) -> str:
    return f"{_experts_name(p)},{p['activation']}{_strided_suffix(p)}"


_FUSED_MOE_SIZES = (axis("hidden", (64,)), axis("intermediate", (32,)))
_ACTIVATIONS = axis("activation", tuple(activation.value for activation in MoeActivation))
_FUSED_MOE_CASES = (
    *case_grid(
        _fused_moe_case_name,
        axis("tokens", (0, 1, 17)),
        # One expert too (a dense layer served by the MoE path, or one rank's expert shard).
        (
            {"experts": 1, "top_k": 1},
            {"experts": 4, "top_k": 1},
            {"experts": 8, "top_k": 2},
            {"experts": 60, "top_k": 4},
        ),
        *_FUSED_MOE_SIZES,
        _ACTIVATIONS,
        axis("contiguous", (True,)),
    ),
    # x as a strided view (a slice of a wider activation buffer), once per activation.
    *case_grid(
        _fused_moe_case_name,
        axis("tokens", (17,)),
        ({"experts": 8, "top_k": 2},),
        *_FUSED_MOE_SIZES,
        _ACTIVATIONS,
        axis("contiguous", (False,)),
    ),
)


def _make_fused_moe_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    p = case.params
    tokens, experts, top_k = p["tokens"], p["experts"], p["top_k"]
    hidden, inter = p["hidden"], p["intermediate"]
    x = random_tensor((tokens, hidden), dtype, device, generator, contiguous=p["contiguous"])
    # Scaled like trained projections (~1/sqrt(fan_in)) so bf16 outputs stay O(1).
    w13 = random_tensor((experts, 2 * inter, hidden), torch.float32, device, generator)
    w2 = random_tensor((experts, hidden, inter), torch.float32, device, generator)
    w13 = (w13 / hidden**0.5).to(dtype)
    w2 = (w2 / inter**0.5).to(dtype)
    ids = torch.rand(tokens, experts, generator=generator).argsort(dim=-1)[:, :top_k]
    weights = torch.rand(tokens, top_k, generator=generator).softmax(dim=-1)
    return OpInputs(
        obj=layer(num_experts=experts),
        args=(x, w13, w2, weights.to(device), ids.to(device, torch.int32), p["activation"]),
        preserved=("x", "w13", "w2", "topk_weights", "topk_ids"),
    )


# Two chained projections whose intermediate is rounded to the dtype, at points that differ
# between kernels (before or after the activation, per tile): a few units in the last place.
FUSED_MOE_TOLERANCES = {
    torch.float32: STANDARD_TOLERANCES[torch.float32],
    torch.float16: Tolerance(atol=5e-3, rtol=5e-3),
    torch.bfloat16: Tolerance(atol=3e-2, rtol=3e-2),
}

FUSED_MOE = OpContract(
    name="fused_moe",
    sglang_layer="UnquantizedFusedMoEMethod",
    summary="Unquantized MoE experts: gate/up, gated activation, down, weighted sum",
    signature=inspect.signature(_fused_moe_signature),
    details=inspect.getdoc(_fused_moe_signature) or "",
    reference=fused_moe_reference,
    dtypes=STANDARD_DTYPES,
    tolerances=FUSED_MOE_TOLERANCES,
    cases=_FUSED_MOE_CASES,
    make_inputs=_make_fused_moe_inputs,
    reference_graph_problems=_HOST_COUNTS,
)
