"""Quantized linear and MoE adapters on ``sgl_kernel`` (sglang-kernel 0.4.x) and SGLang's Triton
fused experts: the GEMMs SGLang's quantization methods call on an NVIDIA GPU.

Each linear adapter prepares its weight layout once (``prepare``): the kernels take the weight
column-major (``mat_b`` ``[K, N]`` with ``stride(0) == 1``: the transpose view of the checkpoint's
row-major ``[N, K]``, no copy) and float32 scales; a layer whose shape a kernel cannot take is
declined there, so it runs on the next candidate with the checkpoint layout. Sources:
``sgl-kernel/python/sgl_kernel/gemm.py`` (the Python API) and the ``TORCH_CHECK`` s of
``sgl-kernel/csrc/gemm/int8_gemm_kernel.cu``, ``fp8_gemm_kernel.cu``,
``fp8_blockwise_gemm_kernel.cu`` and ``awq_kernel.cu``.

Activations are quantized by the layer's rule (``obj.act_quant``) with core's ``quantize_rows``
(torch, on the device), then the GEMM is sgl_kernel's. sgl_kernel's own FP8 quantization kernels
are not used: ``sgl_per_token_quant_fp8`` multiplies by ``1 / scale`` and its small-batch kernel
has no zero guard (``per_token_quant_fp8.cu``: ``scale_inv = 1.0f / scale``), so an all-zero
token would become NaN, and neither computes the compressed-tensors rule (a scale in the
activation's dtype). The GEMMs write float16 or bfloat16 only: float32 activations are declined.

The MoE adapters call SGLang's Triton ``fused_experts`` with its quantized paths
(``use_int8_w8a8`` / ``use_fp8_w8a8``, ``block_shape``), which quantize activations by the
``absmax`` rule in Triton; layers of the compressed-tensors rule are declined.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
import torch.nn.functional as F

from sglang_fl.ops.moe import MoeActivation, check_activation
from sglang_fl.ops.quantization.numerics import (
    ActQuant,
    QuantType,
    check_act_quant,
    quantize_rows,
    unpack_int32,
)
from sglang_fl.types import PreparedKernel, Unsupported

from ..backend import SGL_KERNEL
from .moe import SGLANG_FUSED_MOE, _require_sglang_runtime

__all__ = ["ADAPTERS"]

HALF = (torch.float16, torch.bfloat16)
# fp8_blockwise_scaled_mm's activation groups and weight blocks (``mat_a.size(1) / 128``).
CUTLASS_BLOCK = (128, 128)


def _capability(tensor: torch.Tensor) -> int:
    major, minor = torch.cuda.get_device_capability(tensor.device)
    return major * 10 + minor


def _half_only(x: torch.Tensor, kernel: str) -> None:
    if x.dtype not in HALF:
        raise Unsupported(f"{kernel} writes float16 or bfloat16 (out_dtype), not {x.dtype}")


def _bias(bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """The kernels add a contiguous bias of the output dtype."""
    return None if bias is None else bias.to(dtype).contiguous()


# --- w8a8_int8_linear: int8_scaled_mm ---------------------------------------------------------


def prepare_int8(obj: Any, weight: torch.Tensor, weight_scale: torch.Tensor) -> tuple[Any, ...]:
    """``weight.t()`` (column-major ``[K, N]``) and a contiguous float32 scale ``[N]``."""
    n, k = weight.shape
    if k % 16 or n % 8:
        raise Unsupported(f"int8_scaled_mm needs K % 16 == 0 and N % 8 == 0 (K={k}, N={n})")
    sm = _capability(weight)
    if not 80 <= sm <= 90:
        raise Unsupported(f"int8_scaled_mm serves sm80-sm90 with bfloat16 output, not sm{sm}")
    return weight.t(), weight_scale.to(torch.float32).contiguous()


def w8a8_int8_linear(
    obj: Any,
    x: torch.Tensor,
    weight_t: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    _half_only(x, "int8_scaled_mm")
    rule = check_act_quant(obj.act_quant, "w8a8_int8_linear")
    if x.shape[0] == 0:
        return x.new_empty((0, weight_t.shape[1]))
    q, scale = quantize_rows(x, QuantType.INT8, rule)
    out: torch.Tensor = SGL_KERNEL.require().int8_scaled_mm(
        q.contiguous(), weight_t, scale.reshape(-1), weight_scale, x.dtype, _bias(bias, x.dtype)
    )
    return out


# --- w8a8_fp8_linear: fp8_scaled_mm -----------------------------------------------------------


def prepare_fp8(obj: Any, weight: torch.Tensor, weight_scale: torch.Tensor) -> tuple[Any, ...]:
    n, k = weight.shape
    if k % 16 or n % 8:
        raise Unsupported(f"fp8_scaled_mm needs K % 16 == 0 and N % 8 == 0 (K={k}, N={n})")
    sm = _capability(weight)
    if sm < 89:
        raise Unsupported(f"fp8_scaled_mm needs sm89 or newer, not sm{sm}")
    return weight.t(), weight_scale.to(torch.float32).contiguous()


def w8a8_fp8_linear(
    obj: Any,
    x: torch.Tensor,
    weight_t: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    _half_only(x, "fp8_scaled_mm")
    rule = check_act_quant(obj.act_quant, "w8a8_fp8_linear")
    if x.shape[0] == 0:
        return x.new_empty((0, weight_t.shape[1]))
    q, scale = quantize_rows(x, QuantType.FP8, rule)
    out: torch.Tensor = SGL_KERNEL.require().fp8_scaled_mm(
        q.contiguous(), weight_t, scale.reshape(-1).contiguous(), weight_scale, x.dtype,
        _bias(bias, x.dtype),
    )  # fmt: skip
    return out


# --- w8a8_block_fp8_linear: fp8_blockwise_scaled_mm -------------------------------------------


def prepare_block_fp8(
    obj: Any, weight: torch.Tensor, weight_scale: torch.Tensor
) -> tuple[Any, ...]:
    """``weight.t()`` and ``weight_scale.t()`` (``[K/128, N/128]``, K-major) for 128x128 blocks."""
    block = tuple(obj.weight_block_size)
    if block != CUTLASS_BLOCK:
        raise Unsupported(f"fp8_blockwise_scaled_mm takes 128x128 blocks, not {block}")
    n, k = weight.shape
    if n % 128 or k % 128:
        raise Unsupported(f"fp8_blockwise_scaled_mm needs whole blocks (K={k}, N={n})")
    sm = _capability(weight)
    if sm < 90:
        raise Unsupported(f"fp8_blockwise_scaled_mm is built for sm90 and newer, not sm{sm}")
    return weight.t(), weight_scale.to(torch.float32).t()


def w8a8_block_fp8_linear(
    obj: Any,
    x: torch.Tensor,
    weight_t: torch.Tensor,
    scale_t: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    _half_only(x, "fp8_blockwise_scaled_mm")
    rule = check_act_quant(obj.act_quant, "w8a8_block_fp8_linear")
    if x.shape[0] == 0:
        return x.new_empty((0, weight_t.shape[1]))
    q, scale = quantize_rows(x, QuantType.FP8, rule, CUTLASS_BLOCK[1])
    out: torch.Tensor = SGL_KERNEL.require().fp8_blockwise_scaled_mm(
        q.contiguous(),
        weight_t,
        scale.t().contiguous().t(),
        scale_t,
        x.dtype,  # M-major scales
    )
    return out if bias is None else out + bias.to(x.dtype)


# --- wna16_linear: awq_dequantize, then a float16 GEMM ----------------------------------------

_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's nibble order (awq_kernel.cu dequantizes it)


def _awq_pack(values: torch.Tensor) -> torch.Tensor:
    """Unsigned 4-bit ``[rows, cols]`` -> AutoAWQ's ``[rows, cols / 8]`` int32 layout."""
    rows, cols = values.shape
    grouped = values.to(torch.int64).reshape(rows, cols // 8, 8)
    packed = torch.zeros(rows, cols // 8, dtype=torch.int64, device=values.device)
    for nibble, column in enumerate(_AWQ_ORDER):
        packed |= grouped[..., column] << (4 * nibble)
    return torch.where(packed >= 1 << 31, packed - (1 << 32), packed).to(torch.int32)


def prepare_wna16(
    obj: Any,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_zero_point: torch.Tensor | None,
) -> tuple[Any, ...]:
    """The contract's layout repacked as AutoAWQ's (``qweight`` ``[K, N/8]``, ``scales``
    ``[K/g, N]`` float16, ``qzeros`` ``[K/g, N/8]``), what ``awq_dequantize`` reads."""
    if obj.num_bits != 4:
        raise Unsupported(f"awq_dequantize unpacks 4-bit weights, not {obj.num_bits}-bit")
    if weight_scale.dtype != torch.float16:
        raise Unsupported(
            f"awq_dequantize reads float16 scales (at::Half), not {weight_scale.dtype}"
        )
    n, groups = weight_scale.shape
    k = groups * obj.group_size
    if k % 16 or (n // 8) % 16 or n % 8:
        raise Unsupported(
            f"awq_dequantize's 16x16 thread blocks need K and N / 8 multiples of 16 (K={k}, N={n})"
        )
    offset = 1 << (obj.num_bits - 1)
    values = unpack_int32(weight, 4, k).to(torch.int32) + offset  # [N, K] unsigned
    zeros = torch.full_like(weight_scale, offset, dtype=torch.int32)
    if weight_zero_point is not None:
        zeros = weight_zero_point.to(torch.int32) + offset
    return _awq_pack(values.t()), weight_scale.t().contiguous(), _awq_pack(zeros.t())


def wna16_linear(
    obj: Any,
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_zero_point: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``weight``, ``weight_scale`` and ``weight_zero_point`` are what :func:`prepare_wna16`
    made: AutoAWQ's ``qweight``, ``scales`` and ``qzeros``."""
    qweight, scales, qzeros = weight, weight_scale, weight_zero_point
    if x.dtype != scales.dtype:
        raise Unsupported(
            f"awq_dequantize's weight is {scales.dtype}; the activations are {x.dtype}"
        )
    if x.shape[0] == 0:
        return x.new_empty((0, scales.shape[1]))
    dense = SGL_KERNEL.require().awq_dequantize(qweight, scales, qzeros)  # [K, N]
    return F.linear(x, dense.t(), _bias(bias, x.dtype))


# --- quantized experts: SGLang's Triton fused_experts -----------------------------------------

_SGLANG_ACTIVATIONS = {MoeActivation.SILU: "silu", MoeActivation.GELU: "gelu_tanh"}


def _fused_experts_module(op: str, x: torch.Tensor, rule: object) -> Any:
    """SGLang's fused-experts module; declines what its quantized paths lack."""
    if check_act_quant(rule, op) is not ActQuant.ABSMAX:
        raise Unsupported(
            "SGLang's Triton fused experts quantize activations by the kernels' absmax rule; "
            "this layer's format quantizes them by compressed-tensors' rule"
        )
    if x.dtype not in HALF:
        raise Unsupported(f"SGLang's Triton fused experts run float16/bfloat16, not {x.dtype}")
    try:
        module = importlib.import_module(SGLANG_FUSED_MOE)
    except ImportError as exc:
        raise Unsupported(f"SGLang's Triton fused MoE cannot be imported: {exc}") from exc
    _require_sglang_runtime(module)
    return module


def prepare_expert_scales(
    obj: Any, w13: torch.Tensor, w2: torch.Tensor, w13_scale: torch.Tensor, w2_scale: torch.Tensor
) -> tuple[Any, ...]:
    """Per-channel scales as ``[E, N, 1]`` (what ``fused_experts`` reads per channel)."""
    if getattr(obj, "weight_block_size", None) is not None:
        return w13.contiguous(), w2.contiguous(), w13_scale, w2_scale
    return w13.contiguous(), w2.contiguous(), w13_scale.unsqueeze(-1), w2_scale.unsqueeze(-1)


def _fused_experts(
    op: str,
    obj: Any,
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    w13_scale: torch.Tensor,
    w2_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    **quant: Any,
) -> torch.Tensor:
    act = check_activation(activation, op)
    module = _fused_experts_module(op, x, obj.act_quant)
    if x.shape[0] == 0:
        return x.new_empty((0, w2.shape[1]))
    block = getattr(obj, "weight_block_size", None)
    out: torch.Tensor = module.outplace_fused_experts(
        x.contiguous(), w13, w2, topk_weights, topk_ids,
        activation=_SGLANG_ACTIVATIONS[act], is_gated=True, w1_scale=w13_scale,
        w2_scale=w2_scale, per_channel_quant=block is None,
        block_shape=None if block is None else list(block), **quant,
    )  # fmt: skip
    return out


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
    return _fused_experts(
        "fused_moe_w8a8_int8", obj, x, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids,
        activation, use_int8_w8a8=True,
    )  # fmt: skip


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
    return _fused_experts(
        "fused_moe_w8a8_fp8", obj, x, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids,
        activation, use_fp8_w8a8=True,
    )  # fmt: skip


# op -> adapter, each with its weight-preparation step (plugin.py registers them).
ADAPTERS = {
    "w8a8_int8_linear": PreparedKernel(w8a8_int8_linear, prepare_int8),
    "w8a8_fp8_linear": PreparedKernel(w8a8_fp8_linear, prepare_fp8),
    "w8a8_block_fp8_linear": PreparedKernel(w8a8_block_fp8_linear, prepare_block_fp8),
    "wna16_linear": PreparedKernel(wna16_linear, prepare_wna16),
    "fused_moe_w8a8_int8": PreparedKernel(fused_moe_w8a8_int8, prepare_expert_scales),
    "fused_moe_w8a8_fp8": PreparedKernel(fused_moe_w8a8_fp8, prepare_expert_scales),
}
