"""Seed-layout registration: ``register_builtins(registry)``, no hook implementations needed.

The ``sglang_fl.backends`` entry point ``ascend`` names this module; sglang-fl's loader calls
``register_builtins`` once per process. The adapters are registered as they are (no wrapper),
each probed lazily through :meth:`AscendBackend.is_available`.
"""

from __future__ import annotations

from sglang_fl.dispatch.registry import OpRegistry

from .ascend import AscendBackend
from .impl.activation import silu_and_mul_npu
from .impl.moe import fused_moe_npu, topk_npu
from .impl.normalization import rms_norm_npu
from .impl.rotary import rotary_embedding_npu


def register_builtins(registry: OpRegistry) -> None:
    registry.register_many(
        AscendBackend().implementations(
            {
                "silu_and_mul": silu_and_mul_npu,
                "rms_norm": rms_norm_npu,
                "rotary_embedding": rotary_embedding_npu,
                "topk": topk_npu,
                "fused_moe": fused_moe_npu,
            }
        )
    )
