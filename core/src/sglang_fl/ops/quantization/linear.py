"""Quantized linear layers: ``y = x @ dequant(W).T + bias`` with the checkpoint's numerics.

One op per weight format SGLang's linear methods serve, each named after the scheme and the
kernels vendors ship for it:

- ``w8a8_int8_linear``: int8 weights per output channel, activations int8 per token
  (sgl_kernel ``int8_scaled_mm``; torch_npu ``npu_dynamic_quant`` + ``npu_quant_matmul``);
- ``w8a8_fp8_linear``: float8_e4m3fn weights per output channel (a per-tensor checkpoint is
  given as its per-channel expansion), activations fp8 per token (sgl_kernel
  ``fp8_scaled_mm``, ``sgl_per_token_quant_fp8``);
- ``w8a8_block_fp8_linear``: fp8 weights per block (DeepSeek-V3's 128x128), activations fp8
  per token and group of ``block[1]`` input channels (``fp8_blockwise_scaled_mm``, SGLang's
  ``w8a8_block_fp8_matmul``, ``per_token_group_quant_fp8``);
- ``wna16_linear``: 4- or 8-bit integer weights per group of input channels, activations as
  they are (Marlin ``gptq_marlin_gemm``, ``awq_dequantize``; torch_npu
  ``npu_weight_quant_batchmatmul``).

The weights are the op's :attr:`~sglang_fl.ops.OpContract.weights`: fixed from load on, so an
implementation may prepare its own layout of them once (``OpImpl.prepare``: transposed,
repacked, a device format) and then receives that in their place. The reference has no
prepare step: it computes from the checkpoint layout every call, so it can serve any call a
prepared kernel declines. Activations are quantized inside the op, by the layer's
``act_quant`` rule (:class:`~sglang_fl.ops.quantization.numerics.ActQuant`): the numbers the
format's own reference computes (compressed-tensors' quantize-dequantize of each token).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from ..contract import (
    TOKEN_COUNTS,
    OpCase,
    OpContract,
    OpInputs,
    Tolerance,
    axis,
    case_grid,
    layer,
    random_tensor,
)
from .numerics import (
    FP8_DTYPE,
    ActQuant,
    QuantType,
    check_act_quant,
    dequantize_block,
    dequantize_rows,
    int8_matmul,
    pack_int32,
    quantize_rows,
    unpack_int32,
)

__all__ = [
    "QUANTIZED_LINEAR_TOLERANCES",
    "W8A8_BLOCK_FP8_LINEAR",
    "W8A8_FP8_LINEAR",
    "W8A8_INT8_LINEAR",
    "WNA16_LINEAR",
    "dequantize_wna16",
]

# Float inputs; outputs in the input's dtype.
QUANTIZED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# What separates two implementations that both follow the format's activation rule: the order
# of the float sums, the one rounding to the output dtype and, rarely, an activation exactly
# at a rounding tie quantized one step apart (a kernel multiplying by 1 / scale). A kernel with
# another rule (int8 divided by 127 where the format says 127.5, a float32 scale where it says
# the activation's dtype) is outside: it quantizes an activation or a scale of the format's
# checkpoints differently (see ``ActQuant``).
QUANTIZED_LINEAR_TOLERANCES: Mapping[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(atol=1e-3, rtol=1e-3),
    torch.float16: Tolerance(atol=1e-2, rtol=1e-2),
    torch.bfloat16: Tolerance(atol=3e-2, rtol=3e-2),
}


def _finish(out: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """The float32 product plus ``bias``, rounded once to the activation dtype."""
    if bias is not None:
        out = out + bias.to(torch.float32)
    return out.to(dtype)


# --- w8a8_int8_linear ------------------------------------------------------------------------


def _w8a8_int8_signature(
    obj: Any,
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """int8 weights, int8 activations quantized per token: ``[M, K]`` -> ``[M, N]``.

    ``x`` ``[M, K]`` float (rows may be strided); ``weight`` int8 ``[N, K]``; ``weight_scale``
    float32 ``[N]`` (``W = weight * weight_scale[:, None]``); ``bias`` ``[N]`` or ``None``.
    Each token is quantized symmetrically to int8 by ``obj.act_quant`` (:class:`ActQuant`),
    the integer product accumulated exactly, scaled by both scales; the bias is added before
    the one rounding to ``x``'s dtype. Returns a new tensor; no input is written.
    """
    raise NotImplementedError


def w8a8_int8_linear_reference(
    obj: Any,
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token quantization by the format's rule, an exact int32 GEMM, both scales."""
    rule = check_act_quant(obj.act_quant, "w8a8_int8_linear")
    q, scale = quantize_rows(x, QuantType.INT8, rule)
    acc = int8_matmul(q, weight).to(torch.float32)
    return _finish(acc * scale * weight_scale.to(torch.float32), bias, x.dtype)


