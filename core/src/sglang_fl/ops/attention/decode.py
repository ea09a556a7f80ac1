"""``decode_attention``: one new token per request attends over that request's cached KV.

SGLang's decode step (``AttentionBackend.forward_decode``) after the new token's K/V were
stored (``store_kv_cache``). Numerics of ``TorchNativeAttnBackend._run_sdpa_forward_decode``.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from ..contract import OpCase, OpContract, OpInputs, PlanStage, Rule, axis, case_grid
from .cases import OPTIONS, Option, option_attributes, shape_name
from .common import (
    ATTENTION_RULES,
    ATTENTION_TOLERANCES,
    NO_WINDOW,
    attend,
    attention_layer,
    build_pool,
    gather_requests,
    query_tensor,
    window_mask,
)
from .legacy import LEGACY_PLANNER, adapt_decode
from .plan import DEFAULT_PLANNER, REFERENCE_PLANNER, AttentionBatch, AttentionPlan, ForwardKind

__all__ = ["DECODE_ATTENTION"]


def _signature(
    obj: Any,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: AttentionPlan,
) -> torch.Tensor:
    """Attention of ``q`` ``[batch, heads, head_dim]`` (one token per request, may be strided)
    over each request's ``plan.seq_lens[i]`` cached tokens, the new one included.

    ``plan`` is this forward's plan, made once for all layers by the implementation's planner
    (:mod:`sglang_fl.ops.attention.plan`): request ``i``'s token ``j`` is in slot
    ``plan.req_to_token[plan.req_pool_indices[i], j]`` of ``k_cache`` ``[slots, kv_heads,
    head_dim]`` and ``v_cache`` ``[slots, kv_heads, v_head_dim]``, page ``plan.page_table[i,
    j // page_size]`` of the paged pool. Never read a device value on the host here (no
    ``.item()``, ``.tolist()``, ``.cpu()``): lengths the host needs are the plan's host
    tensors. ``heads`` is a multiple of ``kv_heads`` (MHA, GQA, MQA), ``v_head_dim`` may differ
    from ``head_dim``, ``batch`` may be 0. ``obj`` is the layer
    (:func:`~sglang_fl.ops.attention.common.attention_layer`): ``scaling``, ``logit_cap``,
    ``sliding_window_size`` (the new token at position ``seq_len - 1`` sees the last
    ``sliding_window_size + 1`` tokens); ``is_causal`` does not matter for one query at the
    end. Keys and values in a dtype other than ``q``'s are cast to it. Returns a new
    ``[batch, heads, v_head_dim]`` tensor in ``q``'s dtype; no input changes. An
    implementation that cannot honour an option raises :class:`~sglang_fl.Unsupported`
    before computing.
    """
    raise NotImplementedError


def reference(
    obj: Any,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: AttentionPlan,
) -> torch.Tensor:
    """torch_native's per-request SDPA over the plan's host lengths.

    The requests' slots are gathered in one indexing (a gather is exact), then each request
    runs the same SDPA call as torch_native (same shapes, flags and mask).
    """
    batch, heads = q.shape[0], q.shape[1]
    out = q.new_empty((batch, heads, v_cache.shape[-1]))
    if batch == 0:
        return out
    lens = plan.seq_lens_host.tolist()  # a host tensor: no device read
    keys, values = gather_requests(plan, k_cache, v_cache, lens)
    if keys.dtype != q.dtype:
        keys, values = keys.to(q.dtype), values.to(q.dtype)
    query = q.movedim(0, 1)  # [heads, batch, head_dim]
    window, scale, cap = obj.sliding_window_size, obj.scaling, obj.logit_cap
    start = 0
    for i, length in enumerate(lens):
        mask = None
        if window > NO_WINDOW:
            mask = window_mask(1, length, window, q.device, query_offset=length - 1)
        per_req = attend(
            query[:, i : i + 1],
            keys[:, start : start + length],
            values[:, start : start + length],
            mask=mask,
            causal=False,
            scale=scale,
            logit_cap=cap,
        )
        out[i] = per_req.movedim(1, 0)[0]
        start += length
    return out


def _case_name(p: Mapping[str, Any]) -> str:
    strided = ",strided" if p["strided"] else ""
    lens = list(p["seq_lens"])
    return f"batch={len(lens)},seq_lens={lens},{shape_name(p)},{p['option']}{strided}"


_MHA = {"heads": 4, "kv_heads": 4, "head_dim": 64, "v_head_dim": 64}
_GQA = {"heads": 8, "kv_heads": 2, "head_dim": 128, "v_head_dim": 128}
_MQA = {"heads": 4, "kv_heads": 1, "head_dim": 16, "v_head_dim": 16}
_WIDE = {"heads": 4, "kv_heads": 2, "head_dim": 256, "v_head_dim": 256}
_V_DIFFERS = {"heads": 4, "kv_heads": 2, "head_dim": 96, "v_head_dim": 64}
SHAPES = (_MHA, _GQA, _MQA, _WIDE, _V_DIFFERS)
_MIXED = {"seq_lens": (1, 9, 20)}

CASES = (
    *case_grid(
        _case_name,
        (_MIXED,),
        SHAPES,
        axis("page_size", (1, 4)),
        axis("option", (Option.PLAIN,)),
        axis("strided", (False,)),
    ),
    *case_grid(
        _case_name,
        (_MIXED,),
        (_GQA,),
        axis("page_size", (1, 4)),
        axis("option", tuple(o for o in OPTIONS if o not in (Option.PLAIN, Option.NONCAUSAL))),
        axis("strided", (False,)),
    ),
    *case_grid(
        _case_name,
        ({"seq_lens": (12, 3, 7, 30)},),
        (_GQA, _MHA),
        axis("page_size", (16,)),
        axis("option", (Option.PLAIN,)),
        axis("strided", (True,)),
    ),
    *case_grid(
        _case_name,
        ({"seq_lens": ()},),
        (_GQA,),
        axis("page_size", (1,)),
        axis("option", (Option.PLAIN,)),
        axis("strided", (False,)),
    ),
)


def _make_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    p = case.params
    seq_lens = p["seq_lens"]
    pool = build_pool(
        seq_lens,
        kv_heads=p["kv_heads"],
        head_dim=p["head_dim"],
        v_head_dim=p["v_head_dim"],
        page_size=p["page_size"],
        dtype=dtype,
        device=device,
        generator=generator,
    )
    q = query_tensor(
        len(seq_lens),
        p["heads"],
        p["kv_heads"],
        p["head_dim"],
        dtype,
        device,
        generator,
        strided=p["strided"],
    )
    obj = attention_layer(**option_attributes(p["option"], p["head_dim"]))
    batch = AttentionBatch.decode(
        pool.req_to_token, pool.req_pool_indices, pool.seq_lens, p["page_size"]
    )
    return OpInputs(
        obj=obj,
        args=(q, pool.k_cache, pool.v_cache, REFERENCE_PLANNER.plan(batch)),
        preserved=("q", "k_cache", "v_cache"),
        batch=batch,
    )


DECODE_ATTENTION = OpContract(
    name="decode_attention",
    sglang_layer="RadixAttention",
    summary="one token per request over its cached KV (MHA/GQA/MQA, window, soft-cap, pages)",
    signature=inspect.signature(_signature),
    details=inspect.getdoc(_signature) or "",
    reference=reference,
    dtypes=tuple(ATTENTION_TOLERANCES),
    tolerances=ATTENTION_TOLERANCES,
    cases=CASES,
    make_inputs=_make_inputs,
    rules=(
        Rule(
            "positions",
            "request r's one query is its newest token, at i = plan.seq_lens[r] - 1; it sees "
            "the keys 0 .. i, with a window w the keys max(0, i - w) .. i (obj.is_causal does "
            "not change this: no key lies after the query).",
        ),
        *ATTENTION_RULES,
    ),
    plan_stage=PlanStage(
        kind=ForwardKind.DECODE,
        reference_planner=REFERENCE_PLANNER,
        default_planner=DEFAULT_PLANNER,
        legacy_planner=LEGACY_PLANNER,
        adapt_legacy=adapt_decode,
    ),
)
