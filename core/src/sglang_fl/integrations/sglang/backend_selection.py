"""Which SGLang attention backend (and graph runner) serves: policy selections among offers.

The candidates of the selection :data:`~sglang_fl.ops.attention.SGLANG_ATTENTION_BACKEND` are
sglang-fl's kernel-based backend (:data:`REFERENCE_IMPL_ID`, kind ``reference``, core's) and one
candidate per plugin whose ``sglang_fl_attention_backend`` hook offers a whole backend
(``vendor.<plugin>.attention_backend``, kind ``vendor``). They go through the resolution ops
use (:meth:`~sglang_fl.runtime.Runtime.resolve_among`): ``prefer``, the selection's ``per_op``
entry, the vendor lists, availability probes, strict mode.

An offer is checked as an ``OpImpl`` registration is (``factory`` callable, ``priority`` an
``int``, ``available`` a bool or a probe: :func:`~sglang_fl.dispatch.registry.offered_candidate`,
one validator for every selection's offers); a wrong one is a rejected candidate with the reason.

Per model runner, :func:`build_backend` walks the decision's chain: a vendor factory that
raises (any ``BaseException`` but an interrupt), does not return within
``SGLANG_FL_PLUGIN_TIMEOUT`` or returns no ``AttentionBackend`` is reported (``fallback``) and
the next candidate is built, down to the kernel-based backend; under ``SGLANG_FL_STRICT=1`` it
is a :class:`~sglang_fl.errors.StrictModeError` naming the vendor. One ``attention_backend``
record per model runner says which backend served and why.

The decode graph runner of a platform sglang-fl provides is the same kind of selection
(:data:`GRAPH_RUNNER`: ``sglang_fl_graph_runner`` offers against sglang-fl's own runner); an
:class:`OfferSelection` names what differs, and :func:`candidates` and :func:`select` serve
both (``integrations/sglang/graph_runner.py`` builds the runner).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..._version import __version__
from ...dispatch.identity import CORE_DISTRIBUTION, REFERENCE_PLUGIN
from ...dispatch.registry import offered_candidate
from ...dispatch.resolve import CandidateOutcome, CandidateVerdict, Resolution
from ...dispatch.types import BackendImplKind, OpImpl, Provenance
from ...dispatch_report import DispatchReport, ReportEvent, Runner
from ...errors import (
    ContractViolationError,
    GraphModeRefused,
    NoImplementationError,
    RegistrationError,
    StrictModeError,
)
from ...guard import call_plugin_code, describe_exception, is_interrupt, safe_repr
from ...loader import call_plugin_hook
from ...ops.attention import SGLANG_ATTENTION_BACKEND, SglangAttentionBackendOffer
from ...ops.attention.plan import GraphMode
from ...ops.graph_runner import SGLANG_GRAPH_RUNNER, SglangGraphRunnerOffer
from ...runtime import Runtime
from ...schema import impl_fields

__all__ = [
    "ATTENTION_BACKEND",
    "GRAPH_RUNNER",
    "HOOK",
    "REFERENCE_IMPL_ID",
    "OfferProblem",
    "OfferSelection",
    "build_backend",
    "cached_select",
    "candidates",
    "graph_problem",
    "select",
    "selection_named",
]

_log = logging.getLogger(__name__)
HOOK = "sglang_fl_attention_backend"
REFERENCE_IMPL_ID = "reference.sglang_fl_attention"
BACKEND_NAME = "sglang_fl"  # the name SGLang knows the backend by (--attention-backend)


@dataclass(frozen=True)
class OfferSelection:
    """One selection among whole things plugins offer: what the hook is, what it returns, how
    its candidates are named. ``adapt`` turns a checked offer into its candidate (``None``: the
    offer's factory as it is); it runs with the hook, bounded, and raises
    :class:`~sglang_fl.errors.RegistrationError` for an offer it refuses."""

    name: str  # the selection (``ops.SELECTIONS``): per_op key, explain argument, record op
    hook: str
    offer_type: type
    what: str  # "attention backend": in messages
    suffix: str  # a vendor candidate is ``vendor.<plugin>.<suffix>``
    reference_impl_id: str
    adapt: Callable[[Any, OpImpl], OpImpl] | None = None

    def impl_id(self, plugin: str) -> str:
        return f"{BackendImplKind.VENDOR}.{plugin}.{self.suffix}"

    def reference(self, build: Callable[..., Any]) -> OpImpl:
        """sglang-fl's own candidate, built by ``build``."""
        impl = OpImpl(
            op_name=self.name,
            impl_id=self.reference_impl_id,
            kind=BackendImplKind.REFERENCE,
            fn=build,
        )
        return impl.with_provenance(Provenance(REFERENCE_PLUGIN, CORE_DISTRIBUTION, __version__))


ATTENTION_BACKEND = OfferSelection(
    name=SGLANG_ATTENTION_BACKEND,
    hook=HOOK,
    offer_type=SglangAttentionBackendOffer,
    what="attention backend",
    suffix="attention_backend",
    reference_impl_id=REFERENCE_IMPL_ID,
)


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


def _graph_runner_candidate(offer: Any, impl: OpImpl) -> OpImpl:
    """A graph runner offer's candidate: its factory, asking the attention backend first
    whether it can run in the offer's graph mode (the candidate fails, reported, if not)."""
    mode = offer.mode
    if not isinstance(mode, GraphMode):
        allowed = ", ".join(GraphMode)
        raise RegistrationError(f"its mode={safe_repr(mode)}; expected a GraphMode ({allowed})")
    factory = impl.fn

    def build(model_runner: Any, **options: Any) -> Any:
        problem = graph_problem(model_runner.attn_backend, mode)
        if problem is not None:
            raise GraphModeRefused(f"the attention backend refuses {mode} graphs: {problem}")
        return factory(model_runner, **options)

    return dataclasses.replace(impl, fn=build)


GRAPH_RUNNER = OfferSelection(
    name=SGLANG_GRAPH_RUNNER,
    hook="sglang_fl_graph_runner",
    offer_type=SglangGraphRunnerOffer,
    what="graph runner",
    suffix="graph_runner",
    reference_impl_id="reference.sglang_graph_runner",
    adapt=_graph_runner_candidate,
)

_SELECTIONS = {selection.name: selection for selection in (ATTENTION_BACKEND, GRAPH_RUNNER)}


def selection_named(name: str) -> OfferSelection | None:
    """The offer selection called ``name`` (``ops.SELECTIONS``), or ``None``."""
    return _SELECTIONS.get(name)


@dataclass(frozen=True)
class OfferProblem:
    """A plugin's hook that raised, hung or returned no offer: it offers nothing."""

    plugin: str
    problem: str


def _reference(build_kernel_backend: Callable[[Any], Any]) -> OpImpl:
    return ATTENTION_BACKEND.reference(build_kernel_backend)


def _offer_of(
    runtime: Runtime, plugin: str, selection: OfferSelection
) -> tuple[OpImpl | None, str | None]:
    """The plugin's offer as a checked candidate, ``(None, None)`` for no offer, or why not.

    The hook and the checks of its answer (which read the plugin's objects) run together in
    one bounded worker.
    """
    hook_name = selection.hook
    pm = runtime.plugin_manager
    timeout = runtime.config.plugin_timeout

    def ask() -> OpImpl | None:
        answers = call_plugin_hook(pm, pm.get_plugin(plugin), hook_name)
        offered = [a for a in (answers or []) if a is not None]  # pluggy: a list per call
        if not offered:
            return None
        impl = offered_candidate(
            offered[0],
            selection.offer_type,
            selection=selection.name,
            impl_id=selection.impl_id(plugin),
            vendor=plugin,
        )
        return impl if selection.adapt is None else selection.adapt(offered[0], impl)

    outcome = call_plugin_code(ask, what=f"{hook_name} of plugin {plugin!r}", timeout=timeout)
    if outcome.timed_out:
        return None, (f"{hook_name} did not return within {timeout:g} s (SGLANG_FL_PLUGIN_TIMEOUT)")
    if isinstance(outcome.error, RegistrationError):  # the answer was checked and refused
        return None, f"{hook_name} returned an unusable offer: {outcome.error}"
    if outcome.error is not None:
        return None, f"{hook_name} raised {describe_exception(outcome.error)}"
    return outcome.value, None


def candidates(
    runtime: Runtime,
    build_reference: Callable[..., Any],
    selection: OfferSelection = ATTENTION_BACKEND,
) -> tuple[list[OpImpl], list[OfferProblem]]:
    """sglang-fl's own candidate and every plugin's offer, asked alone, in pluggy's order.

    An offer is checked as an ``OpImpl`` registration is (:func:`offered_candidate`): one
    whose fields are wrong is refused with the reason (a rejected candidate), the others kept.
    """
    found = [selection.reference(build_reference)]
    problems: list[OfferProblem] = []
    hook = getattr(runtime.plugin_manager.hook, selection.hook, None)
    for hookimpl in reversed(hook.get_hookimpls() if hook is not None else []):
        plugin = hookimpl.plugin_name
        impl, problem = _offer_of(runtime, plugin, selection)
        if problem is not None:
            if runtime.config.strict:
                raise StrictModeError(f"SGLANG_FL_STRICT=1: plugin {plugin!r}: {problem}")
            _log.warning(
                "sglang-fl: plugin %r: %s; it offers no %s", plugin, problem, selection.what
            )
            problems.append(OfferProblem(plugin, problem))
            continue
        if impl is not None:
            found.append(impl.with_provenance(_provenance(runtime, plugin)))
    return found, problems


def select(
    runtime: Runtime,
    build_reference: Callable[..., Any],
    selection: OfferSelection = ATTENTION_BACKEND,
) -> Resolution:
    """The selection's resolution; a hook that offered nothing usable is a rejected candidate.

    Raises :class:`NoImplementationError` when the policy leaves no candidate (a ``per_op``
    order naming only absent vendors), with the decision rejecting each.
    """
    found, problems = candidates(runtime, build_reference, selection)
    rejected = tuple(
        CandidateVerdict(
            OpImpl(
                op_name=selection.name,
                impl_id=selection.impl_id(p.plugin),
                kind=BackendImplKind.VENDOR,
                fn=_offered_nothing,
                vendor=p.plugin,
            ).with_provenance(_provenance(runtime, p.plugin)),
            CandidateOutcome.REJECTED,
            p.problem,
        )
        for p in problems
    )
    try:
        resolution = runtime.resolve_among(selection.name, found)
    except NoImplementationError as exc:
        decision = exc.decision
        if decision is not None and rejected:
            decision = dataclasses.replace(decision, candidates=(*decision.candidates, *rejected))
        raise NoImplementationError(str(exc), decision) from None
    decision = dataclasses.replace(
        resolution.decision, candidates=(*resolution.decision.candidates, *rejected)
    )
    return dataclasses.replace(resolution, decision=decision)


def _offered_nothing(model_runner: Any) -> Any:
    raise AssertionError("a rejected offer is never built")


def _provenance(runtime: Runtime, plugin: str) -> Provenance:
    record = runtime.plugin(plugin)
    return Provenance(plugin, record.distribution or "<unknown>", record.version or "")


# Per runtime, dropped with it (a test's runtime; an id could be reused); per selection.
_resolutions: weakref.WeakKeyDictionary[Runtime, dict[str, Resolution | NoImplementationError]] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()


def cached_select(
    runtime: Runtime,
    build_reference: Callable[..., Any],
    selection: OfferSelection = ATTENTION_BACKEND,
) -> Resolution:
    """:func:`select` once per runtime (process) and selection: the hooks run once, not per
    model runner."""
    with _lock:
        per_runtime = _resolutions.setdefault(runtime, {})
        cached = per_runtime.get(selection.name)
        if cached is None:
            try:
                cached = select(runtime, build_reference, selection)
            except NoImplementationError as exc:
                cached = exc
            per_runtime[selection.name] = cached
    if isinstance(cached, NoImplementationError):
        raise cached
    return cached


def build_backend(
    runtime: Runtime,
    report: DispatchReport,
    model_runner: Any,
    build_kernel_backend: Callable[[Any], Any],
    backend_base: type,
) -> Any:
    """The attention backend of ``model_runner``: the chosen candidate, else the next that
    builds; one ``attention_backend`` record says which and why.

    ``backend_base`` is SGLang's ``AttentionBackend``: a vendor factory must return one.
    """
    strict = runtime.config.strict
    fields: dict[str, Any] = {
        "op": SGLANG_ATTENTION_BACKEND,
        "runner": Runner.SGLANG_FL,
        "backend": BACKEND_NAME,
    }
    try:
        resolution = cached_select(runtime, build_kernel_backend)
    except NoImplementationError as exc:
        if strict:
            raise
        reason = f"{exc}; the kernel-based backend serves"
        backend = build_kernel_backend(model_runner)
        fields.update(report.rejected_once(exc.decision))
        _emit(report, _reference(build_kernel_backend), backend, reason, [], fields)
        return backend
    decision = resolution.decision
    fields.update(report.rejected_once(decision))
    chain = list(resolution.chain)
    reason = next(c.reason for c in decision.candidates if c.outcome is CandidateOutcome.CHOSEN)
    failed: list[str] = []
    for index, impl in enumerate(chain):
        if impl.impl_id == REFERENCE_IMPL_ID:
            backend = build_kernel_backend(model_runner)
        else:
            backend, problem = _build_vendor(
                impl, model_runner, backend_base, runtime.config.plugin_timeout
            )
            if problem is not None:
                message = f"vendor {impl.vendor!r}: attention backend {impl.impl_id}: {problem}"
                if strict:
                    raise StrictModeError(
                        f"SGLANG_FL_STRICT=1: {message}; without strict mode the next "
                        "candidate would serve"
                    )
                following = chain[index + 1] if index + 1 < len(chain) else None
                next_impl = following or _reference(build_kernel_backend)
                _log.warning("sglang-fl: %s; %s serves", message, next_impl.impl_id)
                report.emit(
                    ReportEvent.FALLBACK,
                    op=SGLANG_ATTENTION_BACKEND,
                    impl_id=impl.impl_id,
                    next_impl_id=next_impl.impl_id,
                    reason=problem,
                    runner=Runner.SGLANG_FL,
                )
                failed.append(impl.impl_id)
                reason = f"{impl.impl_id} failed to build ({problem}); next in the decision"
                if following is None:  # strict trimmed the chain, or the reference was denied
                    chain.append(next_impl)
                continue
        _emit(report, impl, backend, reason, failed, fields)
        if impl.impl_id != REFERENCE_IMPL_ID:
            _watch_forwards(backend, impl)
        return backend
    raise AssertionError("the chain always ends with a candidate that builds")


# The forwards of a vendor's backend that return one layer's attention output.
_FORWARDS = ("forward_extend", "forward_decode")


def _watch_forwards(backend: Any, impl: OpImpl) -> None:
    """Make a vendor backend's faults name it: its forwards, as instance attributes, check the
    output's shape (``[tokens, q_heads * v_head_dim]``, what SGLang's ``RadixAttention`` and
    its next layer take) and mark an exception as the vendor's (a ``BaseException`` that is not
    an interrupt, ``SystemExit`` say, becomes a :class:`ContractViolationError` naming it).

    Nothing is re-run or replaced: the forward may have written the KV cache before it failed,
    so the error propagates (SGLang stops the request or the engine) and says whose it was.
    The cost is one frame and one shape comparison per layer call.
    """
    who = f"the attention backend {impl.impl_id} ({impl.provenance})"
    for name in _FORWARDS:
        forward = getattr(backend, name, None)
        if callable(forward):
            setattr(backend, name, _watched(forward, name, who))


def _watched(forward: Callable[..., Any], name: str, who: str) -> Callable[..., Any]:
    def watched(q: Any, k: Any, v: Any, layer: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            out = forward(q, k, v, layer, *args, **kwargs)
        except Exception as exc:
            if hasattr(exc, "add_note"):  # Python 3.11+
                exc.add_note(f"sglang-fl: raised by {who} in {name}")
            raise
        except BaseException as exc:
            if is_interrupt(exc):
                raise
            # SystemExit and the like would end SGLang's scheduler with an exit code and no
            # trace of whose code it was; an Exception stops it the way SGLang reports.
            raise ContractViolationError(
                f"{who} raised {describe_exception(exc)} in {name}; a forward must return "
                "its output or raise an Exception"
            ) from exc
        if isinstance(out, torch.Tensor):
            rows, width = q.shape[0], layer.tp_q_head_num * layer.v_head_dim
            if out.shape[0] != rows or out.numel() != rows * width:
                raise ContractViolationError(
                    f"{who} returned a {list(out.shape)} output from {name}; SGLang's "
                    f"attention layer takes [{rows}, {width}] (tokens, q_heads * v_head_dim)"
                )
        return out

    watched.__name__ = watched.__qualname__ = name
    watched.__wrapped__ = forward  # type: ignore[attr-defined]
    return watched


@dataclass(frozen=True)
class _TorchThreadState:
    """The engine thread's thread-local torch state a backend's factory builds under: the
    accelerator's current device and stream, grad and inference modes. Carried into the
    worker that runs the factory, so it allocates where the engine's own thread would."""

    grad: bool
    inference: bool
    device_index: int | None = None
    stream: Any = None

    @classmethod
    def capture(cls) -> _TorchThreadState:
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is None or not accelerator.is_available():
            return cls(torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        index = accelerator.current_device_index()
        return cls(
            torch.is_grad_enabled(),
            torch.is_inference_mode_enabled(),
            index,
            accelerator.current_stream(index),
        )

    def call(self, fn: Callable[[], Any]) -> Any:
        if self.device_index is not None:
            torch.accelerator.set_device_index(self.device_index)
            torch.accelerator.set_stream(self.stream)
        with torch.inference_mode(self.inference), torch.set_grad_enabled(self.grad):
            return fn()


def _build_vendor(
    impl: OpImpl, model_runner: Any, backend_base: type, timeout: float
) -> tuple[Any, str | None]:
    """The vendor's backend, or why not.

    The factory is plugin code: it runs in a worker that carries the engine thread's device,
    stream and autograd modes (:class:`_TorchThreadState`), waited for at most ``timeout``
    seconds (``SGLANG_FL_PLUGIN_TIMEOUT``); anything it raises, ``SystemExit`` and any other
    ``BaseException`` included (only an interrupt still interrupts), is its failure.
    """
    state = _TorchThreadState.capture()

    def build() -> tuple[Any, bool]:
        backend = state.call(lambda: impl.fn(model_runner))
        return backend, isinstance(backend, backend_base)  # plugin code: in the worker too

    outcome = call_plugin_code(build, what=f"the factory of {impl.impl_id}", timeout=timeout)
    if outcome.timed_out:
        return None, (
            f"its factory did not return within {timeout:g} s (SGLANG_FL_PLUGIN_TIMEOUT); abandoned"
        )
    if outcome.error is not None:
        return None, f"its factory raised {describe_exception(outcome.error)}"
    assert outcome.value is not None
    backend, is_backend = outcome.value
    if not is_backend:
        return None, (
            f"its factory returned {safe_repr(backend)}, not an SGLang {backend_base.__name__}"
        )
    return backend, None


def _emit(
    report: DispatchReport,
    impl: OpImpl,
    backend: Any,
    reason: str,
    failed: list[str],
    fields: dict[str, Any],
) -> None:
    cls = type(backend)
    report.emit(
        ReportEvent.ATTENTION_BACKEND,
        **fields,
        **impl_fields(impl),
        backend_class=f"{cls.__module__}.{cls.__qualname__}",
        reason=reason,
        failed=failed,
    )
