"""Attention kernels written before plans: their signatures, adapted onto the planned ones.

Until the plan stage, ``decode_attention`` and ``extend_attention`` took the pool's tensors and
the batch's lengths in every layer call (and each kernel rebuilt its page table, reading
lengths on the host, per layer). A wheel built for those signatures keeps working: the
registry wraps its function so that it reads those arguments from the default plan, and gives
it :data:`LEGACY_PLANNER`, which device graphs refuse (the kernel still reads per layer).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from ..contract import binding_problem
from .plan import AttentionPlan, DefaultPlanner, GraphMode

__all__ = ["LEGACY_PLANNER", "adapt_decode", "adapt_extend"]

LEGACY_PLANNER = DefaultPlanner(
    {
        GraphMode.CAPTURED: "the implementation takes the attention signature from before plans "
        "(pool tensors and lengths in every layer call): it reads lengths on the host per "
        "layer, which a device graph cannot replay",
    }
)


def _decode_signature(
    obj: Any,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int = 1,
) -> torch.Tensor:
    raise NotImplementedError


def _extend_signature(
    obj: Any,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    page_size: int = 1,
) -> torch.Tensor:
    raise NotImplementedError


DECODE_SIGNATURE = inspect.signature(_decode_signature)
EXTEND_SIGNATURE = inspect.signature(_extend_signature)


def adapt_decode(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """``fn`` (the pre-plan ``decode_attention`` signature) taking a plan, or ``None``."""
    if binding_problem(DECODE_SIGNATURE, fn) is not None:
        return None

    @functools.wraps(fn)
    def decode_attention(
        obj: Any, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionPlan
    ) -> Any:
        return fn(
            obj,
            q,
            k_cache,
            v_cache,
            plan.req_to_token,
            plan.req_pool_indices,
            plan.seq_lens,
            plan.page_size,
        )

    del decode_attention.__wrapped__  # inspect.signature must see the planned signature
    return decode_attention


def adapt_extend(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """``fn`` (the pre-plan ``extend_attention`` signature) taking a plan, or ``None``."""
    if binding_problem(EXTEND_SIGNATURE, fn) is not None:
        return None

    @functools.wraps(fn)
    def extend_attention(
        obj: Any, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionPlan
    ) -> Any:
        return fn(
            obj,
            q,
            k_cache,
            v_cache,
            plan.req_to_token,
            plan.req_pool_indices,
            plan.seq_lens,
            plan.extend_prefix_lens,
            plan.extend_seq_lens,
            plan.page_size,
        )

    del extend_attention.__wrapped__
    return extend_attention
