"""sglang-fl: route SGLang's fused operators to the kernels of any chip.

The names exported here are the stable API for plugin authors; see ``docs/architecture.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import (
    ConfigError,
    NoImplementationError,
    PluginLoadError,
    RegistrationError,
    SglangFlError,
    StrictModeError,
    Unsupported,
)
from .hookspecs import hookimpl, hookspec

if TYPE_CHECKING:
    from .runtime import Runtime

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "NoImplementationError",
    "PluginLoadError",
    "RegistrationError",
    "SglangFlError",
    "StrictModeError",
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
