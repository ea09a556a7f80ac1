"""Which SGLang platform sglang-fl offers here, and why: asked by the platform entry point and
by ``sglang-fl doctor``.

Imports no SGLang module at import time (``doctor`` runs without SGLang); the platform classes
live in :mod:`.platform`.
"""

from __future__ import annotations

import functools
import logging
import os
import pkgutil
from dataclasses import dataclass

import torch

from ..._strenum import StrEnum
from ...guard import call_plugin_code, describe_exception, plain_str, safe_repr
from ...runtime import Runtime

__all__ = [
    "CPU_PLATFORM",
    "ENTRY_POINT_NAME",
    "PlatformChoice",
    "PlatformSource",
    "choose_platform",
    "default_attention_backend",
    "in_tree_accelerator",
    "sglang_fl_platform_active",
]

_log = logging.getLogger("sglang_fl.integrations.sglang")

ENTRY_POINT_NAME = "sglang_fl"  # in core/pyproject.toml, group sglang.srt.platforms
CPU_PLATFORM = "sglang_fl.integrations.sglang.platform:SglangFlCpuPlatform"


def in_tree_accelerator() -> str | None:
    """The accelerator SGLang would pick in-tree here, or ``None`` on a plain CPU machine.

    Uses SGLang's own probes where they exist (so the answer matches SGLang's fallback
    order), else torch's.
    """
    try:
        from sglang.srt import platforms as sglang_platforms
    except ImportError:  # pragma: no cover - only reachable without SGLang
        sglang_platforms = None
    probes = (
        ("cuda", "_is_cuda_available", torch.cuda.is_available),
        ("rocm", "_is_rocm_available", lambda: False),
        (
            "npu",
            "_is_npu_available",
            lambda: hasattr(torch, "npu") and bool(torch.npu.is_available()),
        ),
        (
            "xpu",
            "_is_xpu_available",
            lambda: hasattr(torch, "xpu") and bool(torch.xpu.is_available()),
        ),
        ("musa", "_is_musa_available", lambda: getattr(torch.version, "musa", None) is not None),
        (
            "mps",
            "_is_mps_available",
            lambda: (
                getattr(torch.backends, "mps", None) is not None
                and torch.backends.mps.is_available()
            ),
        ),
    )
    for name, sglang_probe, torch_probe in probes:
        probe = getattr(sglang_platforms, sglang_probe, None) or torch_probe
        try:
            if probe():
                return name
        except Exception as exc:  # a broken probe means "not this accelerator"
            _log.warning(
                "sglang-fl: the %s platform probe failed (%s); assuming no %s", name, exc, name
            )
    return None


class PlatformSource(StrEnum):
    """Whose SGLang platform runs, as sglang-fl's platform entry point decides it."""

    VENDOR = "vendor"  # a vendor plugin's sglang_fl_platform()
    SGLANG_FL_CPU = "sglang-fl-cpu"  # sglang-fl's CPU platform: no in-tree accelerator here
    IN_TREE = "in-tree"  # SGLang's own platform for the accelerator it finds here
    SGLANG_CPU_ENGINE = "sglang-cpu-engine"  # SGLANG_USE_CPU_ENGINE=1: SGLang's CPU engine
    OTHER_PLUGIN = "other-plugin"  # SGLANG_PLATFORM names another platform plugin


@dataclass(frozen=True)
class PlatformChoice:
    """What :func:`activate` answers (``path``: a class path, ``None`` for none) and why."""

    path: str | None
    source: PlatformSource
    reason: str

    @property
    def is_sglang_fls(self) -> bool:
        """Whether the platform SGLang runs is one sglang-fl offers (its own or a vendor's)."""
        return self.path is not None


