"""The hooks a backend plugin implements, one docstring each: when it runs, what it returns.

A plugin is a module named by an entry point in the group ``sglang_fl.backends``; it marks its
functions with :data:`hookimpl`. Hooks run once per process, at load time; nothing here runs
per tensor call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from .dispatch.registry import OpRegistry

PROJECT_NAME = "sglang_fl"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def sglang_fl_register_ops(registry: OpRegistry) -> None:
    """Add this plugin's operator implementations to ``registry``.

    Called once per process, when sglang-fl loads its plugins (first ``get_runtime()``, the
    SGLang plugin hook, or a CLI command), after the built-in reference backend registered. Call
    ``registry.register(OpImpl(...))`` or ``registry.register_many([...])``. Availability is
    not decided here: attach a probe instead (``fn._is_available``) so no SDK is imported at
    load time. If this hook raises, does not return within ``SGLANG_FL_PLUGIN_TIMEOUT``
    seconds, or any registration is refused, none of this plugin's registrations are kept and
    the plugin is reported as failed. Register from this function's own thread, while it runs:
    the registry refuses other threads and, once loading ended, everyone. Do not call
    ``sglang_fl.get_runtime()`` here (it raises: the runtime is what is being loaded).
    Returns nothing.
    """


@hookspec(firstresult=True)
def sglang_fl_platform() -> str | None:
    """The dotted path of the SGLang platform class this plugin's chip needs, or ``None``.

    Called when SGLang asks its ``sglang.srt.platforms`` entry points which platform to
    activate, after plugins are loaded. Return a path such as ``"my_chip.platform:MyPlatform"``
    only when SGLang has no in-tree platform for the chip and the chip is present; otherwise
    return ``None``. The first non-``None`` result wins.
    """
