"""Find the pieces of SGLang the integration hooks into, by feature rather than by version.

SGLang moves fast; a version string says little about which hook points exist. Everything the
integration needs is looked up here once, and a missing piece is an
:class:`SglangApiError` that names the SGLang version found and what is missing.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from ...errors import SglangFlError

__all__ = [
    "RESOLVE_TARGET",
    "SglangApi",
    "SglangApiError",
    "ask_schedulers_to_exit",
    "find_attribute",
    "find_sglang_api",
    "sglang_version",
]

_log = logging.getLogger("sglang_fl.integrations.sglang")

# The method every fused op calls once per instance to pick its forward (SGLang >= 0.5.2x).
RESOLVE_TARGET = "sglang.kernels.fused_op.BaseFusedOp._resolve_forward_method"

# Standard op -> (module, class, more classes of that module...) of the SGLang layers it stands
# for. A layer class is routed to the op of its nearest listed class (MRotaryEmbedding, a
# RotaryEmbedding subclass, to mrotary_embedding).
LAYER_CLASSES: dict[str, tuple[str, ...]] = {
    "silu_and_mul": ("sglang.srt.layers.activation", "SiluAndMul"),
    "rms_norm": ("sglang.srt.layers.layernorm", "RMSNorm"),
    "rotary_embedding": ("sglang.srt.layers.rotary_embedding", "RotaryEmbedding"),
    "gelu_and_mul": ("sglang.srt.layers.activation", "GeluAndMul"),
    "gelu_new": ("sglang.srt.layers.activation", "NewGELU"),
    "gelu_quick": ("sglang.srt.layers.activation", "QuickGELU"),
    "gemma_rms_norm": ("sglang.srt.layers.layernorm", "GemmaRMSNorm", "Gemma3RMSNorm"),
    "layer_norm": ("sglang.srt.layers.layernorm", "LayerNorm"),
    "mrotary_embedding": ("sglang.srt.layers.rotary_embedding", "MRotaryEmbedding"),
    "clamp_position": ("sglang.kernels.ops.attention.clamp_position", "ClampPositionOp"),
    "topk": ("sglang.srt.layers.moe.topk", "TopK"),
    "fused_moe": ("sglang.srt.layers.quantization.unquant", "UnquantizedFusedMoEMethod"),
}


class SglangApiError(SglangFlError, RuntimeError):
    """The installed SGLang lacks a hook point the integration needs."""


@dataclass(frozen=True)
class SglangApi:
    """The SGLang objects the integration uses, found once per process."""

    version: str
    base_fused_op: type
    hook_registry: Any
    hook_type_around: Any
    hook_type_replace: Any
    layers: dict[type, str]  # SGLang layer class -> the standard op it stands for


def sglang_version() -> str:
    """The installed SGLang version, or a description of why there is none."""
    try:
        return version("sglang")
    except PackageNotFoundError:
        return "not installed"


def _missing(what: str, found: str) -> SglangApiError:
    return SglangApiError(
        f"sglang-fl cannot route SGLang's layers: {what} (found SGLang {found}). sglang-fl "
        "supports SGLang versions whose fused ops resolve their forward once per instance "
        f"through {RESOLVE_TARGET} (SGLang 0.5.23 does). Upgrade SGLang, or uninstall sglang-fl "
        "or set SGLANG_PLUGINS to the other plugins to run SGLang without it."
    )


def find_sglang_api() -> SglangApi:
    """Locate the hook points; raises :class:`SglangApiError` when one is missing."""
    found = sglang_version()
    try:
        fused_op = importlib.import_module("sglang.kernels.fused_op")
        hook_registry_mod = importlib.import_module("sglang.srt.plugins.hook_registry")
    except ImportError as exc:
        raise _missing(f"cannot import {exc.name or exc}", found) from exc

    base = getattr(fused_op, "BaseFusedOp", None)
    if not isinstance(base, type):
        raise _missing("sglang.kernels.fused_op has no BaseFusedOp", found)
    if not callable(getattr(base, "_resolve_forward_method", None)):
        raise _missing("BaseFusedOp has no _resolve_forward_method", found)
    registry = getattr(hook_registry_mod, "HookRegistry", None)
    hook_type = getattr(hook_registry_mod, "HookType", None)
    if registry is None or not hasattr(registry, "register") or hook_type is None:
        raise _missing("sglang.srt.plugins.hook_registry has no HookRegistry/HookType", found)
    around = getattr(hook_type, "AROUND", None)
    replace = getattr(hook_type, "REPLACE", None)
    if around is None or replace is None:
        raise _missing("HookType lacks AROUND or REPLACE", found)

    layers: dict[type, str] = {}
    for op_name, (module_name, *class_names) in LAYER_CLASSES.items():
        for class_name in class_names:
            try:
                cls = getattr(importlib.import_module(module_name), class_name)
            except (ImportError, AttributeError) as exc:
                raise _missing(f"cannot find {module_name}.{class_name} ({exc})", found) from exc
            if not (isinstance(cls, type) and issubclass(cls, base)):
                raise _missing(f"{module_name}.{class_name} is not a BaseFusedOp", found)
            layers[cls] = op_name
    return SglangApi(found, base, registry, around, replace, layers)


def find_attribute(path: str) -> Any:
    """The object a dotted ``module.attr`` (or ``module.Class.attr``) path names, or ``None``
    when this SGLang has no such thing (a hook point that moved)."""
    try:
        return pkgutil.resolve_name(path)
    except (ImportError, AttributeError, ValueError):
        return None


def ask_schedulers_to_exit(engine: Any, timeout: float) -> None:
    """SGLang's graceful scheduler shutdown, as its server does on SIGTERM, for an engine.

    Sends SGLang's ``ShutdownReq`` (each scheduler leaves its event loop and releases what it
    holds) and waits up to ``timeout`` seconds for the scheduler processes to exit; whatever is
    left, and every other child, is then SGLang's own ``Engine.shutdown()``'s to kill. Does
    nothing for an attached engine, an SGLang without these pieces, or an engine whose
    schedulers do not honour the request: SGLang 0.5.23's pipeline-parallel and
    data-parallel event loops never read it (``scheduler_pp_mixin.event_loop_pp``), so asking
    would only delay their kill by ``timeout``.
    """
    args = getattr(engine, "server_args", None)
    if getattr(args, "pp_size", 1) != 1 or getattr(args, "dp_size", 1) != 1:
        return
    manager = getattr(engine, "tokenizer_manager", None)
    dispatch = getattr(manager, "_dispatch_to_scheduler", None)
    request = find_attribute("sglang.srt.managers.io_struct.ShutdownReq")
    schedulers = find_attribute(
        "sglang.srt.utils.cudacore_pyspy_dump_utils.collect_scheduler_processes"
    )
    if getattr(engine, "_attached", False) or dispatch is None or None in (request, schedulers):
        return
    try:
        dispatch(request())
    except Exception as exc:  # the socket may be gone already: SGLang's shutdown still runs
        _log.warning("sglang-fl: could not ask the schedulers to exit gracefully: %s", exc)
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and schedulers():
        time.sleep(0.1)
    if schedulers():
        _log.warning(
            "sglang-fl: schedulers still running %.0f s after a graceful shutdown request; "
            "SGLang's shutdown kills them (their communicators are not closed)",
            timeout,
        )