def choose_platform(runtime: Runtime) -> PlatformChoice:
    """The platform sglang-fl offers SGLang in this environment, and why (``activate`` and
    ``sglang-fl doctor`` both ask this)."""
    selected = os.environ.get("SGLANG_PLATFORM")
    if selected and selected != ENTRY_POINT_NAME:
        return PlatformChoice(
            None,
            PlatformSource.OTHER_PLUGIN,
            f"SGLANG_PLATFORM={selected!r} selects another platform plugin (SGLang then also "
            "skips sglang-fl's routing plugin)",
        )
    answer = runtime.platform_answer()
    if answer is not None and answer.path is not None:
        return PlatformChoice(
            answer.path,
            PlatformSource.VENDOR,
            f"plugin {answer.plugin!r} declares it (sglang_fl_platform)",
        )
    if selected != ENTRY_POINT_NAME:
        if os.environ.get("SGLANG_USE_CPU_ENGINE", "0") == "1":
            return PlatformChoice(
                None,
                PlatformSource.SGLANG_CPU_ENGINE,
                "SGLANG_USE_CPU_ENGINE=1 asks for SGLang's in-tree CPU engine",
            )
        accelerator = in_tree_accelerator()
        if accelerator is not None:
            return PlatformChoice(
                None,
                PlatformSource.IN_TREE,
                f"SGLang supports the {accelerator} accelerator here with its own platform",
            )
    why = (
        "SGLANG_PLATFORM=sglang_fl names it"
        if selected == ENTRY_POINT_NAME
        else "no accelerator SGLang supports in-tree is present"
    )
    return PlatformChoice(CPU_PLATFORM, PlatformSource.SGLANG_FL_CPU, why)


def default_attention_backend(choice: PlatformChoice, runtime: Runtime) -> tuple[str | None, str]:
    """The attention backend an engine started without ``--attention-backend`` gets on
    ``choice``'s platform (``None``: SGLang decides per model), and why."""
    override = "an explicit --attention-backend (attention_backend=...) wins"
    if choice.source is PlatformSource.SGLANG_FL_CPU:
        return "sglang_fl", f"the default of sglang-fl's CPU platform; {override}"
    if choice.source is PlatformSource.VENDOR and choice.path is not None:
        asked = call_plugin_code(
            functools.partial(_platform_default_backend, choice.path),
            what=f"{choice.path}.get_default_attention_backend()",
            timeout=runtime.config.plugin_timeout,
        )
        name = plain_str(asked.value)
        if asked.timed_out:
            problem = f"did not answer within {runtime.config.plugin_timeout:g} s"
        elif asked.error is not None:
            problem = f"raised {describe_exception(asked.error)}"
        elif not name:
            problem = f"returned {safe_repr(asked.value)}, not a backend name"
        else:
            return name, f"the default of the platform {choice.path}; {override}"
        return None, f"the vendor platform's get_default_attention_backend() {problem}"
    if choice.source is PlatformSource.SGLANG_CPU_ENGINE:
        return "intel_amx", "SGLang's CPU engine: intel_amx, torch_native on a CPU without AMX"
    if choice.source is PlatformSource.IN_TREE:
        return None, (
            "SGLang's in-tree platform picks one per model (flashinfer, triton, fa3, ...); "
            "--attention-backend sglang_fl selects sglang-fl's"
        )
    return None, "the other platform plugin decides"


def _platform_default_backend(path: str) -> object:
    """Instantiate the platform class at ``path`` (``module:Class``) and ask its default."""
    platform_class = pkgutil.resolve_name(path)
    return platform_class().get_default_attention_backend()


def sglang_fl_platform_active(runtime: Runtime) -> bool:
    """Whether SGLang's current platform in this process is one sglang-fl offers: its CPU
    platform, or the one a vendor plugin declares (``sglang_fl_platform``)."""
    from sglang.srt.platforms import current_platform

    cls = type(current_platform)
    path = f"{cls.__module__}:{cls.__qualname__}"
    if path == CPU_PLATFORM:
        return True
    if not current_platform.is_out_of_tree():
        return False
    declared = runtime.platform()
    return declared is not None and declared.replace(":", ".") == path.replace(":", ".")
