"""Hook implementations: the module the ``sglang_fl.backends`` entry point ``cuda`` names."""

from __future__ import annotations

from typing import Any

from sglang_fl.types import CollectiveGroup, OpRegistry, hookimpl

from .backend import (
    SGL_KERNEL,
    SGL_KERNEL_MAMBA,
    SGLANG_TRITON,
    FlashAttnBackend,
    NcclBackend,
    SdkBackend,
)
from .impl import causal_conv, collectives
from .impl.activation import gelu_and_mul, silu_and_mul
from .impl.attention import NO_KERNEL as ATTENTION_NO_KERNEL
from .impl.attention import PLANNER as ATTENTION_PLANNER
from .impl.attention import decode_attention, extend_attention
from .impl.linear_attention import ADAPTERS as LINEAR_ATTENTION
from .impl.linear_attention import NO_KERNEL as LINEAR_ATTENTION_NO_KERNEL
from .impl.moe import fused_moe, topk
from .impl.normalization import gemma_rms_norm, rms_norm
from .impl.quantization import ADAPTERS as QUANTIZATION
from .impl.rotary import rotary_embedding

# The standard ops sgl_kernel has no kernel for: nothing is registered, `sglang-fl ops` says why.
NO_KERNEL = {
    "gelu_new": "sgl_kernel has no NewGELU kernel (SGLang's forward_cuda is forward_native)",
    "gelu_quick": "sgl_kernel.gelu_quick exists in ROCm builds only",
    "layer_norm": "sgl_kernel has no layer norm (SGLang's forward_cuda uses FlashInfer's)",
    "mrotary_embedding": "sgl_kernel has no mrope kernel (SGLang's forward_cuda uses Triton)",
    "clamp_position": "sgl_kernel has none (SGLang's is a JIT kernel in sglang.kernels)",
    "fused_gate_sigmoid_mul": "sgl_kernel has none (SGLang's own Triton kernel stays in place)",
    **ATTENTION_NO_KERNEL,
    **LINEAR_ATTENTION_NO_KERNEL,
    **collectives.LEFT_TO_SGLANG,
}


@hookimpl
def sglang_fl_register_ops(registry: OpRegistry) -> None:
    """Register the adapters themselves; availability is probed on first use."""
    for op_name, reason in NO_KERNEL.items():
        registry.declare_no_kernel(op_name, reason)
    registry.register_many(
        SdkBackend(SGL_KERNEL).implementations(
            {
                "silu_and_mul": silu_and_mul,
                "rms_norm": rms_norm,
                "rotary_embedding": rotary_embedding,
                "gelu_and_mul": gelu_and_mul,
                "gemma_rms_norm": gemma_rms_norm,
                "topk": topk,
                "fused_moe": fused_moe,
            }
        )
    )
    # FlashAttention-3 (sgl_kernel.flash_attn): the same vendor, probed on its own.
    registry.register_many(
        FlashAttnBackend().implementations(
            {"decode_attention": decode_attention, "extend_attention": extend_attention},
            planner=ATTENTION_PLANNER,
        )
    )
    # SGLang's own Triton GDN kernels: the same vendor, probed on their own (no sgl_kernel).
    registry.register_many(SdkBackend(SGLANG_TRITON).implementations(LINEAR_ATTENTION))
    # sgl_kernel's compiled causal convs (sgl_kernel.mamba), probed on their own.
    registry.register_many(SdkBackend(SGL_KERNEL_MAMBA).implementations(causal_conv.ADAPTERS))
    registry.register_many(NcclBackend().implementations(collectives.COLLECTIVES))
    # Quantized GEMMs (sgl_kernel) and experts (SGLang's Triton), each preparing its layout.
    registry.register_many(SdkBackend(SGL_KERNEL).implementations(QUANTIZATION))


@hookimpl
def sglang_fl_communicator(group: CollectiveGroup) -> Any:
    """NCCL is the engine's own device group: checked, no per-group state (impl/collectives)."""
    return collectives.communicator(group)


@hookimpl
def sglang_fl_platform() -> str | None:
    """CUDA is an in-tree SGLang platform: no out-of-tree platform is needed."""
    return None
