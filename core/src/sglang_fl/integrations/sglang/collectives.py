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
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch

from ...communicators import (
    HOOK,
    CloseOutcome,
    CommunicatorOutcome,
    DeclineCheck,
    agree_on_collectives,
    close_all,
    close_communicator,
    open_communicator,
    plugin_of,
    report_closes_at_exit,
)
from ...dispatch.binder import FallbackChain
from ...dispatch.types import BackendImplKind, OpImpl
from ...dispatch_report import CommunicatorState, DispatchReport, ReportEvent, Runner
from ...errors import NoImplementationError, Unsupported
from ...ops import STANDARD_OPS
from ...ops.collectives import CollectiveGroup
from ...runtime import Runtime
from ...schema import impl_fields
from . import compat, tensor_dicts
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
# SGLang's graceful end of a scheduler, and the offline engine's shutdown.
ABORT_TARGET = "sglang.srt.distributed.parallel_state.abort_distributed_environment"
ENGINE_SHUTDOWN_TARGET = "sglang.srt.entrypoints.engine.Engine.shutdown"
# Beyond the communicators' own bound: how long schedulers get to leave their event loop
# (SGLang's server waits 15 s after its ShutdownReq).
SCHEDULER_EXIT_S = 15.0
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
        """Agree, set up communicators, bind: the same steps in the same order on every rank
        of the group (the agreement and the communicator set-up are CPU-group collectives)."""
        group = self.group_of(coordinator)
        agreed = agree_on_collectives(self.runtime, group, METHODS)
        chosen = [c.chosen for c in agreed.values() if c.chosen is not None]
        plugins = sorted({p for p in map(plugin_of, chosen) if p is not None})
        outcomes: dict[str, CommunicatorOutcome] = {
            plugin: open_communicator(self.runtime, plugin, group) for plugin in plugins
        }
        # A decline must be every rank's before the next candidate runs it; made by every
        # rank together, and only where some chain has a next candidate.
        check = None
        if any(len(c.chain) > 1 for c in agreed.values()) and not self.runtime.config.strict:
            check = DeclineCheck(group, self.runtime.config.plugin_timeout)
        # op -> what serves it, and what it replaces and why (a fallback)
        routed: dict[str, tuple[OpImpl, OpImpl | None, str | None]] = {}
        for op, choice in agreed.items():
            impl = choice.chosen
            if impl is None:
                self._emit_sglang(coordinator, group, op, choice.problem or "", choice.local)
                continue
            plugin = plugin_of(impl)
            outcome = outcomes.get(plugin) if plugin else None
            if outcome is not None and not outcome.ok:
                reference = _reference_impl(self.runtime, op)
                self._bind(coordinator, group, op, reference.fn)
                routed[op] = reference, impl, outcome.problem
                continue
            if impl.kind is BackendImplKind.REFERENCE and group.device.type != "cpu":
                reason = (
                    "only the reference serves this collective here; SGLang's own method "
                    "(pynccl, custom all-reduce) is the faster path, kept"
                )
                self._emit_sglang(coordinator, group, op, reason, None)
                continue
            bound_group = group
            if outcome is not None and outcome.communicator is not None:
                bound_group = dataclasses.replace(group, communicator=outcome.communicator)
            self._bind(coordinator, bound_group, op, self._chain(op, choice.chain, check).fn)
            replaced = None if choice.problem is None else choice.local
            routed[op] = impl, replaced, choice.problem
        also = self._bind_tensor_dicts(coordinator, group, routed)
        for op, (impl, _, _) in routed.items():  # a graph runner asks what each one declares
            self.runtime.bound(op, impl)
        for op, (impl, replaced, why) in routed.items():
            self._emit(
                group, op, impl, also_serves=also.get(op, []), fallback_from=replaced, reason=why
            )
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

    def _chain(
        self, op: str, chain: tuple[OpImpl, ...], check: DeclineCheck | None
    ) -> FallbackChain:
        """The agreed candidates bound: a decline is confirmed by every rank (``check``)
        before the next candidate runs it, and reported once per reason."""
        confirm = None
        if check is not None and len(chain) > 1:

            def confirm(index: int, exc: Unsupported) -> None:
                check.confirm(op, chain[index].impl_id, index, exc)

        return FallbackChain(
            op,
            chain,
            strict=self.runtime.config.strict,
            on_decline=self.report.report_decline,
            before_next=confirm,
        )

    def _rejected(self, op: str) -> dict[str, Any]:
        """For the first record of ``op`` in this process, the candidates that never run here
        and why (:meth:`DispatchReport.rejected_once`)."""
        try:
            return self.report.rejected_once(self.runtime.resolve(op).decision)
        except NoImplementationError as exc:
            return self.report.rejected_once(exc.decision)

    def _bind(self, coordinator: Any, group: CollectiveGroup, op: str, fn: Any) -> None:
        sglang = getattr(coordinator, METHODS[op])
        setattr(coordinator, METHODS[op], _bridge(op, fn, group, sglang))

    def _hook_destroy(self, coordinator: Any, outcomes: list[CommunicatorOutcome]) -> None:
        """Teardown: the communicators close when SGLang destroys the group, before its
        process groups go (each ``close()`` bounded, reported)."""
        opened = [o for o in outcomes if o.communicator is not None]
        for outcome in opened:
            self._emit_communicator(outcome.plugin, outcome.group, CommunicatorState.OPEN)
        if not opened:
            return
        # A group still open at interpreter exit is closed then: its record says how, too.
        report_closes_at_exit(self.report_close)
        sglang_destroy = coordinator.destroy

        def destroy() -> None:
            for outcome in opened:
                self.report_close(
                    close_communicator(outcome.plugin, outcome.group, outcome.communicator)
                )
            sglang_destroy()

        coordinator.destroy = destroy

    def close_all(self) -> None:
        """Close every communicator still open here: SGLang's graceful shutdown of a scheduler
        (before ``abort_distributed_environment`` takes its process groups away)."""
        for closed in close_all():
            self.report_close(closed)

    def report_close(self, closed: CloseOutcome) -> None:
        if closed.problem is not None:
            state = CommunicatorState.CLOSE_FAILED
        elif closed.closed:
            state = CommunicatorState.CLOSED
        else:
            state = CommunicatorState.RELEASED
        self._emit_communicator(closed.plugin, closed.group, state, closed.problem)

    def _emit_communicator(
        self,
        plugin: str,
        group: CollectiveGroup,
        state: CommunicatorState,
        problem: str | None = None,
    ) -> None:
        self.report.emit(
            ReportEvent.COMMUNICATOR,
            plugin=plugin,
            group=group.name,
            ranks=list(group.ranks),
            rank_in_group=group.rank_in_group,
            state=state,
            problem=problem,
        )

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
        fields.update(self._rejected(op))
        if fallback_from is not None:
            fields.update(fallback_from=fallback_from.impl_id, fallback_reason=reason)
        self.report.emit(ReportEvent.COLLECTIVE, **fields)

    def _emit_sglang(
        self,
        coordinator: Any,
        group: CollectiveGroup,
        op: str,
        reason: str,
        local: OpImpl | None,
    ) -> None:
        """SGLang's own method serves ``op``; ``local`` is what this rank would have run."""
        fields = self._base_fields(group, op)
        fields.update(runner=Runner.SGLANG, impl_id=None, reason=reason, **self._rejected(op))
        if local is not None:
            fields.update(fallback_from=local.impl_id, fallback_reason=reason)
        self.report.emit(ReportEvent.COLLECTIVE, **fields)