# --- w8a8_fp8_linear -------------------------------------------------------------------------


def _w8a8_fp8_signature(
    obj: Any,
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """float8_e4m3fn weights per output channel, fp8 activations per token.

    As ``w8a8_int8_linear`` with ``weight`` float8_e4m3fn ``[N, K]`` and each token quantized
    to float8_e4m3fn by ``obj.act_quant``. A per-tensor checkpoint is served with its scales
    expanded per output channel (each fused part's scale over its rows).
    """
    raise NotImplementedError


def w8a8_fp8_linear_reference(
    obj: Any,
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token fp8 quantization, the fp8 values multiplied in float32, both scales."""
    rule = check_act_quant(obj.act_quant, "w8a8_fp8_linear")
    q, scale = quantize_rows(x, QuantType.FP8, rule)
    acc = q.to(torch.float32) @ weight.to(torch.float32).t()
    return _finish(acc * scale * weight_scale.to(torch.float32), bias, x.dtype)


# --- w8a8_block_fp8_linear -------------------------------------------------------------------


def _w8a8_block_fp8_signature(
    obj: Any,
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """float8_e4m3fn weights per block, fp8 activations per token and group of input channels.

    ``obj.weight_block_size`` is ``(rows, cols)`` (DeepSeek-V3: ``(128, 128)``); ``weight``
    float8_e4m3fn ``[N, K]`` with ``K`` a multiple of ``cols``; ``weight_scale`` float32
    ``[ceil(N / rows), K / cols]`` (each block of ``weight`` times its scale; the last block
    row may be partial). Each token is quantized per group of ``cols`` input channels by
    ``obj.act_quant``; otherwise as ``w8a8_int8_linear``.
    """
    raise NotImplementedError


def w8a8_block_fp8_linear_reference(
    obj: Any,
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Both sides dequantized to float32 (activations per group, weights per block), one GEMM."""
    rule = check_act_quant(obj.act_quant, "w8a8_block_fp8_linear")
    rows, cols = obj.weight_block_size
    q, scale = quantize_rows(x, QuantType.FP8, rule, cols)
    dense = dequantize_block(weight, weight_scale, (rows, cols))
    return _finish(dequantize_rows(q, scale, cols) @ dense.t(), bias, x.dtype)


# --- wna16_linear ----------------------------------------------------------------------------


def _wna16_signature(
    obj: Any,
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_zero_point: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """4- or 8-bit integer weights per group of input channels; activations not quantized.

    ``obj.num_bits`` (4 or 8), ``obj.group_size`` (``K`` for one group per row). ``weight``
    int32 ``[N, K * num_bits / 32]`` in compressed-tensors' ``pack_quantized`` layout (value
    ``i`` of a word in bits ``num_bits*i`` and up, stored plus ``2**(num_bits-1)``; AWQ and
    GPTQ checkpoints are repacked to it at load); ``weight_scale`` ``[N, K / group_size]`` of
    a float dtype; ``weight_zero_point`` ``None`` (symmetric) or int8 ``[N, K / group_size]``
    in the signed range. ``W = (q - zero_point) * scale`` per group, in the scale's dtype (as
    compressed-tensors dequantizes), then ``x @ W.T + bias`` in ``x``'s dtype.
    """
    raise NotImplementedError


def dequantize_wna16(
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_zero_point: torch.Tensor | None,
    num_bits: int,
    group_size: int,
) -> torch.Tensor:
    """The dense ``[N, K]`` weight in the scale's dtype (compressed-tensors' dequantize)."""
    columns = weight_scale.shape[-1] * group_size
    q = unpack_int32(weight, num_bits, columns).to(weight_scale.dtype)
    scale = weight_scale.repeat_interleave(group_size, dim=-1)
    if weight_zero_point is not None:
        q = q - weight_zero_point.to(weight_scale.dtype).repeat_interleave(group_size, dim=-1)
    return q * scale


def wna16_linear_reference(
    obj: Any,
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_zero_point: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """The weight dequantized per call (compressed-tensors' formula), then a plain linear."""
    dense = dequantize_wna16(weight, weight_scale, weight_zero_point, obj.num_bits, obj.group_size)
    return F.linear(x, dense.to(x.dtype), None if bias is None else bias.to(x.dtype))


# --- cases -----------------------------------------------------------------------------------


def _case_name(p: Mapping[str, Any]) -> str:
    parts = [f"tokens={p['tokens']}", f"k={p['k']}", f"n={p['n']}"]
    for key in ("act_quant", "bits", "group"):
        if key in p:
            parts.append(f"{key}={p[key]}")
    if "block" in p:
        parts.append("block={}x{}".format(*p["block"]))
    if p.get("asymmetric"):
        parts.append("asymmetric")
    if p["bias"]:
        parts.append("bias")
    if not p["contiguous"]:
        parts.append("strided")
    return ",".join(parts)


_RULES = axis("act_quant", tuple(rule.value for rule in ActQuant))
_BIAS = axis("bias", (False, True))


def _activations(p: Mapping[str, Any], dtype: torch.dtype, device: torch.device, g: Any) -> Any:
    """Normal rows scaled by 1/2, 1, 2 in turn (each token its own scale); with 7 or more
    tokens, row 0 all zeros (a zero scale)."""
    x = random_tensor((p["tokens"], p["k"]), dtype, device, g, contiguous=p["contiguous"])
    x *= (2.0 ** (torch.arange(p["tokens"]) % 3 - 1)).to(device, dtype).unsqueeze(-1)
    if p["tokens"] >= 7:
        x[0] = 0
    return x


def _bias(p: Mapping[str, Any], dtype: torch.dtype, device: torch.device, g: Any) -> Any:
    return random_tensor((p["n"],), dtype, device, g) * 0.1 if p["bias"] else None


def _channel_scale(n: int, per_unit: float, device: torch.device, g: Any) -> torch.Tensor:
    """Positive per-channel scales around ``per_unit`` (the weights then have unit rows)."""
    return ((torch.rand(n, generator=g) + 0.5) * per_unit).to(device)


_INT8_SHAPES = ({"k": 64, "n": 48}, {"k": 256, "n": 96})


def _make_int8_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, g: torch.Generator
) -> OpInputs:
    p = case.params
    weight = torch.randint(-127, 128, (p["n"], p["k"]), generator=g, dtype=torch.int8)
    scale = _channel_scale(p["n"], 1.7 / (127 * p["k"] ** 0.5), device, g)
    x = _activations(p, dtype, device, g)
    return OpInputs(
        obj=layer(act_quant=p["act_quant"]),
        args=(x, weight.to(device), scale, _bias(p, dtype, device, g)),
        preserved=("x", "weight", "weight_scale", "bias"),
    )


_LINEAR_AXES = (axis("tokens", TOKEN_COUNTS), _RULES, _BIAS)
W8A8_INT8_LINEAR = OpContract(
    name="w8a8_int8_linear",
    sglang_layer="LinearBase (W8A8 int8: compressed-tensors, w8a8_int8)",
    summary="int8 weights per channel x int8 activations per token, exact int32 GEMM",
    signature=inspect.signature(_w8a8_int8_signature),
    details=inspect.getdoc(_w8a8_int8_signature) or "",
    reference=w8a8_int8_linear_reference,
    dtypes=QUANTIZED_DTYPES,
    tolerances=QUANTIZED_LINEAR_TOLERANCES,
    cases=(
        *case_grid(_case_name, *_LINEAR_AXES, _INT8_SHAPES, axis("contiguous", (True,))),
        *case_grid(
            _case_name,
            axis("tokens", (33,)),
            _RULES,
            _BIAS,
            _INT8_SHAPES[:1],
            axis("contiguous", (False,)),
        ),
    ),
    make_inputs=_make_int8_inputs,
    weights=("weight", "weight_scale"),
)


def _fp8_weight(n: int, k: int, device: torch.device, g: torch.Generator) -> torch.Tensor:
    return torch.randn(n, k, generator=g).mul(64).clamp(-448, 448).to(FP8_DTYPE).to(device)


def _make_fp8_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, g: torch.Generator
) -> OpInputs:
    p = case.params
    weight = _fp8_weight(p["n"], p["k"], device, g)
    scale = _channel_scale(p["n"], 1 / (64 * p["k"] ** 0.5), device, g)
    x = _activations(p, dtype, device, g)
    return OpInputs(
        obj=layer(act_quant=p["act_quant"]),
        args=(x, weight, scale, _bias(p, dtype, device, g)),
        preserved=("x", "weight", "weight_scale", "bias"),
    )


W8A8_FP8_LINEAR = OpContract(
    name="w8a8_fp8_linear",
    sglang_layer="LinearBase (FP8 per channel/tensor: compressed-tensors FP8_DYNAMIC)",
    summary="fp8 weights per channel x fp8 activations per token",
    signature=inspect.signature(_w8a8_fp8_signature),
    details=inspect.getdoc(_w8a8_fp8_signature) or "",
    reference=w8a8_fp8_linear_reference,
    dtypes=QUANTIZED_DTYPES,
    tolerances=QUANTIZED_LINEAR_TOLERANCES,
    cases=W8A8_INT8_LINEAR.cases,
    make_inputs=_make_fp8_inputs,
    weights=("weight", "weight_scale"),
)

# (block, K, N): DeepSeek's 128x128 in whole blocks and with a partial last block row, and a
# small block.
_BLOCK_SHAPES = (
    {"block": (128, 128), "k": 256, "n": 384},
    {"block": (128, 128), "k": 256, "n": 320},
    {"block": (32, 64), "k": 128, "n": 96},
)


def _make_block_fp8_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, g: torch.Generator
) -> OpInputs:
    p = case.params
    rows, cols = p["block"]
    weight = _fp8_weight(p["n"], p["k"], device, g)
    blocks = (-(-p["n"] // rows), p["k"] // cols)
    scale = ((torch.rand(blocks, generator=g) + 0.5) / (64 * p["k"] ** 0.5)).to(device)
    x = _activations(p, dtype, device, g)
    return OpInputs(
        obj=layer(act_quant=p["act_quant"], weight_block_size=(rows, cols)),
        args=(x, weight, scale, _bias(p, dtype, device, g)),
        preserved=("x", "weight", "weight_scale", "bias"),
    )


W8A8_BLOCK_FP8_LINEAR = OpContract(
    name="w8a8_block_fp8_linear",
    sglang_layer="LinearBase (FP8 block: compressed-tensors FP8_BLOCK, fp8 weight_block_size)",
    summary="fp8 weights per block x fp8 activations per token group",
    signature=inspect.signature(_w8a8_block_fp8_signature),
    details=inspect.getdoc(_w8a8_block_fp8_signature) or "",
    reference=w8a8_block_fp8_linear_reference,
    dtypes=QUANTIZED_DTYPES,
    tolerances=QUANTIZED_LINEAR_TOLERANCES,
    cases=(
        *case_grid(_case_name, *_LINEAR_AXES, _BLOCK_SHAPES, axis("contiguous", (True,))),
        *case_grid(
            _case_name,
            axis("tokens", (33,)),
            _RULES,
            _BIAS,
            _BLOCK_SHAPES[:1],
            axis("contiguous", (False,)),
        ),
    ),
    make_inputs=_make_block_fp8_inputs,
    weights=("weight", "weight_scale"),
)

# (bits, group, asymmetric): W4A16 (group 128, the preset), AWQ-like asymmetric group 32,
# W8A16 per channel (group = K).
_WNA16_FORMATS = (
    {"bits": 4, "group": 128, "asymmetric": False},
    {"bits": 4, "group": 32, "asymmetric": True},
    {"bits": 8, "group": 256, "asymmetric": False},
)


def _make_wna16_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, g: torch.Generator
) -> OpInputs:
    p = case.params
    bits, group, n, k = p["bits"], p["group"], p["n"], p["k"]
    half = 1 << (bits - 1)
    q = torch.randint(-half, half, (n, k), generator=g, dtype=torch.int8)
    zero_point = None
    if p["asymmetric"]:
        zero_point = torch.randint(-half, half, (n, k // group), generator=g).to(torch.int8)
        zero_point = zero_point.to(device)
    scale = ((torch.rand(n, k // group, generator=g) + 0.5) * 1.7 / (half * k**0.5)).to(device)
    x = _activations(p, dtype, device, g)
    return OpInputs(
        obj=layer(num_bits=bits, group_size=group),
        args=(
            x,
            pack_int32(q, bits).to(device),
            scale.to(dtype),
            zero_point,
            _bias(p, dtype, device, g),
        ),
        preserved=("x", "weight", "weight_scale", "weight_zero_point", "bias"),
    )


# The weight is dequantized in the scale's dtype, as compressed-tensors does; what remains is
# an ordinary linear layer's rounding: the standard tolerances of a two-operand product.
WNA16_TOLERANCES: Mapping[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(atol=1e-4, rtol=1e-4),
    torch.float16: Tolerance(atol=5e-3, rtol=5e-3),
    torch.bfloat16: Tolerance(atol=3e-2, rtol=3e-2),
}

WNA16_LINEAR = OpContract(
    name="wna16_linear",
    sglang_layer="LinearBase (W4A16/W8A16: compressed-tensors pack-quantized, AWQ, GPTQ)",
    summary="4/8-bit integer weights per group x unquantized activations",
    signature=inspect.signature(_wna16_signature),
    details=inspect.getdoc(_wna16_signature) or "",
    reference=wna16_linear_reference,
    dtypes=QUANTIZED_DTYPES,
    tolerances=WNA16_TOLERANCES,
    cases=(
        *case_grid(
            _case_name,
            axis("tokens", TOKEN_COUNTS),
            _WNA16_FORMATS,
            _BIAS,
            ({"k": 256, "n": 128},),
            axis("contiguous", (True,)),
        ),
        *case_grid(
            _case_name,
            axis("tokens", (33,)),
            _WNA16_FORMATS[:1],
            _BIAS,
            ({"k": 256, "n": 128},),
            axis("contiguous", (False,)),
        ),
    ),
    make_inputs=_make_wna16_inputs,
    weights=("weight", "weight_scale", "weight_zero_point"),
)
