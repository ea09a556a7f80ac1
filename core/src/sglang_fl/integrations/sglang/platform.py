"""The ``sglang.srt.platforms`` entry point and sglang-fl's built-in CPU platform.

SGLang asks every platform entry point which platform to activate. sglang-fl answers with the
platform a loaded vendor plugin declares (``sglang_fl_platform()``); else, on a machine with
no accelerator SGLang supports in-tree, with :class:`SglangFlCpuPlatform`, so SGLang serves on
a plain CPU through sglang-fl's implementations; else ``None`` (SGLang's in-tree platform).
``SGLANG_USE_CPU_ENGINE=1`` asks for SGLang's own CPU engine, so sglang-fl then offers nothing,
unless ``SGLANG_PLATFORM=sglang_fl`` names this entry point: that explicit choice always gets a
platform (the vendor's, else the CPU one).
"""

from __future__ import annotations

import functools
import logging
import types

import torch

from ...runtime import get_runtime
from .platform_choice import CPU_PLATFORM, ENTRY_POINT_NAME, choose_platform, in_tree_accelerator

__all__ = [
    "CPU_PLATFORM",
    "DISPATCH_KEY",
    "ENTRY_POINT_NAME",
    "activate",
    "in_tree_accelerator",
]

_log = logging.getLogger("sglang_fl.integrations.sglang")

# Fused ops look for ``forward_<key>``; none defines this one, so any op sglang-fl does not
# route runs SGLang's portable ``forward_native`` (never the sgl_kernel CPU path).
DISPATCH_KEY = "sglang_fl_cpu"


def activate() -> str | None:
    """``sglang.srt.platforms`` entry point: a platform class path, or ``None``."""
    choice = choose_platform(get_runtime())
    if choice.path is not None:
        _log.info("sglang-fl: offering the SGLang platform %s: %s", choice.path, choice.reason)
    return choice.path


def device_module_without_accelerator() -> None:
    """Make ``torch.get_device_module()`` answer ``torch.cpu`` when no accelerator is present.

    torch documents that call as "the module for the current accelerator or CPU if none is
    present", but a CUDA build (SGLang pins one) names ``torch.cuda`` on a machine without a
    GPU, and SGLang's Qwen3-Next builds its gated norms with
    ``device=torch.get_device_module().current_device()``, which then fails with "Found no
    NVIDIA driver". Installed only in processes running sglang-fl's CPU platform and only while
    torch sees no accelerator; an explicit ``device`` argument is passed through unchanged.
    """
    if torch.accelerator.is_available() or getattr(torch.get_device_module, "_sglang_fl", False):
        return
    original = torch.get_device_module

    # torch's is an lru_cache wrapper; dynamo registers its handler on ``__wrapped__`` of
    # whatever ``torch.get_device_module`` is when it first traces, so keep that attribute.
    @functools.wraps(getattr(original, "__wrapped__", original))
    def get_device_module(device: torch.device | str | None = None) -> types.ModuleType:
        module: types.ModuleType = original("cpu" if device is None else device)
        return module

    get_device_module._sglang_fl = True  # type: ignore[attr-defined]
    torch.get_device_module = get_device_module  # type: ignore[assignment]


def _platform_base() -> type:
    from sglang.srt.platforms.cpu import CpuSRTPlatform

    base: type = CpuSRTPlatform
    return base


def _oot_enum() -> object:  # sglang.srt.platforms.device_mixin.PlatformEnum.OOT
    from sglang.srt.platforms.device_mixin import PlatformEnum

    return PlatformEnum.OOT


class SglangFlCpuPlatform(_platform_base()):  # type: ignore[misc]
    """SGLang's CPU platform, out of tree: portable torch paths, sglang-fl's kernels.

    SGLang's in-tree CPU engine needs a CPU build of ``sgl_kernel``; as an out-of-tree
    platform with its own dispatch key, every fused op SGLang resolves runs either the
    implementation sglang-fl routes it to or ``forward_native``.
    """

    _enum = _oot_enum()
    device_name = "cpu"
    device_type = "cpu"

    def get_dispatch_key_name(self) -> str:
        return DISPATCH_KEY

    def get_default_attention_backend(self) -> str:
        """sglang-fl's attention backend: the attention ops, run by the policy's kernels."""
        return "sglang_fl"  # attention_backend.BACKEND_NAME (no import: loaded by SGLang early)

    def get_graph_runner_cls(self) -> type:
        """``--enable-torch-compile``'s decode graph runner: the policy's choice between
        SGLang's CPU graph runner made to run on sglang-fl's kernels and the runners plugins
        offer (:mod:`.graph_runner`)."""
        from .graph_runner import cpu_graph_runner_class, selected_graph_runner

        return selected_graph_runner(
            lambda model_runner, **options: cpu_graph_runner_class()(model_runner, **options)
        )

    def init_backend(self) -> None:
        """Per worker, before the model is built: see :func:`device_module_without_accelerator`."""
        super().init_backend()
        device_module_without_accelerator()

    def get_quantization_config(self, quantization: str) -> type | None:
        """sglang-fl's config for a quantization it serves (compressed-tensors, fp8, w8a8_int8,
        awq): SGLang's own, whose layers run sglang-fl's quantized ops; ``None`` for the others
        (SGLang's in-tree config). See ``integrations/sglang/quantization``."""
        from .quantization import quantization_config

        return quantization_config(quantization)

    def support_mamba_cache_extra_buffer(self) -> bool:
        """Hybrid models' radix cache (``extra_buffer``) snapshots linear-attention states.

        SGLang asks out-of-tree platforms (``arg_groups/mamba_hook.py``). The snapshots are
        plain indexed copies of the state pools plus the per-chunk states ``h`` that
        ``chunk_gated_delta_rule`` returns; sglang-fl's GDN ops provide both on any device.
        """
        return True
