"""The quantization configs sglang-fl's platform gives SGLang: SGLang's own, served by the ops.

SGLang asks an out-of-tree platform first (``layers/quantization/__init__.py``
``get_quantization_config``: ``current_platform.get_quantization_config(name)`` wins for a
known name). Each class here is SGLang's config for that name (parsing, ignore lists, scheme
selection, ``create_weights`` all SGLang's) with three changes: it accepts float32 activations,
it skips the CUDA capability query SGLang makes while choosing a compressed-tensors scheme, and
``get_quant_method`` wraps the method SGLang chose in sglang-fl's (:mod:`.methods`), which runs
the layer on the standard op its format maps to (:mod:`.formats`). A quantized layer no op
serves is a :class:`~.methods.QuantizationNotServed` error naming the layer and the reason,
at model construction: on this platform SGLang's own kernels (CUDA, Triton, AMX) cannot run.
"""

from __future__ import annotations

from typing import Any

import torch
from sglang.srt.layers.linear import LinearBase
from sglang.srt.layers.moe.fused_moe_triton import FusedMoE
from sglang.srt.layers.quantization.awq import AWQConfig
from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import (
    CompressedTensorsConfig,
)
from sglang.srt.layers.quantization.fp8 import Fp8Config
from sglang.srt.layers.quantization.unquant import (
    UnquantizedFusedMoEMethod,
    UnquantizedLinearMethod,
)
from sglang.srt.layers.quantization.w8a8_int8 import W8A8Int8Config, W8A8Int8MoEMethod
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead

from ....ops.quantization.numerics import ActQuant
from .formats import int8_experts, linear_format, moe_format
from .methods import QuantizationNotServed, SglangFlLinearMethod, SglangFlMoEMethod

__all__ = ["CONFIGS"]

# sglang-fl's references serve every float activation dtype.
ACT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def serve(method: Any, layer: Any, prefix: str) -> Any:
    """SGLang's ``method`` for ``layer``, wrapped in sglang-fl's (unquantized ones as they are)."""
    if method is None or isinstance(method, (UnquantizedLinearMethod, UnquantizedFusedMoEMethod)):
        return method
    if isinstance(layer, (LinearBase, ParallelLMHead)):
        served = linear_format(method, layer)
        wrapper: type = SglangFlLinearMethod
    elif isinstance(layer, FusedMoE):
        served = moe_format(method, layer)
        wrapper = SglangFlMoEMethod
    else:  # a KV-cache scale method (RadixAttention): it loads scales, it runs nothing
        return method
    if isinstance(served, str):
        raise QuantizationNotServed(
            f"{prefix}: {served}. sglang-fl serves compressed-tensors W8A8 int8, FP8 (channel, "
            "tensor, block) and W4A16/W8A16 (pack-quantized), fp8 with weight blocks, "
            "w8a8_int8 and AWQ (zero points); on its platform SGLang has no other kernel"
        )
    return wrapper(method, served)


class _ServedByOps:
    """Over an SGLang ``QuantizationConfig``: float32 activations, no capability floor, and
    each quantized layer's method wrapped by :func:`serve`."""

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return list(ACT_DTYPES)

    @classmethod
    def get_min_capability(cls) -> int:
        return 0

    def get_quant_method(self, layer: Any, prefix: str) -> Any:
        return serve(self._sglang_quant_method(layer, prefix), layer, prefix)

    def _sglang_quant_method(self, layer: Any, prefix: str) -> Any:
        return super().get_quant_method(layer, prefix)  # type: ignore[misc]


class SglangFlCompressedTensorsConfig(_ServedByOps, CompressedTensorsConfig):
    """compressed-tensors, its scheme choice without the CUDA capability query."""

    def _check_scheme_supported(self, min_capability: int, error: bool = True) -> bool:
        return True  # sglang-fl's ops run the scheme, not a CUDA kernel with a minimum SM

    def get_quant_method(self, layer: Any, prefix: str) -> Any:
        if isinstance(layer, FusedMoE) and self._w8a8_int8_experts(layer, prefix):
            # SGLang has a scheme for these experts on NPU only (its CUDA path raises); their
            # weights are the layout of its W8A8Int8MoEMethod, which creates them here.
            served = int8_experts(ActQuant.COMPRESSED_TENSORS, "compressed-tensors")
            return SglangFlMoEMethod(W8A8Int8MoEMethod(self), served)
        return super().get_quant_method(layer, prefix)

    def _w8a8_int8_experts(self, layer: Any, prefix: str) -> bool:
        """Whether the experts at ``prefix`` are W8A8 int8 with dynamic per-token activations."""
        self._add_fused_moe_to_target_scheme_map()
        scheme = self.get_scheme_dict(layer, prefix + ".0.gate_proj")
        if scheme is None:
            return False
        return bool(self._is_dynamic_token_w8a8(scheme["weights"], scheme["input_activations"]))


class SglangFlFp8Config(_ServedByOps, Fp8Config):
    """``fp8`` (block-quantized checkpoints: DeepSeek-V3, Qwen3-FP8)."""


class SglangFlW8A8Int8Config(_ServedByOps, W8A8Int8Config):
    """``w8a8_int8``."""


class SglangFlAWQConfig(_ServedByOps, AWQConfig):
    """``awq`` (GEMM layout, zero points)."""


# SGLang's quantization name -> the config sglang-fl's platform answers with.
CONFIGS: dict[str, type] = {
    "compressed-tensors": SglangFlCompressedTensorsConfig,
    "fp8": SglangFlFp8Config,
    "w8a8_int8": SglangFlW8A8Int8Config,
    "awq": SglangFlAWQConfig,
}
