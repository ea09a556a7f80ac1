"""Which SGLang attention backend serves ``--attention-backend sglang_fl``: a policy selection.

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
    NoImplementationError,
    RegistrationError,
    StrictModeError,
)
from ...guard import call_plugin_code, describe_exception, safe_repr
from ...loader import call_plugin_hook
from ...ops.attention import SGLANG_ATTENTION_BACKEND, SglangAttentionBackendOffer
from ...runtime import Runtime
from ...schema import impl_fields

__all__ = [
    "HOOK",
    "REFERENCE_IMPL_ID",
    "OfferProblem",
    "build_backend",
    "candidates",
    "select",
]

_log = logging.getLogger(__name__)
HOOK = "sglang_fl_attention_backend"
REFERENCE_IMPL_ID = "reference.sglang_fl_attention"


@dataclass(frozen=True)
class OfferProblem:
    """A plugin's hook that raised, hung or returned no offer: it offers nothing."""

    plugin: str
    problem: str


def _impl_id(plugin: str) -> str:
    return f"{BackendImplKind.VENDOR}.{plugin}.attention_backend"


def _reference(build_kernel_backend: Callable[[Any], Any]) -> OpImpl:
    impl = OpImpl(
        op_name=SGLANG_ATTENTION_BACKEND,
        impl_id=REFERENCE_IMPL_ID,
        kind=BackendImplKind.REFERENCE,
        fn=build_kernel_backend,
    )
    return impl.with_provenance(Provenance(REFERENCE_PLUGIN, CORE_DISTRIBUTION, __version__))


def _offer_of(runtime: Runtime, plugin: str) -> tuple[OpImpl | None, str | None]:
    """The plugin's offer as a checked candidate, ``(None, None)`` for no offer, or why not.

    The hook and the checks of its answer (which read the plugin's objects) run together in
    one bounded worker.
    """
    pm = runtime.plugin_manager
    timeout = runtime.config.plugin_timeout

    def ask() -> OpImpl | None:
        answers = call_plugin_hook(pm, pm.get_plugin(plugin), HOOK)
        offered = [a for a in (answers or []) if a is not None]  # pluggy: a list per call
        if not offered:
            return None
        return offered_candidate(
            offered[0],
            SglangAttentionBackendOffer,
            selection=SGLANG_ATTENTION_BACKEND,
            impl_id=_impl_id(plugin),
            vendor=plugin,
        )

    outcome = call_plugin_code(ask, what=f"{HOOK} of plugin {plugin!r}", timeout=timeout)
    if outcome.timed_out:
        return None, f"{HOOK} did not return within {timeout:g} s (SGLANG_FL_PLUGIN_TIMEOUT)"
    if isinstance(outcome.error, RegistrationError):  # the answer was checked and refused
        return None, f"{HOOK} returned an unusable offer: {outcome.error}"
    if outcome.error is not None:
        return None, f"{HOOK} raised {describe_exception(outcome.error)}"
    return outcome.value, None


def candidates(
    runtime: Runtime, build_kernel_backend: Callable[[Any], Any]
) -> tuple[list[OpImpl], list[OfferProblem]]:
    """The kernel-based backend and every plugin's offer, asked alone, in pluggy's order.

    An offer is checked as an ``OpImpl`` registration is (:func:`offered_candidate`): one
    whose fields are wrong is refused with the reason (a rejected candidate), the others kept.
    """
    found = [_reference(build_kernel_backend)]
    problems: list[OfferProblem] = []
    hook = getattr(runtime.plugin_manager.hook, HOOK, None)
    for hookimpl in reversed(hook.get_hookimpls() if hook is not None else []):
        plugin = hookimpl.plugin_name
        impl, problem = _offer_of(runtime, plugin)
        if problem is not None:
            if runtime.config.strict:
                raise StrictModeError(f"SGLANG_FL_STRICT=1: plugin {plugin!r}: {problem}")
            _log.warning(
                "sglang-fl: plugin %r: %s; it offers no attention backend", plugin, problem
            )
            problems.append(OfferProblem(plugin, problem))
            continue
        if impl is not None:
            found.append(impl.with_provenance(_provenance(runtime, plugin)))
    return found, problems


def select(runtime: Runtime, build_kernel_backend: Callable[[Any], Any]) -> Resolution:
    """The selection's resolution; a hook that offered nothing usable is a rejected candidate.

    Raises :class:`NoImplementationError` when the policy leaves no candidate (a ``per_op``
    order naming only absent vendors), with the decision rejecting each.
    """
    found, problems = candidates(runtime, build_kernel_backend)
    rejected = tuple(
        CandidateVerdict(
            OpImpl(
                op_name=SGLANG_ATTENTION_BACKEND,
                impl_id=_impl_id(p.plugin),
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
        resolution = runtime.resolve_among(SGLANG_ATTENTION_BACKEND, found)
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


# Per runtime, dropped with it (a test's runtime; an id could be reused).
_resolutions: weakref.WeakKeyDictionary[Runtime, Resolution | NoImplementationError] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()


def _cached_select(runtime: Runtime, build_kernel_backend: Callable[[Any], Any]) -> Resolution:
    """:func:`select` once per runtime (process): the hooks run once, not per model runner."""
    with _lock:
        cached = _resolutions.get(runtime)
        if cached is None:
            try:
                cached = select(runtime, build_kernel_backend)
            except NoImplementationError as exc:
                cached = exc
            _resolutions[runtime] = cached
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
    fields: dict[str, Any] = {"op": SGLANG_ATTENTION_BACKEND, "runner": Runner.SGLANG_FL}
    try:
        resolution = _cached_select(runtime, build_kernel_backend)
    except NoImplementationError as exc:
        if strict:
            raise
        reason = f"{exc}; the kernel-based backend serves"
        backend = build_kernel_backend(model_runner)
        _emit(report, _reference(build_kernel_backend), backend, reason, [], fields)
        return backend
    decision = resolution.decision
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
    its next layer take) and mark an exception as the vendor's.

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
