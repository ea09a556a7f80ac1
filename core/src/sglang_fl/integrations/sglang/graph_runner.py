"""SGLang's decode graph runner on sglang-fl's CPU platform, and what it compiled.

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
- Before anything is captured the attention backend is asked whether its kernels can run
  compiled (:data:`~sglang_fl.ops.attention.plan.GraphMode.COMPILED`); a refusal stops the
  start-up with the reason.
- The capture runs under a :class:`~sglang_fl.graph_watch.DynamoWatch`: one ``graph_capture``
  record in the dispatch report gives the batch sizes, the time, the graphs compiled, every
  graph break and recompile with whose code it was in, and the ``sglang_fl::<op>`` custom ops
  the compiled steps called (eager code never calls one: these are the routed ops inside the
  compiled graphs). A later step that recompiles (a guard
  failed at replay) is reported once per reason (``graph_replay``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from ...dispatch_report import ReportEvent, Runner
from ...errors import GraphModeRefused
from ...graph import compiled_calls
from ...graph_watch import CompileSummary, DynamoWatch, Owner, RecompileCheck
from ...ops.attention.plan import GraphMode
from .router import get_router

__all__ = ["cpu_graph_runner_class", "graph_problem"]

_log = logging.getLogger("sglang_fl.integrations.sglang")


def graph_problem(attn_backend: Any, mode: GraphMode) -> str | None:
    """Why ``attn_backend`` cannot serve a ``mode`` graph runner, or ``None``.

    sglang-fl's attention backend answers for its kernels; a wrapper (SGLang's hybrid
    linear-attention backend) for each backend it wraps; another backend is asked nothing here
    (SGLang's own checks apply).
    """
    ask: Callable[[GraphMode], str | None] | None = getattr(attn_backend, "graph_problem", None)
    if ask is not None:
        return ask(mode)
    wrapped = getattr(attn_backend, "attn_backend_list", None) or ()
    problems = [p for p in (graph_problem(b, mode) for b in wrapped) if p is not None]
    return "; ".join(problems) or None


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


def _report(event: ReportEvent, **fields: Any) -> None:
    router = get_router()
    if router is not None:
        router.report.emit(event, **fields)


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
            watch = DynamoWatch()
            began = time.perf_counter()
            calls = compiled_calls()
            with watch.watching(), _existing_sgl_kernel_fakes():
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
