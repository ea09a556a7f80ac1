"""SGLang 0.5.23's Triton GDN kernel entry points, as SGLang defines them (not as hooked).

The module the ``SGLANG_TRITON`` probe imports (:mod:`sglang_fl_cuda.backend`): importing it
imports Triton and SGLang's kernel modules, so it is loaded only on a machine with a CUDA device
and never at plugin import. Each function forwards to SGLang's function of the same name.

sglang-fl routes these very functions: its ``AROUND`` hooks (SGLang's ``HookRegistry``) replace
them in their modules and in every module holding a ``from ... import`` binding. Calling the
module attribute from an adapter would therefore call the hook, which calls the adapter again.
:func:`unhooked` peels off the ``HookRegistry`` wrappers (and only those: SGLang's own
decorators stay), and this module keeps modules, not functions, so SGLang's patch propagation
finds no binding here to rebind.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import sglang.kernels.ops.attention.fla.chunk as _chunk
import sglang.kernels.ops.attention.fla.fused_norm_gate as _norm
import sglang.kernels.ops.attention.fla.fused_recurrent as _recurrent
import sglang.kernels.ops.attention.linear.fused_gdn_gating as _gating
import sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent as _sigmoid
import triton

__all__ = [
    "chunk_gated_delta_rule",
    "fused_gdn_gating",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gated_delta_rule_packed_decode",
    "fused_sigmoid_gating_delta_rule_update",
    "layer_norm_gated_fwd",
    "unhooked",
]

__version__ = f"SGLang's Triton kernels (triton {triton.__version__})"


def _hook_registry() -> ModuleType | None:
    try:
        return importlib.import_module("sglang.srt.plugins.hook_registry")
    except ImportError:  # an SGLang without plugin hooks: nothing can be hooked
        return None


_REGISTRY = _hook_registry()


def unhooked(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` without the ``HookRegistry`` wrappers around it.

    SGLang's ``_wrap_fn`` (``srt/plugins/hook_registry.py``) defines every wrapper in that
    module and sets ``__wrapped__`` to what it wraps; a function's ``__globals__`` is the dict
    of the module defining it, which ``functools.wraps`` does not copy, so it tells a hook
    wrapper from SGLang's own decorators (``torch.compiler.disable``, ``input_guard``).
    """
    if _REGISTRY is None:
        return fn
    hooks = vars(_REGISTRY)
    while getattr(fn, "__globals__", None) is hooks and hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def chunk_gated_delta_rule(*args: Any, **kwargs: Any) -> Any:
    """``sglang.kernels.ops.attention.fla.chunk.chunk_gated_delta_rule``."""
    return unhooked(_chunk.chunk_gated_delta_rule)(*args, **kwargs)


def fused_recurrent_gated_delta_rule(*args: Any, **kwargs: Any) -> Any:
    """``sglang.kernels.ops.attention.fla.fused_recurrent.fused_recurrent_gated_delta_rule``."""
    return unhooked(_recurrent.fused_recurrent_gated_delta_rule)(*args, **kwargs)


def fused_recurrent_gated_delta_rule_packed_decode(*args: Any, **kwargs: Any) -> Any:
    """``...fla.fused_recurrent.fused_recurrent_gated_delta_rule_packed_decode``."""
    return unhooked(_recurrent.fused_recurrent_gated_delta_rule_packed_decode)(*args, **kwargs)


def fused_sigmoid_gating_delta_rule_update(*args: Any, **kwargs: Any) -> Any:
    """``...linear.fused_sigmoid_gating_recurrent.fused_sigmoid_gating_delta_rule_update``."""
    return unhooked(_sigmoid.fused_sigmoid_gating_delta_rule_update)(*args, **kwargs)


def fused_gdn_gating(*args: Any, **kwargs: Any) -> Any:
    """``sglang.kernels.ops.attention.linear.fused_gdn_gating.fused_gdn_gating``."""
    return unhooked(_gating.fused_gdn_gating)(*args, **kwargs)


def layer_norm_gated_fwd(*args: Any, **kwargs: Any) -> Any:
    """``sglang.kernels.ops.attention.fla.fused_norm_gate.layer_norm_gated_fwd``: the launcher
    under ``FusedRMSNormGated.forward`` (the routed method), which can allocate its output."""
    return unhooked(_norm.layer_norm_gated_fwd)(*args, **kwargs)
