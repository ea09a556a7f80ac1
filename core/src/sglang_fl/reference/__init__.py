"""The pure-PyTorch reference backend: the contracts' own reference implementations.

Registered through the same ``sglang_fl_register_ops`` hook as any vendor, under the plugin
name ``reference`` from the ``sglang-fl`` distribution. It runs anywhere torch runs and is the
last resort of the default order.
"""

from __future__ import annotations

from ..dispatch.identity import REFERENCE_PLUGIN
from ..dispatch.registry import OpRegistry
from ..dispatch.types import BackendImplKind, BackendPriority, OpImpl
from ..hookspecs import hookimpl
from ..ops import STANDARD_OPS

PLUGIN_NAME = REFERENCE_PLUGIN


def impl_id(op_name: str) -> str:
    return f"reference.{op_name}"


@hookimpl
def sglang_fl_register_ops(registry: OpRegistry) -> None:
    registry.register_many(
        OpImpl(
            op_name=contract.name,
            impl_id=impl_id(contract.name),
            kind=BackendImplKind.REFERENCE,
            fn=contract.reference,
            priority=BackendPriority.REFERENCE,
            planner=None if contract.plan_stage is None else contract.plan_stage.reference_planner,
            graph_problems=contract.reference_graph_problems or None,
            traceable=contract.reference_traceable,
        )
        for contract in STANDARD_OPS.values()
    )
