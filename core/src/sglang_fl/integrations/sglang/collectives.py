"""SGLang's ``GroupCoordinator`` collectives served by the implementations sglang-fl binds.

One ``AFTER`` hook on ``GroupCoordinator.__init__`` (SGLang's ``HookRegistry``, applied in
every process that loads the plugin, so in every scheduler worker): when a group of more than
one rank has been built, sglang-fl resolves each collective op once, sets up the chosen
vendor's communicator for the group (:mod:`sglang_fl.communicators`) and binds, as instance
attributes of that one coordinator, methods that call the chosen implementations with a
:class:`~sglang_fl.ops.collectives.CollectiveGroup`. A group of one rank is left alone: its
methods are SGLang's own function objects, nothing is added to a call. Nothing is hooked per
call: the class keeps SGLang's methods, only routed groups' instances shadow them.

When ``send`` and ``recv`` are both routed, ``send_tensor_dict``/``recv_tensor_dict`` (the
pipeline's activations) are bound too: their tensors through the routed pair, their metadata
through SGLang's own ``send_object``/``recv_object`` (:mod:`.tensor_dicts`).

Left to SGLang: everything on the gloo CPU group (``broadcast_object``, ``all_gather_object``,
``send_object``/``recv_object``, ``barrier``, the tensor dicts' metadata),
``broadcast_tensor_dict`` and ``send_recv_tensor_dict`` (see ``docs/architecture.md``), and,
where the chosen implementation is the reference on a non-CPU device, SGLang's own method
(its pynccl and custom all-reduce paths beat ``torch.distributed``).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

from ...communicators import CommunicatorOutcome, close_communicator, open_communicator
from ...dispatch.types import BackendImplKind, OpImpl
from ...dispatch_report import DispatchReport, ReportEvent, Runner
from ...errors import NoImplementationError
from ...ops import STANDARD_OPS
from ...ops.collectives import CollectiveGroup
from ...runtime import Runtime
from ...schema import impl_fields
from . import tensor_dicts
from .compat import SglangApi

__all__ = [
    "GROUP_INIT_TARGET",
    "METHODS",
    "TENSOR_DICTS",
    "CollectiveRouter",
    "route_collectives",
]

_log = logging.getLogger("sglang_fl.integrations.sglang")

GROUP_CLASS = "sglang.srt.distributed.parallel_state.GroupCoordinator"
GROUP_INIT_TARGET = f"{GROUP_CLASS}.__init__"
# Collective op -> the GroupCoordinator method it stands for (same name, same parameters
# after ``self``; all_gather's ``output_tensor_list`` form stays SGLang's).
METHODS: dict[str, str] = {
    name: name for name, contract in STANDARD_OPS.items() if contract.collective is not None
}

# The tensor-dict methods routed over the routed point-to-point op -> that op.
TENSOR_DICTS: dict[str, str] = {"send_tensor_dict": "send", "recv_tensor_dict": "recv"}


def _bridge(op: str, fn: Callable[..., Any], group: CollectiveGroup, sglang: Any) -> Any:
    """The bound method a routed coordinator gets for ``op``: one call, ``group`` first."""
    if op == "all_gather":

        def all_gather(input_: Any, dim: int = -1, output_tensor_list: Any = None) -> Any:
            if output_tensor_list is not None:  # the list form: not in the contract
                return sglang(input_, dim, output_tensor_list)
            return fn(group, input_, dim)

        return all_gather

    def routed(*args: Any, **kwargs: Any) -> Any:
        return fn(group, *args, **kwargs)

    routed.__name__ = routed.__qualname__ = op
    return routed


class CollectiveRouter:
    """Binds the collectives of every multi-rank group this process creates."""

    def __init__(self, runtime: Runtime, report: DispatchReport) -> None:
        self.runtime = runtime
        self.report = report
        self._lock = threading.Lock()

    # --- the hook -----------------------------------------------------------------------

    def after_init(self, result: Any, coordinator: Any, *args: Any, **kwargs: Any) -> None:
        """AFTER hook on ``GroupCoordinator.__init__``: runs once per group and process."""
        if getattr(coordinator, "world_size", 1) <= 1:
            return None
        with self._lock:
            self.route(coordinator)
        return None

    # --- binding ------------------------------------------------------------------------

    def group_of(self, coordinator: Any) -> CollectiveGroup:
        return CollectiveGroup(
            name=str(coordinator.unique_name),
            ranks=tuple(int(r) for r in coordinator.ranks),
            rank_in_group=int(coordinator.rank_in_group),
            device=torch.device(coordinator.device),
            device_group=coordinator.device_group,
            cpu_group=coordinator.cpu_group,
        )

    def route(self, coordinator: Any) -> None:
        """Resolve, set up communicators, bind: the same steps in the same order on every
        rank of the group (the communicator set-up is itself a CPU-group collective)."""
        group = self.group_of(coordinator)
        chosen: dict[str, OpImpl] = {}
        for op in METHODS:
            try:
                chosen[op] = self.runtime.resolve(op).decision.chosen
            except NoImplementationError as exc:
                if self.runtime.config.strict:
                    raise
                rejected = self.report.rejected_once(exc.decision)
                self._emit_sglang(coordinator, group, op, f"{exc}; left to SGLang", **rejected)
        plugins = sorted({p for p in map(_vendor_plugin, chosen.values()) if p is not None})
        outcomes: dict[str, CommunicatorOutcome] = {
            plugin: open_communicator(self.runtime, plugin, group) for plugin in plugins
        }
        routed: dict[str, tuple[OpImpl, dict[str, Any]]] = {}  # op -> what serves it
        for op, impl in chosen.items():
            plugin = _vendor_plugin(impl)
            outcome = outcomes.get(plugin) if plugin else None
            if outcome is not None and not outcome.ok:
                reference = _reference_impl(self.runtime, op)
                self._bind(coordinator, group, op, reference, reference.fn)
                routed[op] = reference, {"fallback_from": impl, "reason": outcome.problem}
                continue
            if impl.kind is BackendImplKind.REFERENCE and group.device.type != "cpu":
                reason = (
                    "only the reference serves this collective here; SGLang's own method "
                    "(pynccl, custom all-reduce) is the faster path, kept"
                )
                rejected = self.report.rejected_once(self.runtime.resolve(op).decision)
                self._emit_sglang(coordinator, group, op, reason, **rejected)
                continue
            bound_group = group
            if outcome is not None and outcome.communicator is not None:
                bound_group = dataclasses.replace(group, communicator=outcome.communicator)
            self._bind(coordinator, bound_group, op, impl, self.runtime.resolve(op).fn)
            routed[op] = impl, {}
        also = self._bind_tensor_dicts(coordinator, group, routed)
        for op, (impl, extra) in routed.items():
            self._emit(group, op, impl, also_serves=also.get(op, []), **extra)
        self._hook_destroy(coordinator, [o for o in outcomes.values() if o.ok])

    def _bind_tensor_dicts(
        self, coordinator: Any, group: CollectiveGroup, routed: dict[str, Any]
    ) -> dict[str, list[str]]:
        """Pipeline activations (``send_tensor_dict``/``recv_tensor_dict``) over the routed
        ``send``/``recv``, when both are routed (one library on both ends of a pair)."""
        if not {"send", "recv"} <= routed.keys():
            return {}
        device = group.device.type
        coordinator.send_tensor_dict = tensor_dicts.send_tensor_dict(
            coordinator, coordinator.send, device
        )
        coordinator.recv_tensor_dict = tensor_dicts.recv_tensor_dict(
            coordinator, coordinator.recv, device
        )
        return {op: [f"GroupCoordinator.{method}"] for method, op in TENSOR_DICTS.items()}

    def _bind(
        self, coordinator: Any, group: CollectiveGroup, op: str, impl: OpImpl, fn: Any
    ) -> None:
        sglang = getattr(coordinator, METHODS[op])
        setattr(coordinator, METHODS[op], _bridge(op, fn, group, sglang))

    def _hook_destroy(self, coordinator: Any, outcomes: list[CommunicatorOutcome]) -> None:
        """Teardown: the communicators close when SGLang destroys the group, before its
        process groups go."""
        if not any(o.communicator is not None for o in outcomes):
            return
        sglang_destroy = coordinator.destroy

        def destroy() -> None:
            for outcome in outcomes:
                close_communicator(outcome.plugin, outcome.group, outcome.communicator)
            sglang_destroy()

        coordinator.destroy = destroy

    # --- the report ---------------------------------------------------------------------

    def _base_fields(self, group: CollectiveGroup, op: str) -> dict[str, Any]:
        return {
            "op": op,
            "group": group.name,
            "ranks": list(group.ranks),
            "rank_in_group": group.rank_in_group,
            "world_size": group.world_size,
            "device": str(group.device),
            "sglang_method": f"GroupCoordinator.{METHODS[op]}",
        }

    def _emit(
        self,
        group: CollectiveGroup,
        op: str,
        impl: OpImpl,
        *,
        fallback_from: OpImpl | None = None,
        reason: str | None = None,
        also_serves: list[str],
    ) -> None:
        fields = self._base_fields(group, op)
        fields.update(runner=Runner.SGLANG_FL, also_serves=also_serves, **impl_fields(impl))
        fields.update(self.report.rejected_once(self.runtime.resolve(op).decision))
        if fallback_from is not None:
            fields.update(fallback_from=fallback_from.impl_id, fallback_reason=reason)
        self.report.emit(ReportEvent.COLLECTIVE, **fields)

    def _emit_sglang(
        self, coordinator: Any, group: CollectiveGroup, op: str, reason: str, **rejected: Any
    ) -> None:
        fields = self._base_fields(group, op)
        fields.update(runner=Runner.SGLANG, impl_id=None, reason=reason, **rejected)
        self.report.emit(ReportEvent.COLLECTIVE, **fields)


def _vendor_plugin(impl: OpImpl) -> str | None:
    """The plugin whose communicator an implementation needs (``None``: the reference)."""
    if impl.kind is BackendImplKind.REFERENCE or impl.provenance is None:
        return None
    return impl.provenance.plugin


def _reference_impl(runtime: Runtime, op: str) -> OpImpl:
    for impl in runtime.registry.implementations(op):
        if impl.kind is BackendImplKind.REFERENCE:
            return impl
    raise NoImplementationError(f"op {op!r} has no reference implementation registered")


def route_collectives(api: SglangApi, runtime: Runtime, report: DispatchReport) -> CollectiveRouter:
    """Register the ``GroupCoordinator.__init__`` hook (from :func:`plugin.register`)."""
    router = CollectiveRouter(runtime, report)
    after = type(api.hook_type_around).AFTER  # HookType is an Enum
    api.hook_registry.register(GROUP_INIT_TARGET, router.after_init, after)
    return router
