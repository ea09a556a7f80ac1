"""MoE adapters: ``topk`` on ``sgl_kernel``'s router kernels, ``fused_moe`` on SGLang's Triton
fused experts (the kernels ``TopK.forward_cuda`` / ``UnquantizedFusedMoEMethod.forward_cuda``
reach on an NVIDIA GPU).

- ``topk``: ``sgl_kernel.topk_softmax`` / ``topk_sigmoid`` (sglang-kernel 0.4.x,
  ``sgl_kernel/moe.py``): ``(topk_weights, topk_ids, gating_output, renormalize, ...)`` write
  float32 weights and int32 ids in place. Grouped routing is declined (sglang-kernel 0.4.x
  retired ``moe_fused_gate``; SGLang 0.5.23 routes it through its own Triton router), and so is
  a correction bias (the kernels' bias semantics are not documented as the contract's).
- ``fused_moe``: ``outplace_fused_experts`` from SGLang's
  ``sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe.py`` (SGLang 0.5.23), imported on
  the first call; never writes its inputs. float16/bfloat16 only: for float32 its ``tl.dot``
  runs in TF32, so float32 calls are declined to the next candidate.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from sglang_fl.ops.moe import ScoringFunc, check_activation
from sglang_fl.types import Unsupported

from ..backend import SGL_KERNEL

# Where SGLang keeps its Triton fused-experts entry points.
SGLANG_FUSED_MOE = "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe"
# SGLang 0.5.23's fused_experts_impl accepts float32 too, but its Triton kernel multiplies with
# tl.dot's default precision, TF32 for float32 inputs: outside the float32 tolerance.
_FUSED_MOE_DTYPES = frozenset({torch.float16, torch.bfloat16})


def topk(obj: Any, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``router_logits`` ``[num_tokens, experts]`` -> float32 weights, int32 expert ids."""
    if obj.use_grouped_topk:
        raise Unsupported("sgl_kernel 0.4.x has no grouped top-k kernel (moe_fused_gate retired)")
    if obj.correction_bias is not None:
        raise Unsupported("sgl_kernel's top-k kernels are not used with a correction bias")
    scoring = ScoringFunc(obj.scoring_func)
    tokens = router_logits.shape[0]
    weights = torch.empty(tokens, obj.top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(tokens, obj.top_k, dtype=torch.int32, device=router_logits.device)
    if tokens > 0:  # a kernel launch over no rows is an invalid grid
        sgl_kernel = SGL_KERNEL.require()
        name = "topk_softmax" if scoring is ScoringFunc.SOFTMAX else "topk_sigmoid"
        kernel = getattr(sgl_kernel, name, None)
        if kernel is None:
            version = getattr(sgl_kernel, "__version__", "?")
            raise Unsupported(f"sgl_kernel {version} has no {name}")
        kernel(weights, ids, router_logits.contiguous(), obj.renormalize)
    if obj.apply_routed_scaling_factor_on_output and obj.routed_scaling_factor is not None:
        weights.mul_(obj.routed_scaling_factor)
    return weights, ids


def fused_moe(
    obj: Any,
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
) -> torch.Tensor:
    """``x`` ``[num_tokens, hidden]`` through the selected experts, in SGLang's Triton kernels."""
    act = check_activation(activation)
    if x.dtype not in _FUSED_MOE_DTYPES:
        raise Unsupported(
            f"SGLang's Triton fused MoE computes {x.dtype} outside the contract's tolerance "
            "(float32 multiplies in TF32) or not at all"
        )
    if x.shape[0] == 0:
        return x.new_empty((0, w2.shape[1]))
    try:
        module = importlib.import_module(SGLANG_FUSED_MOE)
    except ImportError as exc:
        raise Unsupported(f"SGLang's Triton fused MoE cannot be imported: {exc}") from exc
    out: torch.Tensor = module.outplace_fused_experts(  # SGLang is untyped here
        x.contiguous(),
        w13.contiguous(),
        w2.contiguous(),
        topk_weights,
        topk_ids,
        activation=act.value,
        is_gated=True,
    )
    return out
