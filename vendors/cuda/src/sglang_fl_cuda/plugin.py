"""Hook implementations: the module the ``sglang_fl.backends`` entry point ``cuda`` names."""

from __future__ import annotations

from sglang_fl.types import OpRegistry, hookimpl

from .backend import CudaBackend, SglangTritonBackend
from .impl.activation import gelu_and_mul, silu_and_mul
from .impl.linear_attention import ADAPTERS as LINEAR_ATTENTION
from .impl.linear_attention import NO_KERNEL as LINEAR_ATTENTION_NO_KERNEL
from .impl.moe import fused_moe, topk
from .impl.normalization import gemma_rms_norm, rms_norm
from .impl.rotary import rotary_embedding

# The standard ops sgl_kernel has no kernel for: nothing is registered, `sglang-fl ops` says why.
NO_KERNEL = {
    "gelu_new": "sgl_kernel has no NewGELU kernel (SGLang's forward_cuda is forward_native)",
    "gelu_quick": "sgl_kernel.gelu_quick exists in ROCm builds only",
    "layer_norm": "sgl_kernel has no layer norm (SGLang's forward_cuda uses FlashInfer's)",
    "mrotary_embedding": "sgl_kernel has no mrope kernel (SGLang's forward_cuda uses Triton)",
    "clamp_position": "sgl_kernel has none (SGLang's is a JIT kernel in sglang.kernels)",
    "fused_gate_sigmoid_mul": "sgl_kernel has none (SGLang's own Triton kernel stays in place)",
    # FlashInfer / sgl_kernel have them; this wheel has no adapter for them yet, so it declares
    # none rather than ship an untested one (SGLang's own flashinfer backend serves CUDA).
    **dict.fromkeys(
        ("store_kv_cache", "decode_attention", "extend_attention"),
        "no adapter in this wheel yet for FlashInfer's / sgl_kernel's attention kernels",
    ),
    **LINEAR_ATTENTION_NO_KERNEL,
}


@hookimpl
def sglang_fl_register_ops(registry: OpRegistry) -> None:
    """Register the adapters themselves; availability is probed on first use."""
    for op_name, reason in NO_KERNEL.items():
        registry.declare_no_kernel(op_name, reason)
    registry.register_many(
        CudaBackend().implementations(
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
    # SGLang's own Triton GDN kernels: the same vendor, probed on their own (no sgl_kernel).
    registry.register_many(SglangTritonBackend().implementations(LINEAR_ATTENTION))


@hookimpl
def sglang_fl_platform() -> str | None:
    """CUDA is an in-tree SGLang platform: no out-of-tree platform is needed."""
    return None
