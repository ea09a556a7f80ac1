"""Seed-layout registration: ``register_builtins(registry)``, no hook implementations needed.

The ``sglang_fl.backends`` entry point ``ascend`` names this module; sglang-fl's loader calls
``register_builtins`` once per process. The adapters are registered as they are (no wrapper),
each probed lazily through :meth:`AscendBackend.is_available`.
"""

from __future__ import annotations

from sglang_fl.dispatch.registry import OpRegistry
from sglang_fl.dispatch.types import BackendImplKind, BackendPriority, OpImpl

from .ascend import AscendBackend
from .impl.activation import silu_and_mul_npu
from .impl.normalization import rms_norm_npu
from .impl.rotary import rotary_embedding_npu


def register_builtins(registry: OpRegistry) -> None:
    backend = AscendBackend()
    registry.register_many(
        OpImpl(
            op_name=op_name,
            impl_id="vendor.ascend",
            kind=BackendImplKind.VENDOR,
            fn=fn,
            vendor=backend.name,
            priority=BackendPriority.VENDOR,
            available=backend.is_available,
        )
        for op_name, fn in (
            ("silu_and_mul", silu_and_mul_npu),
            ("rms_norm", rms_norm_npu),
            ("rotary_embedding", rotary_embedding_npu),
        )
    )
