"""Hook implementations: the module the ``sglang_fl.backends`` entry point ``ascend`` names."""

from __future__ import annotations

from sglang_fl import hookimpl
from sglang_fl.dispatch.registry import OpRegistry

from .backend import AscendBackend
from .impl.activation import silu_and_mul
from .impl.moe import fused_moe, topk
from .impl.normalization import rms_norm
from .impl.rotary import rotary_embedding


@hookimpl
def sglang_fl_register_ops(registry: OpRegistry) -> None:
    """Register the torch_npu adapters themselves; availability is probed on first use."""
    registry.register_many(
        AscendBackend().implementations(
            {
                "silu_and_mul": silu_and_mul,
                "rms_norm": rms_norm,
                "rotary_embedding": rotary_embedding,
                "topk": topk,
                "fused_moe": fused_moe,
            }
        )
    )


@hookimpl
def sglang_fl_platform() -> str | None:
    """Ascend NPUs are an in-tree SGLang platform (``npu``): no out-of-tree platform is needed."""
    return None
