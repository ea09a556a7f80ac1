"""The quantization arithmetic the quantized ops' references share, each rule from its source.

- Activations are quantized on the fly, per token (or per group of ``group_size`` input
  channels of a token) by the checkpoint format's rule (:class:`ActQuant`).
- Weights arrive in the checkpoint's own numbers: int8 or float8_e4m3fn values with float32
  scales per output channel or per block, or packed 4/8-bit integers with group scales.
"""

from __future__ import annotations

import math

import torch

from ..._strenum import StrEnum

__all__ = [
    "FP8_DTYPE",
    "FP8_MAX",
    "INT8_MAX",
    "ActQuant",
    "QuantType",
    "check_act_quant",
    "dequantize_block",
    "dequantize_rows",
    "int8_matmul",
    "pack_int32",
    "quantize_rows",
    "unpack_int32",
]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
INT8_MAX = 127
# SGLang's activation-quantization kernels clamp a row's amax here before dividing
# (kernels/ops/quantization/int8_kernel.py and fp8_kernel.py, ``eps=1e-10``).
ABSMAX_EPS = 1e-10


class QuantType(StrEnum):
    """The number type of quantized activations."""

    INT8 = "int8"
    FP8 = "fp8"  # float8_e4m3fn


class ActQuant(StrEnum):
    """How a checkpoint format quantizes activations on the fly (the layer's ``act_quant``).

    ``COMPRESSED_TENSORS``: compressed-tensors' dynamic quantize-dequantize
    (``quantization/utils/helpers.py`` ``calculate_qparams``, ``lifecycle/forward.py``): the
    scale is ``max(|min(x, 0)|, max(x, 0)) / ((qmax - qmin) / 2)`` (int8: ``/ 127.5``, fp8:
    ``/ 448``) in the activation's dtype, a zero scale becomes that dtype's ``eps``, and
    ``q = round(clamp(x / scale, qmin, qmax))`` (int8: round half to even, range -128..127;
    fp8: the cast) is computed in the activation's dtype too.

    ``ABSMAX``: the rule of the kernels SGLang, vLLM and torch_npu ship (SGLang's
    ``per_token_quant_int8``, ``per_token_group_quant_fp8``; ``npu_dynamic_quant``), used by
    checkpoints that are served by them (``w8a8_int8``, DeepSeek's ``fp8``): in float32,
    ``scale = max(amax, 1e-10) / qmax`` (int8: 127, fp8: 448) and
    ``q = clamp(round(x / scale), -qmax, qmax)``.
    """

    COMPRESSED_TENSORS = "compressed-tensors"
    ABSMAX = "absmax"


def check_act_quant(value: object, op_name: str) -> ActQuant:
    """``value`` as an :class:`ActQuant`; a ``ValueError`` naming the op and the allowed."""
    try:
        return ActQuant(value)
    except ValueError:
        allowed = ", ".join(repr(rule.value) for rule in ActQuant)
        raise ValueError(f"{op_name}: act_quant {value!r} is not one of {allowed}") from None


