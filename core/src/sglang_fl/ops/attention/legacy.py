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


# What each pre-plan signature took after ``obj, q, k_cache, v_cache``, read from the plan.
_DECODE_FIELDS = ("req_to_token", "req_pool_indices", "seq_lens", "page_size")
_EXTEND_FIELDS = (
    "req_to_token",
    "req_pool_indices",
    "seq_lens",
    "extend_prefix_lens",
    "extend_seq_lens",
    "page_size",
)


def adapt_decode(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """``fn`` (the pre-plan ``decode_attention`` signature) taking a plan, or ``None``."""
    return _adapt(fn, DECODE_SIGNATURE, _DECODE_FIELDS)


def adapt_extend(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """``fn`` (the pre-plan ``extend_attention`` signature) taking a plan, or ``None``."""
    return _adapt(fn, EXTEND_SIGNATURE, _EXTEND_FIELDS)


def _adapt(
    fn: Callable[..., Any], signature: inspect.Signature, fields: tuple[str, ...]
) -> Callable[..., Any] | None:
    if binding_problem(signature, fn) is not None:
        return None

    @functools.wraps(fn)
    def planned(
        obj: Any, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionPlan
    ) -> Any:
        return fn(obj, q, k_cache, v_cache, *(getattr(plan, name) for name in fields))

    del planned.__wrapped__  # inspect.signature must see the planned signature
    return planned
