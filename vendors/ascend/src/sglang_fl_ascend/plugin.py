"""Hook implementations: the module the ``sglang_fl.backends`` entry point ``ascend`` names."""

from __future__ import annotations

from typing import Any

from sglang_fl.types import CollectiveGroup, OpRegistry, hookimpl

from .backend import AscendBackend, SglKernelNpuBackend
from .impl import collectives
from .impl.activation import gelu_and_mul, gelu_new, gelu_quick, silu_and_mul
from .impl.attention import decode_attention, extend_attention, store_kv_cache
from .impl.linear_attention import ADAPTERS as LINEAR_ATTENTION
from .impl.linear_attention import NO_KERNEL as LINEAR_ATTENTION_NO_KERNEL
from .impl.moe import fused_moe, topk
from .impl.normalization import gemma_rms_norm, layer_norm, rms_norm
from .impl.quantization import ADAPTERS as QUANTIZATION
from .impl.quantization import NO_KERNEL as QUANTIZATION_NO_KERNEL
from .impl.rotary import mrotary_embedding, rotary_embedding

# The standard ops torch_npu has no operator for: nothing is registered, `sglang-fl ops` says why.
NO_KERNEL = {
    "clamp_position": "torch_npu has no clamp_position operator (torch.clamp runs on the NPU)",
    "fused_gate_sigmoid_mul": "torch_npu has no fused gate-sigmoid-mul operator",
    **LINEAR_ATTENTION_NO_KERNEL,
    **collectives.LEFT_TO_SGLANG,
    **QUANTIZATION_NO_KERNEL,
}


@hookimpl
def sglang_fl_register_ops(registry: OpRegistry) -> None:
    """Register the adapters themselves; availability is probed on first use."""
    for op_name, reason in NO_KERNEL.items():
        registry.declare_no_kernel(op_name, reason)
    registry.register_many(
        AscendBackend().implementations(
            {
                "silu_and_mul": silu_and_mul,
                "rms_norm": rms_norm,
                "rotary_embedding": rotary_embedding,
                "gelu_and_mul": gelu_and_mul,
                "gelu_new": gelu_new,
                "gelu_quick": gelu_quick,
                "gemma_rms_norm": gemma_rms_norm,
                "layer_norm": layer_norm,
                "mrotary_embedding": mrotary_embedding,
                "topk": topk,
                "fused_moe": fused_moe,
                "store_kv_cache": store_kv_cache,
                "decode_attention": decode_attention,
                "extend_attention": extend_attention,
                **collectives.COLLECTIVES,
            }
        )
    )
    # sgl_kernel_npu's GDN operators: the same vendor, probed after torch_npu.
    registry.register_many(SglKernelNpuBackend().implementations(LINEAR_ATTENTION))
    # Quantized matmuls, each preparing its weight layout once per layer.
    registry.register_many(AscendBackend().implementations(QUANTIZATION))


@hookimpl
def sglang_fl_communicator(group: CollectiveGroup) -> Any:
    """HCCL is the engine's own device group: checked, no per-group state (impl/collectives)."""
    return collectives.communicator(group)


@hookimpl
def sglang_fl_platform() -> str | None:
    """Ascend NPUs are an in-tree SGLang platform (``npu``): no out-of-tree platform is needed."""
    return None
