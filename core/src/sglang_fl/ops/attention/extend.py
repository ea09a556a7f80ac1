"""``extend_attention``: a prefill chunk of each request attends over its prefix and itself.

SGLang's extend step (``AttentionBackend.forward_extend``): prefill, chunked prefill (the
earlier chunks are the prefix), radix-cache hits (the cached prefix) and mixed batches, after
the new tokens' K/V were stored (``store_kv_cache``). Numerics of
``TorchNativeAttnBackend._run_sdpa_forward_extend``.
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
from .decode import SHAPES
from .legacy import LEGACY_PLANNER, adapt_extend
from .plan import DEFAULT_PLANNER, REFERENCE_PLANNER, AttentionBatch, AttentionPlan, ForwardKind

__all__ = ["EXTEND_ATTENTION"]


def _signature(
    obj: Any,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: AttentionPlan,
) -> torch.Tensor:
    """Attention of ``q`` ``[num_tokens, heads, head_dim]`` (may be strided): request ``i``'s
    ``plan.extend_seq_lens[i]`` new tokens, at positions ``plan.extend_prefix_lens[i]`` to
    ``plan.seq_lens[i] - 1``, over its ``plan.seq_lens[i]`` cached tokens (prefix and new
    ones).

    ``q`` holds the requests' new tokens one request after the other (request ``i``'s start at
    ``plan.cu_seqlens_q[i]``); the pool and the plan are as in ``decode_attention``, and
    ``seq_lens == extend_prefix_lens + extend_seq_lens``. A request may have no prefix
    (prefill), a cached one (radix hit, earlier chunks) and one or many new tokens;
    ``num_tokens`` may be 0. Never read a device value on the host here. ``obj`` is the layer
    (:func:`~sglang_fl.ops.attention.common.attention_layer`): causal layers mask future
    keys and apply ``sliding_window_size``; non-causal ones see every key of the request.
    Returns a new ``[num_tokens, heads, v_head_dim]`` tensor in ``q``'s dtype; no input
    changes. Unsupported options raise :class:`~sglang_fl.Unsupported` before computing.
    """
    raise NotImplementedError


def reference(
    obj: Any,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: AttentionPlan,
) -> torch.Tensor:
    """torch_native's per-request SDPA over the plan's host lengths, slots gathered at once.

    As torch_native, each request's queries sit at their positions in a ``[heads, seq_len,
    head_dim]`` buffer (prefix rows zero) so that one causal SDPA call of the very shapes
    torch_native uses computes them; the prefix rows' outputs are dropped.
    """
    tokens, heads = q.shape[0], q.shape[1]
    out = q.new_empty((tokens, heads, v_cache.shape[-1]))
    if tokens == 0 or plan.batch_size == 0:
        return out
    assert plan.extend_prefix_lens_host is not None
    assert plan.extend_seq_lens_host is not None
    lens = plan.seq_lens_host.tolist()  # host tensors: no device read
    prefixes = plan.extend_prefix_lens_host.tolist()
    extends = plan.extend_seq_lens_host.tolist()
    keys, values = gather_requests(plan, k_cache, v_cache, lens)
    if keys.dtype != q.dtype:
        keys, values = keys.to(q.dtype), values.to(q.dtype)
    query = q.movedim(0, 1)  # [heads, tokens, head_dim]
    causal = obj.is_causal
    window = obj.sliding_window_size if causal else NO_WINDOW
    scale, cap = obj.scaling, obj.logit_cap
    start_q = start_kv = 0
    for length, prefix, extend in zip(lens, prefixes, extends, strict=True):
        end_q = start_q + extend
        padded = query.new_empty((heads, length, query.shape[2]))
        padded[:, :prefix].zero_()
        padded[:, prefix:] = query[:, start_q:end_q]
        mask = None
        if window > NO_WINDOW:
            mask = window_mask(length, length, window, q.device)
        per_req = attend(
            padded,
            keys[:, start_kv : start_kv + length],
            values[:, start_kv : start_kv + length],
            mask=mask,
            causal=causal and mask is None,
            scale=scale,
            logit_cap=cap,
        )
        out[start_q:end_q] = per_req.movedim(1, 0)[prefix:]
        start_q, start_kv = end_q, start_kv + length
    return out


def _case_name(p: Mapping[str, Any]) -> str:
    strided = ",strided" if p["strided"] else ""
    batch = ";".join(f"{pre}+{ext}" for pre, ext in p["batch"])
    tokens = sum(ext for _, ext in p["batch"])
    return f"tokens={tokens},batch=[{batch}],{shape_name(p)},{p['option']}{strided}"


# (prefix, extend) per request: a prefill, a radix hit / later chunk, a one-token extend.
_MIXED = {"batch": ((0, 6), (7, 3), (16, 1))}
_GQA = SHAPES[1]

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
        axis("option", tuple(o for o in OPTIONS if o is not Option.PLAIN)),
        axis("strided", (False,)),
    ),
    *case_grid(
        _case_name,
        ({"batch": ((0, 33), (20, 12))},),
        (_GQA, SHAPES[0]),
        axis("page_size", (16,)),
        axis("option", (Option.PLAIN, Option.WINDOW)),
        axis("strided", (True,)),
    ),
    *case_grid(
        _case_name,
        ({"batch": ()},),
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
    batch = p["batch"]
    seq_lens = [prefix + extend for prefix, extend in batch]
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
    tokens = sum(extend for _, extend in batch)
    q = query_tensor(
        tokens,
        p["heads"],
        p["kv_heads"],
        p["head_dim"],
        dtype,
        device,
        generator,
        strided=p["strided"],
    )
    prefix_lens = torch.tensor([pre for pre, _ in batch], dtype=torch.int32, device=device)
    extend_lens = torch.tensor([ext for _, ext in batch], dtype=torch.int32, device=device)
    obj = attention_layer(**option_attributes(p["option"], p["head_dim"]))
    described = AttentionBatch.extend(
        pool.req_to_token,
        pool.req_pool_indices,
        pool.seq_lens,
        prefix_lens,
        extend_lens,
        p["page_size"],
    )
    return OpInputs(
        obj=obj,
        args=(q, pool.k_cache, pool.v_cache, REFERENCE_PLANNER.plan(described)),
        preserved=("q", "k_cache", "v_cache"),
        batch=described,
    )


EXTEND_ATTENTION = OpContract(
    name="extend_attention",
    sglang_layer="RadixAttention",
    summary="new tokens over their cached prefix and themselves (prefill, chunks, radix hits)",
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
            "request r's new token t (0-based, in q's order) sits at i = "
            "plan.extend_prefix_lens[r] + t; its keys are the request's j = 0 .. "
            "plan.seq_lens[r] - 1 (the cached prefix, then "
            "the new tokens). Causal: j <= i; with a window w: max(0, i - w) <= j <= i.",
        ),
        *ATTENTION_RULES,
    ),
    plan_stage=PlanStage(
        kind=ForwardKind.EXTEND,
        reference_planner=REFERENCE_PLANNER,
        default_planner=DEFAULT_PLANNER,
        legacy_planner=LEGACY_PLANNER,
        adapt_legacy=adapt_extend,
    ),
)
