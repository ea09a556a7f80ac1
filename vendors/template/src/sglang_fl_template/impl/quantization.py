"""The quantized ops on template: W8A8 int8 / FP8 / W4A16 linear layers and quantized experts.

Each adapter comes with a ``prepare`` step (``PreparedKernel``): called once per layer when its
weights are loaded, with the weights in the contract's (checkpoint) layout, it returns the layout
the kernel wants (transposed, repacked, a device format), which every call then receives in the
weights' places. It must not write what it is given (a fallback reads it) and may raise
Unsupported for a layer the kernel cannot take (the layer then runs on the next candidate).
Activations are quantized inside the op by ``obj.act_quant`` (the checkpoint format's rule:
``sglang_fl.ops.quantization.numerics.quantize_rows`` computes it).
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.types import PreparedKernel, Unsupported


def prepare_weights(obj: Any, *weights: torch.Tensor | None) -> tuple[Any, ...]:
    # Replace with the chip's layout (e.g. weight.t() for a [K, N] GEMM operand, a repack into
    # the chip's tile format); returning the weights as they are is the checkpoint layout.
    return weights


def w8a8_int8_linear(
    obj: Any,
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    # Replace with the chip kernel: x [M, K] float, weight int8 (as prepare_weights made it;
    # checkpoint [N, K]), weight_scale float32 [N]; quantize x per token to int8 by
    # obj.act_quant, int32 GEMM, times both scales, plus bias, in x's dtype: a new [M, N].
    raise Unsupported("template: w8a8_int8_linear is not implemented")


def w8a8_fp8_linear(
    obj: Any,
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    # Replace with the chip kernel: as w8a8_int8_linear with float8_e4m3fn weights and
    # activations quantized per token to float8_e4m3fn.
    raise Unsupported("template: w8a8_fp8_linear is not implemented")


def w8a8_block_fp8_linear(
    obj: Any,
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    # Replace with the chip kernel: float8_e4m3fn weights with a float32 scale per
    # obj.weight_block_size block (checkpoint [ceil(N / rows), K / cols]); activations per token
    # and group of cols channels.
    raise Unsupported("template: w8a8_block_fp8_linear is not implemented")


def wna16_linear(
    obj: Any,
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_zero_point: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    # Replace with the chip kernel: obj.num_bits (4/8) integer weights (checkpoint: int32 packed
    # along K, compressed-tensors' pack_quantized), scale and optional zero point per
    # obj.group_size input channels; x is not quantized.
    raise Unsupported("template: wna16_linear is not implemented")


def fused_moe_w8a8_int8(
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
    # Replace with the chip kernel: fused_moe with int8 experts (scales [experts, N]) and each
    # projection's input quantized per token by obj.act_quant.
    raise Unsupported("template: fused_moe_w8a8_int8 is not implemented")


def fused_moe_w8a8_fp8(
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
    # Replace with the chip kernel: fused_moe with float8_e4m3fn experts, scales per channel or,
    # with obj.weight_block_size, per block.
    raise Unsupported("template: fused_moe_w8a8_fp8 is not implemented")


# Each adapter with its weight-preparation step, as plugin.py registers them.
W8A8_INT8_LINEAR = PreparedKernel(w8a8_int8_linear, prepare_weights)
W8A8_FP8_LINEAR = PreparedKernel(w8a8_fp8_linear, prepare_weights)
W8A8_BLOCK_FP8_LINEAR = PreparedKernel(w8a8_block_fp8_linear, prepare_weights)
WNA16_LINEAR = PreparedKernel(wna16_linear, prepare_weights)
FUSED_MOE_W8A8_INT8 = PreparedKernel(fused_moe_w8a8_int8, prepare_weights)
FUSED_MOE_W8A8_FP8 = PreparedKernel(fused_moe_w8a8_fp8, prepare_weights)
