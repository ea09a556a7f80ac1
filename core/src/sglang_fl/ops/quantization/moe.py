"""Quantized MoE experts: ``fused_moe`` with W8A8 int8 or FP8 (per channel or block) experts.

Same routing, activation and weighted sum as ``fused_moe`` (the shared expert loop,
``ops/experts.py``); each expert projection is the quantized linear of its format: the rows
entering it (the tokens, then each token's gated activation) are quantized per token (FP8
block: per token and group of ``block[1]`` channels) by ``obj.act_quant``, the weights carry
their scales per output channel or per block. SGLang's quantized MoE methods
(``CompressedTensorsW8A8Fp8MoE``, ``Fp8MoEMethod``, the NPU W8A8 int8 MoE) compute the same,
with Triton or torch_npu kernels (``fused_experts(use_int8_w8a8=..., use_fp8_w8a8=...)``,
``npu_grouped_matmul``).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..contract import OpCase, OpContract, OpInputs, Tolerance, axis, case_grid, layer
from ..contract import random_tensor as _random
from ..experts import MoeActivation, check_activation, gated_activation, run_experts
from .numerics import (
    FP8_DTYPE,
    ActQuant,
    QuantType,
    check_act_quant,
    dequantize_block,
    dequantize_rows,
    int8_matmul,
    quantize_rows,
)

__all__ = ["FUSED_MOE_W8A8_FP8", "FUSED_MOE_W8A8_INT8"]

_WEIGHTS = ("w13", "w2", "w13_scale", "w2_scale")


def _fused_moe_w8a8_int8_signature(
    obj: Any,
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    w13_scale: torch.Tensor,
    w2_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
) -> torch.Tensor:
    """W8A8 int8 experts: ``fused_moe`` with each projection ``w8a8_int8_linear``'s.

    ``w13`` int8 ``[experts, 2 * intermediate, hidden]`` (gate rows then up rows), ``w13_scale``
    float32 ``[experts, 2 * intermediate]``; ``w2`` int8 ``[experts, hidden, intermediate]``,
    ``w2_scale`` float32 ``[experts, hidden]``; ``x``, ``topk_weights``, ``topk_ids`` and
    ``activation`` as ``fused_moe``'s. The rows entering each projection are quantized per
    token by ``obj.act_quant``; each projection's output is rounded to ``x``'s dtype, the
    weighted sum is float32. Returns a new ``[num_tokens, hidden]`` tensor; no input is written.
    """
    raise NotImplementedError


def _fused_moe_w8a8_fp8_signature(
    obj: Any,
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    w13_scale: torch.Tensor,
    w2_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
) -> torch.Tensor:
    """FP8 experts: ``fused_moe`` with each projection ``w8a8_fp8_linear``'s or, with
    ``obj.weight_block_size = (rows, cols)``, ``w8a8_block_fp8_linear``'s.

    ``w13``/``w2`` float8_e4m3fn as ``fused_moe_w8a8_int8``'s; scales float32 per output
    channel (``[experts, N]``) without a block size, else per block
    (``[experts, ceil(N / rows), K / cols]``) with the activations quantized per group of
    ``cols`` channels.
    """
    raise NotImplementedError


Project = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _experts(
    op_name: str,
    project: Project,
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    w13_scale: torch.Tensor,
    w2_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
) -> torch.Tensor:
    act = check_activation(activation, op_name)

    def expert_rows(expert: int, rows: torch.Tensor) -> torch.Tensor:
        gate_up = project(rows, w13[expert], w13_scale[expert]).to(x.dtype)
        hidden = gated_activation(gate_up, act)
        return project(hidden, w2[expert], w2_scale[expert]).to(x.dtype)

    return run_experts(x, topk_weights, topk_ids, w13.shape[0], w2.shape[1], expert_rows)


def fused_moe_w8a8_int8_reference(
    obj: Any,
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    w13_scale: torch.Tensor,
    w2_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
) -> torch.Tensor:
    """The expert loop with ``w8a8_int8_linear``'s projection (exact int32 products)."""
    name = "fused_moe_w8a8_int8"
    rule = check_act_quant(obj.act_quant, name)

    def project(rows: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        q, row_scale = quantize_rows(rows, QuantType.INT8, rule)
        return int8_matmul(q, weight).to(torch.float32) * row_scale * scale

    return _experts(
        name, project, x, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids, activation
    )


def fused_moe_w8a8_fp8_reference(
    obj: Any,
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    w13_scale: torch.Tensor,
    w2_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
) -> torch.Tensor:
    """The expert loop with the FP8 (per channel or block) linear's projection."""
    name = "fused_moe_w8a8_fp8"
    rule = check_act_quant(obj.act_quant, name)
    block = obj.weight_block_size

    def project(rows: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        if block is None:
            q, row_scale = quantize_rows(rows, QuantType.FP8, rule)
            return (q.to(torch.float32) @ weight.to(torch.float32).t()) * row_scale * scale
        q, row_scale = quantize_rows(rows, QuantType.FP8, rule, block[1])
        dense = dequantize_block(weight, scale, tuple(block))
        return dequantize_rows(q, row_scale, block[1]) @ dense.t()

    return _experts(
        name, project, x, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids, activation
    )


# --- cases -----------------------------------------------------------------------------------


def _case_name(p: Mapping[str, Any]) -> str:
    name = f"tokens={p['tokens']},experts={p['experts']},top_k={p['top_k']},{p['activation']}"
    name += f",act_quant={p['act_quant']}"
    if p.get("block"):
        name += ",block={}x{}".format(*p["block"])
    return name + ("" if p["contiguous"] else ",strided")


_SIZES = {"hidden": 256, "intermediate": 128}
_ROUTING = ({"experts": 1, "top_k": 1}, {"experts": 8, "top_k": 2})
_RULES = axis("act_quant", tuple(rule.value for rule in ActQuant))
_ACTIVATIONS = axis("activation", tuple(a.value for a in MoeActivation))


def _routing_inputs(
    p: Mapping[str, Any], dtype: torch.dtype, device: torch.device, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tokens, experts, top_k = p["tokens"], p["experts"], p["top_k"]
    x = _random((tokens, _SIZES["hidden"]), dtype, device, g, contiguous=p["contiguous"])
    ids = torch.rand(tokens, experts, generator=g).argsort(dim=-1)[:, :top_k]
    weights = torch.rand(tokens, top_k, generator=g).softmax(dim=-1)
    return x, weights.to(device), ids.to(device, torch.int32)


def _make_int8_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, g: torch.Generator
) -> OpInputs:
    p = case.params
    experts, hidden, inter = p["experts"], _SIZES["hidden"], _SIZES["intermediate"]
    x, weights, ids = _routing_inputs(p, dtype, device, g)
    w13 = torch.randint(-127, 128, (experts, 2 * inter, hidden), generator=g, dtype=torch.int8)
    w2 = torch.randint(-127, 128, (experts, hidden, inter), generator=g, dtype=torch.int8)
    s13 = (torch.rand(experts, 2 * inter, generator=g) + 0.5) * 1.7 / (127 * hidden**0.5)
    s2 = (torch.rand(experts, hidden, generator=g) + 0.5) * 1.7 / (127 * inter**0.5)
    return OpInputs(
        obj=layer(act_quant=p["act_quant"], num_experts=experts),
        args=(
            x,
            w13.to(device),
            w2.to(device),
            s13.to(device),
            s2.to(device),
            weights,
            ids,
            p["activation"],
        ),
        preserved=("x", *_WEIGHTS, "topk_weights", "topk_ids"),
    )


def _make_fp8_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, g: torch.Generator
) -> OpInputs:
    p = case.params
    experts, hidden, inter = p["experts"], _SIZES["hidden"], _SIZES["intermediate"]
    block = p["block"]
    x, weights, ids = _routing_inputs(p, dtype, device, g)

    def fp8(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g).mul(64).clamp(-448, 448).to(FP8_DTYPE)

    def scales(n: int, k: int) -> torch.Tensor:
        shape = (experts, n) if block is None else (experts, -(-n // block[0]), k // block[1])
        return (torch.rand(shape, generator=g) + 0.5) / (64 * math.sqrt(k))

    return OpInputs(
        obj=layer(act_quant=p["act_quant"], weight_block_size=block, num_experts=experts),
        args=(
            x,
            fp8(experts, 2 * inter, hidden).to(device),
            fp8(experts, hidden, inter).to(device),
            scales(2 * inter, hidden).to(device),
            scales(hidden, inter).to(device),
            weights,
            ids,
            p["activation"],
        ),
        preserved=("x", *_WEIGHTS, "topk_weights", "topk_ids"),
    )


# Two chained quantized projections: a different rounding of the first's output (the order of
# its sums) may move an intermediate activation across a quantization step of the second.
FUSED_MOE_QUANTIZED_TOLERANCES: Mapping[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(atol=5e-3, rtol=5e-3),
    torch.float16: Tolerance(atol=2e-2, rtol=2e-2),
    torch.bfloat16: Tolerance(atol=5e-2, rtol=5e-2),
}
_TOKENS = axis("tokens", (0, 1, 17))

FUSED_MOE_W8A8_INT8 = OpContract(
    name="fused_moe_w8a8_int8",
    sglang_layer="FusedMoE (W8A8 int8 experts: compressed-tensors, w8a8_int8)",
    summary="MoE experts with int8 weights per channel x int8 activations per token",
    signature=inspect.signature(_fused_moe_w8a8_int8_signature),
    details=inspect.getdoc(_fused_moe_w8a8_int8_signature) or "",
    reference=fused_moe_w8a8_int8_reference,
    dtypes=(torch.float32, torch.float16, torch.bfloat16),
    tolerances=FUSED_MOE_QUANTIZED_TOLERANCES,
    cases=(
        *case_grid(
            _case_name, _TOKENS, _ROUTING, _ACTIVATIONS, _RULES, axis("contiguous", (True,))
        ),
        *case_grid(
            _case_name,
            axis("tokens", (17,)),
            _ROUTING[1:],
            _ACTIVATIONS[:1],
            _RULES,
            axis("contiguous", (False,)),
        ),
    ),
    make_inputs=_make_int8_inputs,
    weights=_WEIGHTS,
)

_BLOCKS = axis("block", (None, (128, 128)))
FUSED_MOE_W8A8_FP8 = OpContract(
    name="fused_moe_w8a8_fp8",
    sglang_layer="FusedMoE (FP8 experts: compressed-tensors FP8_DYNAMIC/FP8_BLOCK, fp8)",
    summary="MoE experts with fp8 weights per channel or block x fp8 activations",
    signature=inspect.signature(_fused_moe_w8a8_fp8_signature),
    details=inspect.getdoc(_fused_moe_w8a8_fp8_signature) or "",
    reference=fused_moe_w8a8_fp8_reference,
    dtypes=(torch.float32, torch.float16, torch.bfloat16),
    tolerances=FUSED_MOE_QUANTIZED_TOLERANCES,
    cases=(
        *case_grid(
            _case_name,
            _TOKENS,
            _ROUTING,
            _ACTIVATIONS[:1],
            _RULES,
            _BLOCKS,
            axis("contiguous", (True,)),
        ),
        *case_grid(
            _case_name,
            axis("tokens", (17,)),
            _ROUTING[1:],
            _ACTIVATIONS[1:],
            _RULES[:1],
            _BLOCKS,
            axis("contiguous", (False,)),
        ),
    ),
    make_inputs=_make_fp8_inputs,
    weights=_WEIGHTS,
)
