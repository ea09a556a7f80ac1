"""The hooks a backend plugin implements, one docstring each: when it runs, what it returns.

A plugin is a module named by an entry point in the group ``sglang_fl.backends``; it marks its
functions with :data:`hookimpl`. Hooks run once per process (``sglang_fl_communicator``: once
per process group), never per tensor call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from .dispatch.registry import OpRegistry
    from .ops.attention.sglang_backend import SglangAttentionBackendOffer
    from .ops.collectives.group import CollectiveGroup
    from .ops.graph_runner import SglangGraphRunnerOffer

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


@hookspec(firstresult=True)
def sglang_fl_communicator(group: CollectiveGroup) -> object | None:
    """Set up this plugin's collective library for one process group; return its handle.

    Called in every rank of a group with more than one rank, once, when the engine creates
    the group (SGLang: each ``GroupCoordinator``, TP/PP/EP/...), and only for the plugin whose
    collective implementations (``all_reduce``, ...) serve that group. ``group`` carries the
    group's name, the global ``ranks``, this process's ``rank_in_group``, the ``device``, the
    engine's ``device_group`` (the platform's torch.distributed backend) and, as
    ``cpu_group``, a gloo group of the same ranks made for this set-up (the plugin's own, not
    the engine's): exchange the library's unique id over it (e.g.
    ``torch.distributed.broadcast_object_list(..., src=group.ranks[0], group=group.cpu_group)``)
    and create the communicator. The returned object reaches the
    implementations as ``group.communicator``. Return ``None`` when the library needs no
    per-group state.

    Teardown: if the handle has a ``close()`` method, it is called once per handle (a handle
    returned for several groups is closed when the last of them goes), in the process that
    opened it, bounded by ``SGLANG_FL_PLUGIN_TIMEOUT`` (one that raises or does not return is
    reported and abandoned): when the engine destroys the group, when SGLang ends a scheduler
    gracefully (a server's SIGTERM, ``Engine.shutdown()``), and at interpreter exit. A forked
    child never closes its parent's handles. A process killed outright (SIGKILL, a crash)
    runs no ``close()``: do not rely on it for anything outside the process.

    Failure path: if this hook raises or does not return within ``SGLANG_FL_PLUGIN_TIMEOUT``
    seconds on any rank, every rank of the group keeps the reference collectives
    (``torch.distributed`` on the engine's device group) for that group, and the dispatch
    report records a ``fallback`` naming the plugin, the group and why. Under
    ``SGLANG_FL_STRICT=1`` it is a :class:`~sglang_fl.errors.StrictModeError` instead. The
    ranks agree on the outcome, and before it on which implementation serves each collective,
    so they never mix libraries; a call your collectives decline (``Unsupported``) on some
    ranks only stops the declining rank with
    :class:`~sglang_fl.errors.CollectiveDivergenceError`: decline only on what every rank sees
    alike.
    """


@hookspec
def sglang_fl_attention_backend() -> SglangAttentionBackendOffer | None:
    """SGLang only: offer this plugin's whole SGLang attention backend, or ``None``.

    Called once per process, each plugin alone and bounded by ``SGLANG_FL_PLUGIN_TIMEOUT``,
    when SGLang builds its first ``sglang_fl`` attention backend (``--attention-backend
    sglang_fl``, the default on sglang-fl's CPU platform) and when ``sglang-fl ops``/``explain``
    list the candidates. Return a :class:`~sglang_fl.types.SglangAttentionBackendOffer` (its
    factory builds the backend later, per model runner), not the backend itself. The offers and
    sglang-fl's kernel-based backend (``reference.sglang_fl_attention``) are the candidates of
    the selection ``sglang_attention_backend``, chosen by the policy like an op's
    implementations. The offer is checked as an ``OpImpl`` registration is (a callable
    factory, an ``int`` priority, a bool or probe as ``available``). A hook that raises, hangs
    or returns something else, or an offer that fails a check, is skipped and reported, the
    other offers kept (an error under ``SGLANG_FL_STRICT=1``). The factory is bounded like a
    hook.
    """


@hookspec
def sglang_fl_graph_runner() -> SglangGraphRunnerOffer | None:
    """SGLang only: offer this plugin's decode graph runner, or ``None``.

    Called once per process, each plugin alone and bounded by ``SGLANG_FL_PLUGIN_TIMEOUT``,
    when SGLang asks a platform sglang-fl provides for its graph runner
    (``get_graph_runner_cls()``: ``--enable-torch-compile`` on the CPU, device graphs on a
    vendor's platform) and when ``sglang-fl ops``/``explain`` list the candidates. Return a
    :class:`~sglang_fl.types.SglangGraphRunnerOffer` (its factory builds the runner later, per
    model runner), not the runner. The offers and sglang-fl's own runner for the platform
    (``reference.sglang_graph_runner``) are the candidates of the selection
    ``sglang_graph_runner``, chosen by the policy like an op's implementations. A hook that
    raises, hangs or returns something else is skipped and reported (an error under
    ``SGLANG_FL_STRICT=1``).
    """
