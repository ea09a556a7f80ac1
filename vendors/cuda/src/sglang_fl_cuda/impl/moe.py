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
  runs in TF32, so float32 calls are declined to the next candidate. The contract's ``"gelu"``
  is tanh-GELU, which SGLang's Triton path names ``"gelu_tanh"`` (its ``"gelu"`` is erf-GELU).
  ``fused_experts_impl`` reads SGLang's runtime context (``get_parallel().tp_group`` for its
  output allocation, ``get_exec().moe.enable_fused_moe_sum_all_reduce``), which exists only in
  a running SGLang worker: elsewhere (the conformance kit, the hardware script, vLLM) the call
  is declined with ``Unsupported`` before anything runs, naming what SGLang said.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from sglang_fl.ops.moe import MoeActivation, ScoringFunc, check_activation
from sglang_fl.types import Unsupported

from ..backend import SGL_KERNEL

# Where SGLang keeps its Triton fused-experts entry points.
SGLANG_FUSED_MOE = "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe"
# SGLang 0.5.23's fused_experts_impl accepts float32 too, but its Triton kernel multiplies with
# tl.dot's default precision, TF32 for float32 inputs: outside the float32 tolerance.
_FUSED_MOE_DTYPES = frozenset({torch.float16, torch.bfloat16})
# The contract's activation -> the name SGLang's Triton fused_experts_impl computes it by.
_SGLANG_ACTIVATIONS = {MoeActivation.SILU: "silu", MoeActivation.GELU: "gelu_tanh"}


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
    _require_sglang_runtime(module)
    out: torch.Tensor = module.outplace_fused_experts(  # SGLang is untyped here
        x.contiguous(),
        w13.contiguous(),
        w2.contiguous(),
        topk_weights,
        topk_ids,
        activation=_SGLANG_ACTIVATIONS[act],
        is_gated=True,
    )
    return out


def _require_sglang_runtime(module: Any) -> None:
    """``Unsupported`` unless the runtime context ``fused_experts_impl`` reads is published.

    The reads are the kernel's own (``module.get_parallel``/``get_exec`` are what the fused-MoE
    module imported from ``sglang.srt.runtime_context``), made here first so that a process
    without an SGLang worker gets a decline naming SGLang's message, not a failure mid-call.
    """
    try:
        module.get_parallel().tp_group  # noqa: B018  # the read itself is the check
        module.get_exec().moe.enable_fused_moe_sum_all_reduce  # noqa: B018
    except (RuntimeError, ValueError, AttributeError) as exc:
        raise Unsupported(
            "SGLang's Triton fused MoE runs only inside an SGLang worker (it reads SGLang's "
            f"runtime context, which this process has not published): {exc}"
        ) from exc
