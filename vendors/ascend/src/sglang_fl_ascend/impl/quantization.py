"""Quantized linear adapters on ``torch_npu``: ``npu_dynamic_quant`` + ``npu_quant_matmul`` (W8A8
int8) and ``npu_weight_quant_batchmatmul`` (W4A16/W8A16), the operators SGLang's NPU quantization
methods call (``hardware_backend/npu/quantization/linear_method_npu.py``).

Sources: the torch_npu API reference pages in the op-plugin repository
(``docs/context/torch_npu-npu_quant_matmul.md``, ``-npu_dynamic_quant.md``,
``-npu_weight_quant_batchmatmul.md``, ``-npu_convert_weight_to_int4pack.md``).

- ``w8a8_int8_linear``: the weight is prepared as ``[K, N]`` (the transpose view of the
  checkpoint's ``[N, K]``: "x2 ... (k, n)", a transposed input is taken) with a float32 scale
  ``[N]``. Activations of the ``absmax`` rule are quantized by ``npu_dynamic_quant`` (per-token
  symmetric, ``scale = rowMax(|x|) / 127``); those of the compressed-tensors rule (int8 divided by
  127.5, a scale in the activation's dtype) by core's ``quantize_rows`` on the device. Then
  ``npu_quant_matmul(x1, x2, scale, pertoken_scale=..., output_dtype=...)``: float16/bfloat16
  output only ("output_dtype ... int8, float16, bfloat16, int32"), a bias of float32 (the
  float16-output row of the dtype table lists int32/bfloat16/float32 biases).
- ``wna16_linear``: 8-bit weights as int8 ``[K, N]`` (transpose view), 4-bit ones packed once by
  ``npu_convert_weight_to_int4pack`` into int32 ``[K, N/8]``; scales ``[K/g, N]`` and offsets
  ``-zero_point`` (``ANTIQUANT(weight) = (weight + antiquant_offset) * antiquant_scale``).
  Group sizes must be multiples of 32 in ``[32, K - 1]`` ("antiquant_group_size ... [32, K-1]
  且必须是32的倍数"); a whole-row group is the per-channel mode. Scales in the activations'
  dtype (float16/bfloat16), a float32 bias for bfloat16 and float16 for float16.
- The FP8 ops and the quantized experts are declared without a kernel (``NO_KERNEL``).

No operator takes an empty tensor ("不支持空Tensor输入", "传入的x1、x2、scale不能是空"): an empty
batch returns an empty result without a call.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.ops.quantization.numerics import (
    ActQuant,
    QuantType,
    check_act_quant,
    quantize_rows,
    unpack_int32,
)
from sglang_fl.types import PreparedKernel, Unsupported

from ..backend import TORCH_NPU

__all__ = ["ADAPTERS", "NO_KERNEL"]

HALF = (torch.float16, torch.bfloat16)
MAX_K_N = 65535  # "x1与x2最后一维的shape大小不能超过65535"; weight quant: "K、N的范围为[1, 65535]"
_DOCS = "op-plugin docs/context/torch_npu-{}.md"

NO_KERNEL = {
    "w8a8_fp8_linear": "torch_npu's quantized matmuls take int8/int4 operands on Atlas A2/A3 "
    f"and inference cards, no float8 ({_DOCS.format('npu_quant_matmul')}: x1/x2 int8, int32)",
    "w8a8_block_fp8_linear": "torch_npu has no float8 block-scaled matmul on Atlas A2/A3 "
    f"({_DOCS.format('npu_quant_matmul')}: x1/x2 int8 or int32-packed int4)",
    "fused_moe_w8a8_fp8": "torch_npu's grouped matmul takes no float8 experts on Atlas A2/A3",
    "fused_moe_w8a8_int8": "not wired yet: SGLang's NPU W8A8 MoE method "
    "(hardware_backend/npu/quantization/moe_methods.py) runs npu_dynamic_quant and "
    "npu_grouped_matmul per expert group; sglang-fl's reference serves these experts here",
}


def _half_output(x: torch.Tensor, operator: str) -> None:
    if x.dtype not in HALF:
        raise Unsupported(f"{operator} outputs float16 or bfloat16, not {x.dtype}")


# --- w8a8_int8_linear ---------------------------------------------------------------------------


def prepare_int8(obj: Any, weight: torch.Tensor, weight_scale: torch.Tensor) -> tuple[Any, ...]:
    """``weight.t()`` (``x2`` ``[K, N]``, a transposed input) and a float32 scale ``[N]``."""
    n, k = weight.shape
    if k > MAX_K_N or n > MAX_K_N:
        raise Unsupported(f"npu_quant_matmul's last dims are at most {MAX_K_N} (K={k}, N={n})")
    return weight.t(), weight_scale.to(torch.float32).reshape(-1).contiguous()


def w8a8_int8_linear(
    obj: Any,
    x: torch.Tensor,
    weight_t: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    _half_output(x, "npu_quant_matmul")
    rule = check_act_quant(obj.act_quant, "w8a8_int8_linear")
    if x.shape[0] == 0:
        return x.new_empty((0, weight_t.shape[1]))
    torch_npu = TORCH_NPU.require()
    if rule is ActQuant.ABSMAX:
        q, pertoken = torch_npu.npu_dynamic_quant(x)
    else:
        q, scale = quantize_rows(x, QuantType.INT8, rule)
        pertoken = scale.reshape(-1)
    out: torch.Tensor = torch_npu.npu_quant_matmul(
        q, weight_t, weight_scale, pertoken_scale=pertoken,
        bias=None if bias is None else bias.to(torch.float32), output_dtype=x.dtype,
    )  # fmt: skip
    return out


# --- wna16_linear -------------------------------------------------------------------------------


def prepare_wna16(
    obj: Any,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_zero_point: torch.Tensor | None,
) -> tuple[Any, ...]:
    """``weight`` as ``npu_weight_quant_batchmatmul`` takes it (int8 ``[K, N]``, or 4-bit packed
    by ``npu_convert_weight_to_int4pack``), scales ``[K/g, N]``, offsets ``-zero_point``."""
    n, groups = weight_scale.shape
    k = groups * obj.group_size
    if k > MAX_K_N or n > MAX_K_N:
        raise Unsupported(f"npu_weight_quant_batchmatmul takes K, N up to {MAX_K_N} (K={k}, N={n})")
    if weight_scale.dtype not in HALF:
        raise Unsupported(
            f"npu_weight_quant_batchmatmul's scales are float16/bfloat16, not {weight_scale.dtype}"
        )
    if groups > 1 and (obj.group_size % 32 or not 32 <= obj.group_size < k):
        raise Unsupported(
            "npu_weight_quant_batchmatmul groups of 32-multiples in [32, K-1], "
            f"not {obj.group_size}"
        )
    values = unpack_int32(weight, obj.num_bits, k)  # [N, K] signed
    if obj.num_bits == 4:
        packed = TORCH_NPU.require().npu_convert_weight_to_int4pack(
            values.to(torch.int32).t().contiguous()
        )
    else:
        packed = values.t()  # int8 [K, N], a transposed input
    offset = None
    if weight_zero_point is not None:
        offset = (-weight_zero_point.to(weight_scale.dtype)).t().contiguous()
    return packed, weight_scale.t().contiguous(), offset


def wna16_linear(
    obj: Any,
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_zero_point: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``weight``/``weight_scale``/``weight_zero_point``: what :func:`prepare_wna16` made (the
    packed weight, ``antiquant_scale``, ``antiquant_offset``)."""
    if x.dtype != weight_scale.dtype:
        raise Unsupported(
            f"npu_weight_quant_batchmatmul needs the scales in x's dtype ({weight_scale.dtype} "
            f"scales, {x.dtype} activations)"
        )
    n = weight_scale.shape[1]
    if x.shape[0] == 0:
        return x.new_empty((0, n))
    groups = weight_scale.shape[0]
    bias_dtype = torch.float32 if x.dtype == torch.bfloat16 else torch.float16
    out: torch.Tensor = TORCH_NPU.require().npu_weight_quant_batchmatmul(
        x, weight, weight_scale, weight_zero_point, None, None,
        None if bias is None else bias.to(bias_dtype).contiguous(),
        obj.group_size if groups > 1 else 0,
    )  # fmt: skip
    return out


ADAPTERS = {
    "w8a8_int8_linear": PreparedKernel(w8a8_int8_linear, prepare_int8),
    "wna16_linear": PreparedKernel(wna16_linear, prepare_wna16),
}
