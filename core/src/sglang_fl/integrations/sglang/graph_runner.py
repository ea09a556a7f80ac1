"""SGLang's decode graph runner on the platforms sglang-fl provides: which one, and what it did.

Which runner serves is a policy selection (:data:`~.backend_selection.GRAPH_RUNNER`): the
platform's own runner (on sglang-fl's CPU platform, :class:`CpuGraphRunner` below) and one
candidate per plugin whose ``sglang_fl_graph_runner`` hook offers one, chosen by ``prefer``,
``per_op`` (key ``sglang_graph_runner``), the vendor lists and availability like an op's
implementations. :func:`selected_graph_runner` is the class the platform names; SGLang builds
it per model runner, which walks the decision's chain: a vendor offer whose graph mode the
attention backend refuses, or whose factory raises, is reported (``fallback``) and the next
candidate is built; under ``SGLANG_FL_STRICT=1`` that is an error naming the vendor. The
factories run in the engine's own thread, not time-bounded: a runner captures every batch
size as it is built. One ``graph_runner`` record per model runner says which served and why.

An out-of-tree platform must name its graph runner (``get_graph_runner_cls()``; SGLang stops
with "provides no CUDA graph runner" otherwise). On the CPU, ``--enable-torch-compile`` means
SGLang's ``CPUGraphRunner`` (``model_executor/cpu_graph_runner.py``): one ``torch.compile``'d
decode step per batch size, each compiled at start-up. :class:`CpuGraphRunner` is that runner
with what sglang-fl's platform needs:

- SGLang's ``CPUGraphRunner.__init__`` registers fake implementations for ~40
  ``sgl_kernel::*_cpu`` operators, which do not exist without a CPU build of ``sgl_kernel``
  (``torch.library.register_fake`` then raises). While it runs, the registration skips the
  operators that do not exist, as SGLang's own ``register_fake_if_exists`` does
  (``utils/patch_torch.py``); the ones that exist are registered as before.
- SGLang's residual stream builds two ``msgspec.Struct`` objects per layer and step, which
  dynamo cannot construct (a graph break each, and a recompile per layer after them): they are
  rebound to plain classes first (:mod:`.traceable`), reported on the ``graph_capture``
  record (``sglang_traceable``).
- Before anything is captured the attention backend is asked whether its kernels can run
  compiled (:data:`~sglang_fl.ops.attention.plan.GraphMode.COMPILED`); a refusal stops the
  start-up with the reason.
- The capture runs under a :class:`~sglang_fl.graph_watch.DynamoWatch`: one ``graph_capture``
  record in the dispatch report gives the batch sizes, the time, the graphs compiled, every
  graph break and recompile with whose code it was in, and the ``sglang_fl::<op>`` custom ops
  the compiled steps called (eager code never calls one: these are the routed ops inside the
  compiled graphs), and the routed ops whose traceable implementations
  (:attr:`~sglang_fl.dispatch.types.OpImpl.traceable`, the references of the elementwise ops
  and the KV store) dynamo traced into the graphs instead (``traced_ops``), compiled with
  inductor's ``emulate_precision_casts`` so that they round as they do eagerly. A later step
  that recompiles (a guard failed at replay) is reported once per reason (``graph_replay``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from ...dispatch.resolve import CandidateOutcome
from ...dispatch_report import DispatchReport, ReportEvent, Runner
from ...errors import GraphModeRefused, NoImplementationError, StrictModeError
from ...graph import compiled_calls, traced_ops
from ...graph_watch import CompileSummary, DynamoWatch, Owner, RecompileCheck
from ...guard import describe_exception
from ...ops.attention.plan import GraphMode
from ...runtime import Runtime, get_runtime
from ...schema import impl_fields
from .backend_selection import GRAPH_RUNNER, cached_select, graph_problem
from .router import get_router
from .traceable import make_traceable

__all__ = ["build_graph_runner", "cpu_graph_runner_class", "selected_graph_runner"]

_log = logging.getLogger("sglang_fl.integrations.sglang")


@contextlib.contextmanager
def _existing_sgl_kernel_fakes() -> Iterator[None]:
    """While SGLang's CPU graph runner registers its fakes: only for ``sgl_kernel`` operators
    that exist (SGLang's ``register_fake_if_exists`` rule), the others skipped."""
    import torch
    from sglang.srt.model_executor import cpu_graph_runner

    original = cpu_graph_runner.register_cpu_compile_fake

    def register_if_exists(op_name: str) -> Callable[[Callable[..., Any]], Any]:
        namespace = getattr(torch.ops, "sgl_kernel", None)
        if namespace is not None and hasattr(namespace, op_name):
            register: Callable[[Callable[..., Any]], Any] = original(op_name)
            return register
        return lambda fake: fake

    cpu_graph_runner.register_cpu_compile_fake = register_if_exists
    try:
        yield
    finally:
        cpu_graph_runner.register_cpu_compile_fake = original


@contextlib.contextmanager
def _noting_traced_ops(traced: set[str]) -> Iterator[None]:
    """While SGLang compiles its steps: into ``traced``, the routed ops whose traceable
    implementations dynamo traced into a graph (inductor's pre-grad hook, which sees each
    graph in its tracing context, reads the code dynamo traced)."""
    import torch._inductor.config as inductor_config
    from torch._guards import TracingContext

    def note(graph: Any) -> None:
        traced.update(traced_ops(TracingContext.get_traced_code() or ()))

    settings: dict[str, Any] = {"pre_grad_custom_pass": note}
    if hasattr(inductor_config, "pre_grad_pass_timing"):  # torch >= 2.14
        # Early: before the graph cache's lookup, so a cached graph is noted too (a pass run
        # late would need a cache key, and would not run on a hit).
        settings["pre_grad_pass_timing"] = "early"
    with inductor_config.patch(**settings):
        yield


def _report(event: ReportEvent, **fields: Any) -> None:
    router = get_router()
    if router is not None:
        router.report.emit(event, **fields)


Factory = Callable[..., Any]


def selected_graph_runner(build_reference: Factory) -> type:
    """The class a platform sglang-fl provides returns from ``get_graph_runner_cls()``: built
    as SGLang builds a runner (``cls(model_runner, **options)``), it is the policy's choice
    between ``build_reference`` (the platform's own runner) and the plugins' offers."""

    class SelectedGraphRunner:
        """SGLang's decode graph runner as the policy selects it (``graph_runner`` record)."""

        def __new__(cls, model_runner: Any, **options: Any) -> Any:
            router = get_router()
            runtime = router.runtime if router is not None else get_runtime()
            report = router.report if router is not None else None
            return build_graph_runner(runtime, report, model_runner, build_reference, **options)

    return SelectedGraphRunner


def build_graph_runner(
    runtime: Runtime,
    report: DispatchReport | None,
    model_runner: Any,
    build_reference: Factory,
    **options: Any,
) -> Any:
    """The runner of ``model_runner``: the chosen candidate, else the next that builds; one
    ``graph_runner`` record in ``report`` says which and why."""
    strict = runtime.config.strict
    emit = report.emit if report is not None else _discard
    reference = GRAPH_RUNNER.reference(build_reference)
    try:
        resolution = cached_select(runtime, build_reference, GRAPH_RUNNER)
    except NoImplementationError as exc:
        if strict:
            raise
        return _served(emit, reference, reference.fn(model_runner, **options), f"{exc}", [])
    chain = list(resolution.chain)
    if chain[-1].impl_id != reference.impl_id:  # strict trimmed it, or the policy denied it
        chain.append(reference)
    reason = next(
        c.reason for c in resolution.decision.candidates if c.outcome is CandidateOutcome.CHOSEN
    )
    failed: list[str] = []
    for index, impl in enumerate(chain):
        if impl.impl_id == reference.impl_id:  # the platform's own: its errors are the engine's
            return _served(emit, impl, impl.fn(model_runner, **options), reason, failed)
        try:
            runner = impl.fn(model_runner, **options)
        except Exception as exc:
            problem = describe_exception(exc)
            message = f"vendor {impl.vendor!r}: graph runner {impl.impl_id}: {problem}"
            if strict:
                raise StrictModeError(
                    f"SGLANG_FL_STRICT=1: {message}; without strict mode the next candidate "
                    "would serve"
                ) from exc
            following = chain[index + 1]
            _log.warning("sglang-fl: %s; %s serves", message, following.impl_id)
            emit(
                ReportEvent.FALLBACK,
                op=GRAPH_RUNNER.name,
                impl_id=impl.impl_id,
                next_impl_id=following.impl_id,
                reason=problem,
                runner=Runner.SGLANG_FL,
            )
            failed.append(impl.impl_id)
            reason = f"{impl.impl_id} failed to build ({problem}); next in the decision"
            continue
        return _served(emit, impl, runner, reason, failed)
    raise AssertionError("the chain always ends with the platform's own runner")


def _discard(event: ReportEvent, **fields: Any) -> None:
    """No report (a runner built outside a process SGLang loaded the plugin in)."""


def _served(
    emit: Callable[..., Any], impl: Any, runner: Any, reason: str, failed: list[str]
) -> Any:
    cls = type(runner)
    emit(
        ReportEvent.GRAPH_RUNNER,
        op=GRAPH_RUNNER.name,
        runner=Runner.SGLANG_FL,
        **impl_fields(impl),
        graph_runner=f"{cls.__module__}.{cls.__qualname__}",
        reason=reason,
        failed=failed,
    )
    return runner


_cls: type | None = None


def cpu_graph_runner_class() -> type:
    """:class:`CpuGraphRunner`, made on first use (it subclasses SGLang's, imported then)."""
    global _cls
    if _cls is None:
        _cls = _make_cpu_graph_runner()
    return _cls


def _make_cpu_graph_runner() -> type:
    from sglang.srt.model_executor.cpu_graph_runner import CPUGraphRunner

    class CpuGraphRunner(CPUGraphRunner):
        """SGLang's CPU graph runner on sglang-fl's platform (see the module doc)."""

        def __init__(self, model_runner: Any) -> None:
            problem = graph_problem(model_runner.attn_backend, GraphMode.COMPILED)
            if problem is not None:
                raise GraphModeRefused(
                    f"sglang-fl refuses SGLang's CPU graph runner (--enable-torch-compile) "
                    f"before capture: {problem}; start without --enable-torch-compile"
                )
            rebound = make_traceable()
            # Traced implementations (OpImpl.traceable) round in the compiled steps as they
            # do eagerly: inductor keeps eager's casts to the narrow dtype between fused ops.
            import torch._inductor.config as inductor_config

            inductor_config.emulate_precision_casts = True
            watch = DynamoWatch()
            began = time.perf_counter()
            calls = compiled_calls()
            traced: set[str] = set()
            with watch.watching(), _existing_sgl_kernel_fakes(), _noting_traced_ops(traced):
                super().__init__(model_runner)
            summary = watch.summary
            # The capture runs every compiled step: the routed ops its graphs called.
            inside = {
                op: count - calls.get(op, 0)
                for op, count in compiled_calls().items()
                if count > calls.get(op, 0)
            }
            self._recompiles = RecompileCheck()
            self._replay_reasons: set[str] = set()
            ours = summary.count(Owner.SGLANG_FL)
            _log.info(
                "sglang-fl: CPU graph runner compiled %d graphs for batch sizes %s in %.1f s; "
                "%d graph breaks (%d in sglang-fl), %d recompiles (%d in sglang-fl)",
                summary.graphs,
                self.capture_bs,
                time.perf_counter() - began,
                len(summary.breaks),
                ours[0],
                len(summary.recompiles),
                ours[1],
            )
            _report(
                ReportEvent.GRAPH_CAPTURE,
                runner=Runner.SGLANG_FL,
                graph_runner=f"{type(self).__module__}.{type(self).__qualname__}",
                mode=str(GraphMode.COMPILED),
                capture_bs=list(self.capture_bs),
                seconds=round(time.perf_counter() - began, 3),
                custom_ops=inside,
                traced_ops=sorted(traced),
                sglang_traceable=[r.to_json() for r in rebound],
                **summary.to_json(),
            )

        def execute(self, forward_batch: Any, pp_proxy_tensors: Any = None) -> Any:
            output = super().execute(forward_batch, pp_proxy_tensors)
            if self._recompiles.changed():  # one counter read per step
                self._report_replay(self._recompiles.since())
            return output

        def _report_replay(self, since: CompileSummary) -> None:
            fresh = [r for r in since.recompiles if r.reason not in self._replay_reasons]
            if not fresh:
                return
            self._replay_reasons.update(r.reason for r in fresh)
            _log.warning(
                "sglang-fl: a compiled decode step recompiled at replay: %s",
                "; ".join(f"{r.function} ({r.owner}): {r.reason}" for r in fresh),
            )
            _report(
                ReportEvent.GRAPH_REPLAY,
                runner=Runner.SGLANG_FL,
                mode=str(GraphMode.COMPILED),
                **since.to_json(),
            )

    return CpuGraphRunner
