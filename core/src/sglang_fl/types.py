"""Everything a vendor plugin imports, in one module (``from sglang_fl.types import ...``).

The same names are exported by :mod:`sglang_fl` itself. Each is defined where core uses it and
gathered here, so a plugin author reads one page; the seed paths
(``sglang_fl.dispatch.types``, ``sglang_fl.dispatch.backends``, ``sglang_fl.dispatch.probes``)
give the same objects.

Registering kernels
    :class:`OpImpl`
        One implementation of one standard op: ``op_name``, a unique ``impl_id``, its ``kind``,
        the function (the op's standard signature, see :mod:`sglang_fl.ops`), the ``vendor``,
        a ``priority`` and an optional availability probe. Frozen; the loader stamps its
        :class:`Provenance`. Under ``torch.compile`` each runs behind its op's opaque custom op
        ``sglang_fl::<op>``, unless it declares ``traceable=True``: plain PyTorch that dynamo
        traces whole and inductor compiles to eager's numbers (elementwise maps and copies),
        then traced into the compiled step and fused with its neighbours.
    :class:`PreparedKernel`
        A kernel adapter with its weight-preparation step, for the quantized ops (those whose
        contract lists ``weights``): ``prepare(obj, *weights)`` runs once per layer at load and
        returns the layout the adapter wants; each call then receives it in the weights'
        places (``OpImpl.prepare``). Give it as a value of ``Backend.implementations``.
    :class:`BackendImplKind`
        The family of an implementation (``flagos``, ``vendor``, ``reference``). The default
        selection order ranks whole families, in this order; users reorder them by these names.
    :class:`BackendPriority`
        Default priorities per kind; a higher priority wins among candidates the order ranks
        equally (two vendors' kernels for one op, say).
    :class:`OpRegistry`
        What the ``sglang_fl_register_ops(registry)`` hook receives. ``register(impl)`` and
        ``register_many(impls)`` refuse, with a message saying why, an op without a contract,
        a signature the bridges cannot call, an ``impl_id`` owned by another distribution, or a
        call from another thread than the hook's or after loading ended (the registry is then
        sealed).
    :data:`hookimpl`
        The pluggy marker for a plugin's hook functions (``sglang_fl_register_ops``,
        ``sglang_fl_platform``, ``sglang_fl_communicator``, ``sglang_fl_attention_backend``,
        ``sglang_fl_graph_runner``; see :mod:`sglang_fl.hookspecs`).

Supplying collectives (``all_reduce``, ``send``, ...; see :mod:`sglang_fl.ops.collectives`)
    :class:`CollectiveGroup`
        What a collective implementation receives first, and what
        ``sglang_fl_communicator(group)`` receives to set up the vendor's library for one
        process group: its name, global ``ranks``, ``rank_in_group``, ``device``, the engine's
        ``device_group``, a gloo ``cpu_group`` (the plugin's own during set-up) and, at call
        time, ``communicator``: the handle the hook returned for that group. A hook that
        raises or hangs leaves the group on the reference collectives (an error under
        ``SGLANG_FL_STRICT=1``); the handle's ``close()`` is its teardown.
    :class:`ProcessGroupLibrary`
        A library behind a ``torch.distributed`` backend (NCCL, HCCL): its limits, each with
        its source, and the collective adapters built on them, which decline with
        ``Unsupported`` what the library cannot do before anything is sent.
    :class:`DtypeSet`
        The dtypes one kind of collective (data movement, reduction) takes on a library, with
        their source and, optionally, the ones only some devices take (read per call).
    :class:`UnevenCalls`
        A library's own uneven all-gather and reduce-scatter functions (torch_npu's), through
        which a :class:`ProcessGroupLibrary` serves ``all_gatherv``/``reduce_scatterv``.

Offering a whole SGLang attention backend (instead of, or besides, attention kernels)
    :class:`SglangAttentionBackendOffer`
        What ``sglang_fl_attention_backend()`` returns: a ``factory(model_runner)`` building the
        vendor's own SGLang ``AttentionBackend``, an optional availability probe, a priority
        and a one-line description. It competes with sglang-fl's kernel-based backend in the
        selection ``sglang_attention_backend`` (same policy as ops); a factory that raises
        leaves the model runner on the kernel-based backend, reported (an error under strict).

Planning attention once per forward (``decode_attention``, ``extend_attention``)
    :class:`DefaultPlanner`
        Plans a forward's batch (:class:`AttentionBatch`) into the :class:`AttentionPlan` the
        per-layer calls take (page table, lengths on the device and the host). An
        implementation gets it by default; a vendor subclasses it to add fields (FA3's
        scheduler metadata, Ascend's host length arrays) and passes it as ``OpImpl(...,
        planner=...)`` (or ``Backend.implementations(..., planner=...)``). Its
        ``graph_problem(mode)`` says which :class:`GraphMode` (``compiled``: torch.compile,
        ``captured``: CUDA/NPU graphs) cannot replay the implementation, and why; graph-mode
        plans are allocated once (``allocate``) and updated in place (``update``, ``record``).
    :class:`AttentionPlan`, :class:`AttentionBatch`, :class:`GraphMode`
        The default plan (subclass it for a vendor plan), the batch description a planner
        reads, and the graph modes.

Offering a decode graph runner (SGLang's ``get_graph_runner_cls``, on a platform sglang-fl
provides)
    :class:`SglangGraphRunnerOffer`
        What ``sglang_fl_graph_runner()`` returns: ``factory(model_runner)`` building the
        runner, the :class:`GraphMode` it replays with, an optional availability probe and a
        priority. It competes with sglang-fl's own runner in the selection
        ``sglang_graph_runner``; one that cannot be built leaves the next candidate serving,
        reported (an error under strict).

Describing a chip
    :class:`Backend`
        Base class of a chip backend: a ``name`` and ``is_available()``; its
        ``implementations({op: fn})`` builds the :class:`OpImpl` list probed by that one check.
    :class:`ChipSdk`
        The chip SDK module imported lazily, at most once per process, and the device count;
        every failure becomes an :class:`Availability` whose reason users see. Importing the SDK
        at plugin import time would break machines without the chip.
    :class:`Availability`
        A probe's answer with its reason (``sglang-fl explain`` prints it); falsy when
        unavailable, so a probe may also return a plain ``bool``.

At call time
    :class:`Unsupported`
        Raise it before writing anything to decline one call (a dtype or shape the kernel does
        not handle): the call goes to the next candidate. Any other exception propagates.

Reading decisions
    :class:`Provenance`
        Which plugin (entry-point name) and distribution version registered an implementation;
        shown by ``sglang-fl ops``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .dispatch.backends import Backend
from .dispatch.probes import ChipSdk
from .dispatch.types import (
    Availability,
    BackendImplKind,
    BackendPriority,
    OpImpl,
    PreparedKernel,
    Provenance,
)
from .errors import Unsupported
from .hookspecs import hookimpl

if TYPE_CHECKING:
    from .collective_library import DtypeSet, ProcessGroupLibrary, UnevenCalls
    from .dispatch.registry import OpRegistry
    from .ops.attention.plan import AttentionBatch, AttentionPlan, DefaultPlanner, GraphMode
    from .ops.attention.sglang_backend import SglangAttentionBackendOffer
    from .ops.collectives.group import CollectiveGroup
    from .ops.graph_runner import SglangGraphRunnerOffer

__all__ = [
    "AttentionBatch",
    "AttentionPlan",
    "Availability",
    "Backend",
    "BackendImplKind",
    "BackendPriority",
    "ChipSdk",
    "CollectiveGroup",
    "DefaultPlanner",
    "DtypeSet",
    "GraphMode",
    "OpImpl",
    "OpRegistry",
    "PreparedKernel",
    "ProcessGroupLibrary",
    "Provenance",
    "SglangAttentionBackendOffer",
    "SglangGraphRunnerOffer",
    "UnevenCalls",
    "Unsupported",
    "hookimpl",
]


_PLAN_NAMES = frozenset({"AttentionBatch", "AttentionPlan", "DefaultPlanner", "GraphMode"})


def __getattr__(name: str) -> Any:
    """``OpRegistry``, ``CollectiveGroup``, ``ProcessGroupLibrary`` (with ``DtypeSet`` and
    ``UnevenCalls``) and ``SglangAttentionBackendOffer`` on first use (also for
    :mod:`sglang_fl`, which re-exports this function).

    The registry imports the op contracts and with them torch, which ``import sglang_fl`` must
    not (the CLI's ``--help``, SGLang's plugin discovery).
    """
    if name == "OpRegistry":
        from .dispatch.registry import OpRegistry

        return OpRegistry
    if name == "CollectiveGroup":
        from .ops.collectives.group import CollectiveGroup

        return CollectiveGroup
    if name == "SglangAttentionBackendOffer":
        from .ops.attention.sglang_backend import SglangAttentionBackendOffer

        return SglangAttentionBackendOffer
    if name == "SglangGraphRunnerOffer":
        from .ops.graph_runner import SglangGraphRunnerOffer

        return SglangGraphRunnerOffer
    if name in _PLAN_NAMES:
        from .ops.attention import plan

        return getattr(plan, name)
    if name in ("ProcessGroupLibrary", "DtypeSet", "UnevenCalls"):
        from . import collective_library

        return getattr(collective_library, name)
    raise AttributeError(f"sglang_fl has no attribute {name!r}")