def _grouped(x: torch.Tensor, group_size: int | None) -> torch.Tensor:
    """``[tokens, K]`` as ``[tokens, groups, group_size]`` (one group per token if ``None``)."""
    width = x.shape[-1] if group_size is None else group_size
    if x.shape[-1] % width:
        raise ValueError(f"{x.shape[-1]} input channels are not a multiple of group {width}")
    return x.reshape(x.shape[0], x.shape[-1] // width, width)


def quantize_rows(
    x: torch.Tensor, qtype: QuantType, rule: ActQuant, group_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``[tokens, K]`` -> ``(q, scale)``: ``q`` int8 or float8_e4m3fn ``[tokens, K]``,
    ``scale`` float32 ``[tokens, groups]`` (groups = 1 per token without ``group_size``), so
    that ``q * scale`` (each group's scale) approximates ``x`` by ``rule``."""
    groups = _grouped(x, group_size)
    if rule is ActQuant.COMPRESSED_TENSORS:
        q, scale = _compressed_tensors(groups, qtype)
    else:
        q, scale = _absmax(groups, qtype)
    return q.reshape(x.shape), scale.reshape(groups.shape[:2])


def _compressed_tensors(
    groups: torch.Tensor, qtype: QuantType
) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = groups.dtype
    if qtype is QuantType.INT8:
        qmin, qmax, half_range = -128.0, 127.0, 255.0 / 2
    else:
        qmin, qmax, half_range = -FP8_MAX, FP8_MAX, FP8_MAX
    low = torch.clamp(groups.amin(dim=-1, keepdim=True), max=0)
    high = torch.clamp(groups.amax(dim=-1, keepdim=True), min=0)
    scale = torch.maximum(low.abs(), high) / half_range
    scale = torch.where(scale == 0, torch.tensor(torch.finfo(dtype).eps, dtype=dtype), scale)
    scaled = torch.clamp(groups / scale, qmin, qmax)
    q = torch.round(scaled).to(torch.int8) if qtype is QuantType.INT8 else scaled.to(FP8_DTYPE)
    return q, scale.to(torch.float32)


def _absmax(groups: torch.Tensor, qtype: QuantType) -> tuple[torch.Tensor, torch.Tensor]:
    values = groups.to(torch.float32)
    qmax = float(INT8_MAX) if qtype is QuantType.INT8 else FP8_MAX
    amax = values.abs().amax(dim=-1, keepdim=True).clamp(min=ABSMAX_EPS)
    scale = amax / qmax
    scaled = values / scale
    if qtype is QuantType.INT8:
        q = torch.round(scaled).clamp(-qmax, qmax).to(torch.int8)
    else:
        q = scaled.clamp(-qmax, qmax).to(FP8_DTYPE)
    return q, scale


def dequantize_rows(
    q: torch.Tensor, scale: torch.Tensor, group_size: int | None = None
) -> torch.Tensor:
    """``q * scale`` in float32: ``scale`` ``[tokens, groups]`` over groups of ``group_size``."""
    groups = _grouped(q.to(torch.float32), group_size)
    return (groups * scale.unsqueeze(-1)).reshape(q.shape)


def dequantize_block(
    weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]
) -> torch.Tensor:
    """A block-scaled ``[..., N, K]`` weight in float32: each ``block`` of it times its scale
    (``scale`` ``[..., ceil(N / rows), ceil(K / cols)]``; edge blocks may be partial)."""
    rows, cols = block
    n, k = weight.shape[-2:]
    expanded = scale.repeat_interleave(rows, dim=-2)[..., :n, :]
    expanded = expanded.repeat_interleave(cols, dim=-1)[..., :k]
    return weight.to(torch.float32) * expanded


def int8_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b.T`` of int8 ``[M, K]`` and ``[N, K]``: exact int32 (``torch._int_mm``) where the
    device has an int8 GEMM, else float32 (exact while a sum stays below 2**24)."""
    if a.device.type in ("cpu", "cuda"):
        return torch._int_mm(a, b.t())
    return (a.to(torch.float32) @ b.to(torch.float32).t()).round().to(torch.int32)


def _per_word(bits: int) -> int:
    if bits not in (4, 8):
        raise ValueError(f"packed weights hold 4 or 8 bits per value, not {bits}")
    return 32 // bits


def unpack_int32(packed: torch.Tensor, bits: int, columns: int) -> torch.Tensor:
    """compressed-tensors' ``pack_quantized`` layout back to signed values: ``[rows, words]``
    int32, value ``i`` of a word in bits ``bits*i ..`` (lowest first), each stored plus
    ``2**(bits-1)`` -> int8 ``[rows, columns]`` in ``[-2**(bits-1), 2**(bits-1))``."""
    per_word = _per_word(bits)
    shifts = torch.arange(0, 32, bits, device=packed.device, dtype=torch.int32)
    values = (packed.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    values = values.reshape(packed.shape[0], packed.shape[1] * per_word)[:, :columns]
    return (values - (1 << (bits - 1))).to(torch.int8)


def pack_int32(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Signed ``[rows, columns]`` values -> compressed-tensors' ``pack_quantized`` int32 layout
    (the inverse of :func:`unpack_int32`; a partial last word is zero-filled)."""
    per_word = _per_word(bits)
    rows, columns = values.shape
    words = math.ceil(columns / per_word)
    unsigned = values.to(torch.int64) + (1 << (bits - 1))
    padded = torch.zeros(rows, words * per_word, dtype=torch.int64, device=values.device)
    padded[:, :columns] = unsigned
    shifts = torch.arange(0, 32, bits, device=values.device, dtype=torch.int64)
    packed = (padded.reshape(rows, words, per_word) << shifts).sum(dim=-1)
    return torch.where(packed >= 1 << 31, packed - (1 << 32), packed).to(torch.int32)
