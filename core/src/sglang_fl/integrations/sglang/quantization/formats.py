"""What SGLang's quantized layers hold, read as the quantized ops' arguments.

SGLang's quantization methods create a layer's parameters in the checkpoint's layout and load
them (``create_weights`` and the weight loaders stay SGLang's). For each method sglang-fl serves,
a :class:`Served` says which op computes the layer, what its stand-in ``obj`` carries (the
format's activation rule, block or group sizes) and how the loaded parameters become the op's
weights in the contract's (checkpoint) layout, once they are final. A method or scheme outside
the ops is a refusal: a sentence saying what it is and why it is not served.

Sources (SGLang 0.5.23, ``srt/layers/quantization``): ``compressed_tensors/schemes``
(``CompressedTensorsW8A8Int8``, ``CompressedTensorsW8A8Fp8``, ``CompressedTensorsWNA16``, the
FP8 and W8A8 int8 MoE schemes), ``fp8.py`` (``Fp8LinearMethod``, ``Fp8MoEMethod``),
``w8a8_int8.py``, ``awq/schemes/awq_linear.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from ....ops.quantization.numerics import ActQuant, pack_int32

__all__ = ["Served", "awq_to_standard", "int8_experts", "linear_format", "moe_format"]

# The layer's weights in the op's contract order, read from its loaded parameters.
Weights = Callable[[Any], tuple[Any, ...]]


@dataclass(frozen=True)
class Served:
    """How one SGLang quantized layer runs on a standard op.

    ``obj`` holds the stand-in's attributes; ``layer_obj`` computes those that depend on the
    layer (a channel-wise group is the layer's input width). ``replaces`` names the loaded
    parameters whose values ``weights`` re-lays out into new tensors (AWQ's): their storage
    is released once the op's weights are made, and re-created before SGLang loads again.
    """

    op: str
    scheme: str  # for the report: the format and scheme, in words
    obj: dict[str, Any]
    weights: Weights
    layer_obj: Callable[[Any], dict[str, Any]] | None = None
    replaces: tuple[str, ...] = ()

    def stand_in(self, layer: Any) -> SimpleNamespace:
        extra = self.layer_obj(layer) if self.layer_obj is not None else {}
        return SimpleNamespace(**{**self.obj, **extra})


def _per_channel(scale: torch.Tensor, widths: list[int] | None, rows: int) -> torch.Tensor:
    """A float32 ``[rows]`` scale: per-channel as is, per-tensor (one per fused part, ``widths``
    rows each) repeated over its part's rows, exactly (no requantization)."""
    flat = scale.detach().reshape(-1).to(torch.float32)
    if flat.numel() == rows:
        return flat
    sizes = widths if widths is not None and len(widths) == flat.numel() else None
    if sizes is None and flat.numel() == 1:
        sizes = [rows]
    if sizes is None or sum(sizes) != rows:
        raise ValueError(f"cannot spread {flat.numel()} weight scales over {rows} rows")
    return torch.repeat_interleave(flat, torch.tensor(sizes, device=flat.device))


def _type_name(obj: object) -> str:
    return type(obj).__name__


# --- linear layers -----------------------------------------------------------------------------


def linear_format(method: Any, layer: Any) -> Served | str:
    """How sglang-fl serves ``layer`` whose SGLang method is ``method``, or why it does not."""
    name = _type_name(method)
    if name == "CompressedTensorsLinearMethod":
        return _compressed_tensors_linear(layer.scheme)
    if name == "Fp8LinearMethod":
        return _fp8_linear(method)
    if name == "W8A8Int8LinearMethod":
        return Served(
            "w8a8_int8_linear",
            "w8a8_int8: int8 per channel, int8 activations per token",
            {"act_quant": ActQuant.ABSMAX},
            lambda layer: (layer.weight, layer.weight_scale.reshape(-1).to(torch.float32)),
        )
    if (
        name == "AWQLinearMethod"
        and _type_name(getattr(layer, "scheme", None)) == "AWQLinearScheme"
    ):
        config = method.quant_config
        if not config.zero_point:
            return "AWQ without zero points (zero_point=false) is not a format sglang-fl reads"
        return Served(
            "wna16_linear",
            f"awq: {config.weight_bits}-bit, group {config.group_size}, zero points",
            {"num_bits": config.weight_bits, "group_size": config.group_size},
            lambda layer: awq_to_standard(
                layer.qweight, layer.qzeros, layer.scales, config.weight_bits
            ),
            replaces=("qweight", "qzeros", "scales"),
        )
    return f"{name} is not a quantized linear method sglang-fl serves"


def _compressed_tensors_linear(scheme: Any) -> Served | str:
    name = _type_name(scheme)
    if name == "CompressedTensorsW8A8Int8":
        if scheme.is_static_input_scheme or not scheme.input_symmetric:
            return (
                "compressed-tensors W8A8 int8 with static or asymmetric activation scales: "
                "the int8 op quantizes activations dynamically and symmetrically per token"
            )
        return Served(
            "w8a8_int8_linear",
            f"compressed-tensors W8A8 int8: {scheme.strategy} weights, tokens dynamic",
            {"act_quant": ActQuant.COMPRESSED_TENSORS},
            lambda layer: (
                layer.weight,
                _per_channel(layer.weight_scale, layer.logical_widths, layer.weight.shape[0]),
            ),
        )
    if name == "CompressedTensorsW8A8Fp8":
        if scheme.is_static_input_scheme:
            return (
                "compressed-tensors FP8 with static activation scales: the FP8 ops quantize "
                "activations dynamically (per token or token group)"
            )
        if scheme.weight_block_size is not None:
            block = tuple(scheme.weight_block_size)
            return Served(
                "w8a8_block_fp8_linear",
                f"compressed-tensors FP8 block {list(block)}, token groups dynamic",
                {"act_quant": ActQuant.COMPRESSED_TENSORS, "weight_block_size": block},
                lambda layer: (layer.weight, layer.weight_scale),
            )
        return Served(
            "w8a8_fp8_linear",
            f"compressed-tensors FP8: {scheme.strategy} weights, tokens dynamic",
            {"act_quant": ActQuant.COMPRESSED_TENSORS},
            lambda layer: (
                layer.weight,
                _per_channel(layer.weight_scale, layer.logical_widths, layer.weight.shape[0]),
            ),
        )
    if name == "CompressedTensorsWNA16":
        if scheme.has_g_idx:
            return "compressed-tensors WNA16 with activation ordering (g_idx) is not served"
        bits = 32 // scheme.pack_factor
        symmetric = scheme.symmetric

        def weights(layer: Any) -> tuple[Any, ...]:
            zero_point = None
            if not symmetric:
                rows = layer.weight_packed.shape[0]
                zero_point = _unpack_rows(layer.weight_zero_point, bits, rows)
            return layer.weight_packed, layer.weight_scale, zero_point

        group = scheme.group_size
        return Served(
            "wna16_linear",
            f"compressed-tensors W{bits}A16: group {group if group != -1 else 'channel'}, "
            + ("symmetric" if symmetric else "zero points"),
            {"num_bits": bits, "group_size": group},
            weights,
            # one group per row: as wide as the layer's input
            layer_obj=(lambda layer: {"group_size": layer.input_size_per_partition})
            if group == -1
            else None,
        )
    return f"the compressed-tensors scheme {name} is not one sglang-fl serves"


def _fp8_linear(method: Any) -> Served | str:
    config = method.quant_config
    if getattr(method, "use_mxfp8", False):
        return "fp8 with MXFP8 (UE8M0) scales is not served"
    if not config.is_checkpoint_fp8_serialized:
        return "fp8 online quantization (a float checkpoint quantized at load) is not served"
    if not method.block_quant:
        return (
            "fp8 per-tensor checkpoints quantize activations per tensor; sglang-fl's FP8 ops "
            "quantize per token (group)"
        )
    if config.activation_scheme != "dynamic":
        return "fp8 with static activation scales is not served"
    block = tuple(method.weight_block_size)
    return Served(
        "w8a8_block_fp8_linear",
        f"fp8 block {list(block)}, token groups dynamic",
        {"act_quant": ActQuant.ABSMAX, "weight_block_size": block},
        lambda layer: (layer.weight, layer.weight_scale_inv),
    )


def _unpack_rows(packed: torch.Tensor, bits: int, rows: int) -> torch.Tensor:
    """compressed-tensors' zero points packed along the rows (``[rows * bits / 32, groups]``)
    -> int8 ``[rows, groups]`` in the signed range."""
    from ....ops.quantization.numerics import unpack_int32

    return unpack_int32(packed.t().contiguous(), bits, rows).t().contiguous()


# AutoAWQ's packing order: nibble i of an int32 holds column _AWQ_ORDER[i] of 8 (AutoAWQ's
# ``pack``; SGLang unpacks with the inverse, [0, 4, 1, 5, 2, 6, 3, 7], awq_triton.py).
_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _awq_unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """AWQ's ``[rows, cols / 8]`` int32 -> ``[rows, cols]`` unsigned values."""
    per_word = 32 // bits
    mask = (1 << bits) - 1
    rows, words = packed.shape
    out = torch.empty(rows, words, per_word, dtype=torch.int32, device=packed.device)
    for nibble, column in enumerate(_AWQ_ORDER[:per_word]):
        out[..., column] = (packed >> (bits * nibble)) & mask
    return out.reshape(rows, words * per_word)


def awq_to_standard(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, bits: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AutoAWQ's GEMM layout (``qweight`` ``[K, N/8]``, ``qzeros`` ``[K/g, N/8]``, ``scales``
    ``[K/g, N]``, unsigned values) -> the ``wna16_linear`` contract's (weight packed along
    ``K``, signed; zero points signed ``[N, K/g]``; scales ``[N, K/g]``)."""
    offset = 1 << (bits - 1)
    values = (_awq_unpack(qweight, bits) - offset).to(torch.int8).t()  # [N, K]
    zeros = (_awq_unpack(qzeros, bits) - offset).to(torch.int8).t().contiguous()
    return pack_int32(values, bits), scales.t().contiguous(), zeros


# --- MoE layers --------------------------------------------------------------------------------


def _expert_scale(scale: torch.Tensor, rows: int, parts: int) -> torch.Tensor:
    """float32 ``[experts, rows]`` from per-channel ``[E, rows, 1]`` or per-tensor ``[E, parts]``
    (``parts`` equal fused parts: gate and up for w13)."""
    experts = scale.shape[0]
    flat = scale.detach().reshape(experts, -1).to(torch.float32)
    if flat.shape[1] == rows:
        return flat
    if flat.shape[1] == parts and rows % parts == 0:
        return flat.repeat_interleave(rows // parts, dim=1)
    raise ValueError(f"cannot spread expert weight scales {tuple(scale.shape)} over {rows} rows")


def _moe_channel_weights(scale_names: tuple[str, str]) -> Weights:
    w13_name, w2_name = scale_names

    def weights(layer: Any) -> tuple[Any, ...]:
        w13, w2 = layer.w13_weight, layer.w2_weight
        return (
            w13,
            w2,
            _expert_scale(getattr(layer, w13_name), w13.shape[1], 2),
            _expert_scale(getattr(layer, w2_name), w2.shape[1], 1),
        )

    return weights


def _moe_block_weights(scale_names: tuple[str, str]) -> Weights:
    w13_name, w2_name = scale_names
    return lambda layer: (
        layer.w13_weight,
        layer.w2_weight,
        getattr(layer, w13_name),
        getattr(layer, w2_name),
    )


def moe_format(method: Any, layer: Any) -> Served | str:
    """How sglang-fl serves the ``FusedMoE`` ``layer`` whose SGLang method is ``method``."""
    name = _type_name(method)
    scheme: Any = getattr(layer, "scheme", None)
    if name == "CompressedTensorsFusedMoEMethod":
        scheme_name = _type_name(scheme)
        if scheme_name == "CompressedTensorsW8A8Fp8MoE":
            if scheme.static_input_scales:
                return "compressed-tensors FP8 experts with static activation scales"
            rule = ActQuant.COMPRESSED_TENSORS
            if scheme.block_quant:
                block = tuple(scheme.weight_block_size)
                return Served(
                    "fused_moe_w8a8_fp8",
                    f"compressed-tensors FP8 block {list(block)} experts",
                    {"act_quant": rule, "weight_block_size": block},
                    _moe_block_weights(("w13_weight_scale", "w2_weight_scale")),
                )
            return Served(
                "fused_moe_w8a8_fp8",
                f"compressed-tensors FP8 experts: {scheme.weight_quant.strategy} weights",
                {"act_quant": rule, "weight_block_size": None},
                _moe_channel_weights(("w13_weight_scale", "w2_weight_scale")),
            )
        return f"the compressed-tensors MoE scheme {scheme_name} is not one sglang-fl serves"
    if name == "Fp8MoEMethod":
        config = method.quant_config
        if (
            not method.block_quant
            or getattr(method, "use_mxfp8", False)
            or not config.is_checkpoint_fp8_serialized
            or config.activation_scheme != "dynamic"
        ):
            return "fp8 experts are served with 2-D weight blocks and dynamic activations only"
        block = tuple(method.weight_block_size)
        return Served(
            "fused_moe_w8a8_fp8",
            f"fp8 block {list(block)} experts",
            {"act_quant": ActQuant.ABSMAX, "weight_block_size": block},
            _moe_block_weights(("w13_weight_scale_inv", "w2_weight_scale_inv")),
        )
    if name == "W8A8Int8MoEMethod":
        return int8_experts(ActQuant.ABSMAX, "w8a8_int8")
    return f"{name} is not a quantized MoE method sglang-fl serves"


def int8_experts(rule: ActQuant, checkpoint: str) -> Served:
    """W8A8 int8 experts (int8 per channel, ``w13_weight_scale`` ``[E, N, 1]``: the layout of
    SGLang's ``W8A8Int8MoEMethod``, which compressed-tensors' dynamic int8 experts share)."""
    return Served(
        "fused_moe_w8a8_int8",
        f"{checkpoint} W8A8 int8 experts: channel weights, tokens dynamic",
        {"act_quant": rule},
        _moe_channel_weights(("w13_weight_scale", "w2_weight_scale")),
    )
