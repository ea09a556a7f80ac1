"""Seed-layout registration: ``register_builtins(registry)``, no hook implementations needed.

The ``sglang_fl.backends`` entry point ``ascend`` names this module; sglang-fl's loader calls
``register_builtins`` once per process. The adapters are registered as they are (no wrapper),
each probed lazily through :meth:`AscendBackend.is_available`.
"""

from __future__ import annotations

from sglang_fl.dispatch.registry import OpRegistry

from .ascend import AscendBackend
from .impl.activation import gelu_and_mul_npu, gelu_new_npu, gelu_quick_npu, silu_and_mul_npu
from .impl.normalization import gemma_rms_norm_npu, rms_norm_npu
from .impl.rotary import mrotary_embedding_npu, rotary_embedding_npu

# The standard ops torch_npu has no operator for: nothing is registered, `sglang-fl ops` says why.
NO_KERNEL = {
    "layer_norm": "torch_npu has no layer norm operator (SGLang's forward_npu is forward_native)",
    "clamp_position": "torch_npu has no clamp_position operator (torch.clamp runs on the NPU)",
}


def register_builtins(registry: OpRegistry) -> None:
    for op_name, reason in NO_KERNEL.items():
        registry.declare_no_kernel(op_name, reason)
    registry.register_many(
        AscendBackend().implementations(
            {
                "silu_and_mul": silu_and_mul_npu,
                "rms_norm": rms_norm_npu,
                "rotary_embedding": rotary_embedding_npu,
                "gelu_and_mul": gelu_and_mul_npu,
                "gelu_new": gelu_new_npu,
                "gelu_quick": gelu_quick_npu,
                "gemma_rms_norm": gemma_rms_norm_npu,
                "mrotary_embedding": mrotary_embedding_npu,
            }
        )
    )
