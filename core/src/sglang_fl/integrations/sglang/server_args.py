"""What SGLang's argument resolution gives an engine on sglang-fl's platform, and the record of
which attention backend served.

SGLang resolves its server arguments in the main process (``arg_groups/pipeline.py``), after
``load_plugins()``; a plugin may wrap a named step (``register_resolution_hook``). Where the
platform SGLang runs is one sglang-fl offered (its CPU platform, or a vendor's), three steps are
wrapped, each changing only what the user left unset:

- ``handle_missing_default_values``: the device is the platform's ``device_type``. SGLang's
  ``get_device()`` asks an out-of-tree platform and gets a ``torch.device``, which that very
  step then cannot split: ``sglang.Engine(model_path=...)`` failed without ``device="cpu"``.
- ``handle_cpu_backends``: the attention backend is the platform's
  ``get_default_attention_backend()`` (``sglang_fl`` on sglang-fl's CPU platform). SGLang reads
  the platform's default only when the backend is still unset after this step, which sets
  ``intel_amx`` for ``device="cpu"``, turned into ``torch_native`` without AMX
  (``_attention_backend_platform_fallbacks``). An explicit ``attention_backend`` (or
  ``prefill_``/``decode_attention_backend``) still wins.
- ``handle_mamba_backend``: a hybrid (mamba-style) model's conv states take the model's dtype
  when ``SGLANG_MAMBA_CONV_DTYPE`` is unset. SGLang keeps them in bfloat16 by default and its
  GDN prefill writes activations straight into them (``layers/attention/linear/gdn_backend.py``
  ``conv_states[...] = mixed_qkv``), which fails for a float32 or float16 model. The variable
  is set in the main process, so the scheduler processes it starts inherit it; a value the user
  set is kept.

Per model runner, once its attention backends are built, a backend other than ``sglang_fl`` gets
an ``attention_backend`` record (``runner: "sglang"``) with the reason: chosen explicitly, set by
a named SGLang resolution step, or the platform is not sglang-fl's. (``sglang_fl`` writes its
own record when it builds, naming the implementation that serves.)
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from ...dispatch_report import DispatchReport, ReportEvent, Runner
from ...ops.attention import SGLANG_ATTENTION_BACKEND
from ...runtime import get_runtime
from .backend_selection import BACKEND_NAME
from .compat import SglangApi
from .platform_choice import choose_platform, sglang_fl_platform_active

__all__ = [
    "BUILD_TARGET",
    "CONV_DTYPE_VARIABLE",
    "attention_backend_reason",
    "install",
]

_log = logging.getLogger("sglang_fl.integrations.sglang")

BUILD_TARGET = (
    "sglang.srt.model_executor.model_runner_components.attention_backend_setup"
    ".build_attention_backends"
)
CONV_DTYPE_VARIABLE = "SGLANG_MAMBA_CONV_DTYPE"
_SGLANG_CONV_DEFAULT = "bfloat16"  # configs/mamba_utils.py mamba2_state_dtype
_DTYPE_NAMES = {
    "torch.float32": "float32",
    "torch.bfloat16": "bfloat16",
    "torch.float16": "float16",
}
# The server arguments naming a phase's attention backend, the more specific first.
_BACKEND_FIELDS = {
    "prefill": ("prefill_attention_backend", "attention_backend"),
    "decode": ("decode_attention_backend", "attention_backend"),
}

_installed = False
_install_lock = threading.Lock()
_conv_dtype_set: str | None = None  # what this process put in SGLANG_MAMBA_CONV_DTYPE


def install(api: SglangApi, report: DispatchReport) -> None:
    """Wrap the three resolution steps and hook the attention backends' build (idempotent).

    An SGLang without these seams (older or newer than 0.5.23) keeps its own defaults; the log
    says which seam is missing.
    """
    global _installed
    with _install_lock:
        if _installed:
            return
        _installed = True
    try:
        from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook
    except ImportError as exc:
        _log.warning("sglang-fl: SGLang has no resolution hooks (%s); its defaults apply", exc)
    else:
        steps = {
            "handle_missing_default_values": _default_device,
            "handle_cpu_backends": _default_attention_backend,
            "handle_mamba_backend": _default_conv_state_dtype,
        }
        for step, wrapper in steps.items():
            try:
                register_resolution_hook(step)(wrapper)
            except ValueError as exc:  # not a step this SGLang lets plugins wrap
                _log.warning("sglang-fl: %s; SGLang's own %s applies", exc, step)

    def around_build(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        backends = original(*args, **kwargs)
        runner = kwargs.get("model_runner", args[0] if args else None)
        if runner is not None:
            _report_served(report, runner, backends)
        return backends

    api.hook_registry.register(BUILD_TARGET, around_build, api.hook_type_around)


# --- the resolution steps ------------------------------------------------------------------------


def _resolving(server_args: Any) -> Any:
    from sglang.srt.arg_groups.overrides import resolving_view

    return resolving_view(server_args)


def _declare(server_args: Any, step: str, **fields: Any) -> None:
    from sglang.srt.arg_groups.overrides import declare_resolution

    declare_resolution(server_args, f"sglang_fl:{step}", **fields)


def _default_device(server_args: Any, previous: Callable[[Any], None]) -> None:
    if _resolving(server_args).device is None and sglang_fl_platform_active(get_runtime()):
        from sglang.srt.platforms import current_platform

        _declare(server_args, "handle_missing_default_values", device=current_platform.device_type)
    previous(server_args)


def _default_attention_backend(server_args: Any, previous: Callable[[Any], None]) -> None:
    if _resolving(server_args).attention_backend is None and sglang_fl_platform_active(
        get_runtime()
    ):
        from sglang.srt.platforms import current_platform

        default = current_platform.get_default_attention_backend()
        _declare(server_args, "handle_cpu_backends", attention_backend=default)
    previous(server_args)


def _default_conv_state_dtype(server_args: Any, previous: Callable[[Any], None]) -> None:
    previous(server_args)
    global _conv_dtype_set
    current = os.environ.get(CONV_DTYPE_VARIABLE)
    if current is not None and current != _conv_dtype_set:
        return  # the user's choice
    if not sglang_fl_platform_active(get_runtime()):
        return
    from sglang.srt.arg_groups.model_override_base import model_config_of
    from sglang.srt.configs.hybrid_arch import mambaish_config

    model_config = model_config_of(server_args)
    if mambaish_config(model_config) is None:
        return
    wanted = _DTYPE_NAMES.get(str(model_config.dtype))
    if wanted is None or wanted == _SGLANG_CONV_DEFAULT:
        if current is not None:  # an earlier engine of this process set it
            del os.environ[CONV_DTYPE_VARIABLE]
            _conv_dtype_set = None
        return
    os.environ[CONV_DTYPE_VARIABLE] = _conv_dtype_set = wanted
    _log.info(
        "sglang-fl: %s=%s, the model's dtype (SGLang's default %s conv states cannot take %s "
        "activations)",
        CONV_DTYPE_VARIABLE,
        wanted,
        _SGLANG_CONV_DEFAULT,
        wanted,
    )


# --- which attention backend served, and why ---------------------------------------------------


def attention_backend_reason(server_args: Any, phase: str, name: str) -> str:
    """Why ``name`` serves ``phase`` (``prefill``/``decode``): the user's explicit choice, the
    SGLang resolution steps that set it, and whose platform runs."""
    raw = getattr(server_args, "_raw_input", None)
    steps = getattr(server_args, "_resolved_overrides", None)
    if raw is None or steps is None:
        why = "SGLang's argument resolution chose it (its record is not available)"
    else:
        explicit = [(f, raw[f]) for f in _BACKEND_FIELDS[phase] if raw.get(f) is not None]
        chain = [
            f"{source} set {fields[field]!r}"
            for source, fields in steps
            for field in _BACKEND_FIELDS[phase]
            if field in fields
        ]
        if explicit:
            field, value = explicit[0]
            why = f"chosen explicitly ({field}={value!r})"
        elif chain:
            why = "SGLang's argument resolution: " + ", then ".join(chain)
        else:
            why = "SGLang's default for this platform and model (get_default_attn_backend)"
    if sglang_fl_platform_active(get_runtime()):
        return why
    choice = choose_platform(get_runtime())
    return f"{why}; sglang-fl's platform is not running here: {choice.reason}"


def _report_served(report: DispatchReport, model_runner: Any, backends: Any) -> None:
    """One record per backend other than ``sglang_fl`` that serves a phase of this runner."""
    served: dict[str, list[str]] = {}
    for phase in _BACKEND_FIELDS:
        name = getattr(model_runner, f"{phase}_attention_backend_str", None)
        if name is not None and name != BACKEND_NAME:
            served.setdefault(str(name), []).append(phase)
    if not served:
        return
    backend = getattr(backends, "attn_backend", None)
    cls = type(backend)
    for name, phases in served.items():
        report.emit(
            ReportEvent.ATTENTION_BACKEND,
            op=SGLANG_ATTENTION_BACKEND,
            runner=Runner.SGLANG,
            backend=name,
            phases=phases,
            backend_class=f"{cls.__module__}.{cls.__qualname__}",
            reason=attention_backend_reason(model_runner.server_args, phases[0], name),
        )
