"""The SGLang-only contract of a decode graph runner a vendor offers.

SGLang asks the platform for its decode graph runner (``get_graph_runner_cls()``): CUDA graphs
on a GPU, NPU graphs on Ascend, ``torch.compile`` on the CPU. On a platform sglang-fl provides,
the runner is a policy selection, :data:`SGLANG_GRAPH_RUNNER`: sglang-fl's own runner for the
platform (SGLang's CPU graph runner, made to run on sglang-fl's kernels) and one candidate per
plugin whose ``sglang_fl_graph_runner`` hook returns a :class:`SglangGraphRunnerOffer`, chosen
by the same policy as an op's implementations and the attention backend. vLLM's integration
never reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, final

from .attention.plan import GraphMode

__all__ = ["SGLANG_GRAPH_RUNNER", "SglangGraphRunnerOffer"]

# The selection's name: what ``per_op`` keys and ``sglang-fl explain`` take, and the ``op`` of
# its decision and report records.
SGLANG_GRAPH_RUNNER = "sglang_graph_runner"


@final
@dataclass(frozen=True)
class SglangGraphRunnerOffer:
    """A decode graph runner for SGLang, offered by one plugin (at most one per plugin).

    ``factory(model_runner)`` builds the runner for one SGLang ``ModelRunner``, as SGLang builds
    its own (``GraphRunnerCls(model_runner)``, which captures every batch size); import SGLang
    and the chip SDK inside it, not at plugin import time. SGLang then drives it through its
    graph-runner interface (``can_run_graph``, ``execute``, ``capture_bs``...), so subclass the
    runner SGLang has for the device (``CudaGraphRunner``, ``NPUGraphRunner``,
    ``CPUGraphRunner``). ``mode`` is how it replays a step
    (:class:`~sglang_fl.ops.attention.plan.GraphMode`: ``captured`` for a device graph,
    ``compiled`` for ``torch.compile``): before the factory runs, sglang-fl's attention backend
    is asked whether every kernel it serves can run that way.

    ``available`` and ``priority`` work as for an attention backend offer. The candidate's
    ``impl_id`` is ``vendor.<entry-point name>.graph_runner``. If the factory raises, or the
    attention backend refuses the mode, the next candidate is built and the dispatch report
    says why (``SGLANG_FL_STRICT=1``: an error naming the vendor).
    """

    factory: Callable[[Any], Any]
    mode: GraphMode = GraphMode.CAPTURED
    priority: int | None = None
    available: Callable[[], object] | bool | None = field(default=None, compare=False)
