"""sglang-fl: run SGLang's fused ops, attention, collectives and linear attention on any chip.

The names exported here are the stable API: for plugin authors, those of :mod:`sglang_fl.types`
(documented there); for hosts, :func:`get_runtime` and the errors. See ``docs/architecture.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._version import __version__
from .errors import (
    CollectiveDivergenceError,
    ConfigError,
    ContractViolationError,
    GraphModeRefused,
    NoImplementationError,
    PluginLoadError,
    RegistrationError,
    SglangFlError,
    StrictModeError,
    UnknownOpError,
    Unsupported,
)
from .hookspecs import hookimpl, hookspec
from .types import (
    Availability,
    Backend,
    BackendImplKind,
    BackendPriority,
    ChipSdk,
    OpImpl,
    PreparedKernel,
    Provenance,
)
from .types import __getattr__ as __getattr__  # OpRegistry, CollectiveGroup, ...: on first use

if TYPE_CHECKING:
    from .collective_library import DtypeSet, ProcessGroupLibrary, UnevenCalls
    from .dispatch.registry import OpRegistry
    from .ops.attention.plan import AttentionBatch, AttentionPlan, DefaultPlanner, GraphMode
    from .ops.attention.sglang_backend import SglangAttentionBackendOffer
    from .ops.collectives.group import CollectiveGroup
    from .ops.graph_runner import SglangGraphRunnerOffer
    from .runtime import Runtime


__all__ = [
    "AttentionBatch",
    "AttentionPlan",
    "Availability",
    "Backend",
    "BackendImplKind",
    "BackendPriority",
    "ChipSdk",
    "CollectiveDivergenceError",
    "CollectiveGroup",
    "ConfigError",
    "ContractViolationError",
    "DefaultPlanner",
    "DtypeSet",
    "GraphMode",
    "GraphModeRefused",
    "NoImplementationError",
    "OpImpl",
    "OpRegistry",
    "PluginLoadError",
    "PreparedKernel",
    "ProcessGroupLibrary",
    "Provenance",
    "RegistrationError",
    "SglangAttentionBackendOffer",
    "SglangFlError",
    "SglangGraphRunnerOffer",
    "StrictModeError",
    "UnevenCalls",
    "UnknownOpError",
    "Unsupported",
    "__version__",
    "get_runtime",
    "hookimpl",
    "hookspec",
]


def get_runtime() -> Runtime:
    """The process-wide runtime (plugins loaded once); see :func:`sglang_fl.runtime.get_runtime`."""
    from .runtime import get_runtime as _get_runtime

    return _get_runtime()