def _reference_impl(runtime: Runtime, op: str) -> OpImpl:
    for impl in runtime.registry.implementations(op):
        if impl.kind is BackendImplKind.REFERENCE:
            return impl
    raise NoImplementationError(f"op {op!r} has no reference implementation registered")


def route_collectives(api: SglangApi, runtime: Runtime, report: DispatchReport) -> CollectiveRouter:
    """Register the ``GroupCoordinator.__init__`` hook (from :func:`plugin.register`) and the
    shutdown hooks that make communicators close on SGLang's graceful shutdown path."""
    router = CollectiveRouter(runtime, report)
    hook_type = type(api.hook_type_around)  # HookType is an Enum
    api.hook_registry.register(GROUP_INIT_TARGET, router.after_init, hook_type.AFTER)
    _hook_shutdown(api, runtime, router)
    return router


def _hook_shutdown(api: SglangApi, runtime: Runtime, router: CollectiveRouter) -> None:
    """Where SGLang ends a scheduler gracefully, close the communicators first.

    SGLang 0.5.23's graceful path (a server's SIGTERM; a ``ShutdownReq``) ends each
    scheduler's event loop and calls ``abort_distributed_environment()``: a ``BEFORE`` hook
    there closes every communicator still open while the process groups still work.
    ``Engine.shutdown()`` itself SIGKILLs the schedulers, so nothing of theirs runs: when a
    loaded plugin can open communicators, an ``AROUND`` hook on it first asks the schedulers
    to exit gracefully (SGLang's own ``ShutdownReq``, as its server does), waits for them a
    bounded time, then lets SGLang's shutdown kill what is left. Without such a plugin,
    SGLang's shutdown is untouched. Each hook is registered only where its target exists.
    """
    hook_type = type(api.hook_type_around)
    if compat.find_attribute(ABORT_TARGET) is not None:

        def close_first(*args: Any, **kwargs: Any) -> None:
            router.close_all()
            return None

        api.hook_registry.register(ABORT_TARGET, close_first, hook_type.BEFORE)
    hook = getattr(runtime.plugin_manager.hook, HOOK, None)
    if hook is None or not hook.get_hookimpls():
        return
    if "sglang.srt.entrypoints.engine" not in sys.modules:  # not the engine's own process
        return
    if compat.find_attribute(ENGINE_SHUTDOWN_TARGET) is None:
        return
    timeout = runtime.config.plugin_timeout + SCHEDULER_EXIT_S

    def graceful_first(original: Callable[..., Any], engine: Any, *args: Any, **kwargs: Any) -> Any:
        compat.ask_schedulers_to_exit(engine, timeout)
        return original(engine, *args, **kwargs)

    api.hook_registry.register(ENGINE_SHUTDOWN_TARGET, graceful_first, hook_type.AROUND)
