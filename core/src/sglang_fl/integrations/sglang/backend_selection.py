"""Which SGLang attention backend serves ``--attention-backend sglang_fl``: a policy selection.

The candidates of the selection :data:`~sglang_fl.ops.attention.SGLANG_ATTENTION_BACKEND` are
sglang-fl's kernel-based backend (:data:`REFERENCE_IMPL_ID`, kind ``reference``, core's) and one
candidate per plugin whose ``sglang_fl_attention_backend`` hook offers a whole backend
(``vendor.<plugin>.attention_backend``, kind ``vendor``). They go through the resolution ops
use (:meth:`~sglang_fl.runtime.Runtime.resolve_among`): ``prefer``, the selection's ``per_op``
entry, the vendor lists, availability probes, strict mode.

Per model runner, :func:`build_backend` walks the decision's chain: a vendor factory that
raises or returns no ``AttentionBackend`` is reported (``fallback``) and the next candidate is
built, down to the kernel-based backend; under ``SGLANG_FL_STRICT=1`` it is a
:class:`~sglang_fl.errors.StrictModeError` naming the vendor. One ``attention_backend`` record
per model runner says which backend served and why.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..._version import __version__
from ...dispatch.identity import CORE_DISTRIBUTION, REFERENCE_PLUGIN
from ...dispatch.resolve import CandidateOutcome, CandidateVerdict, Resolution
from ...dispatch.types import BackendImplKind, BackendPriority, OpImpl, Provenance
from ...dispatch_report import DispatchReport, ReportEvent, Runner
from ...errors import NoImplementationError, StrictModeError
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
BACKEND_NAME = "sglang_fl"  # the name SGLang knows the backend by (--attention-backend)


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


def _offer_of(
    runtime: Runtime, plugin: str
) -> tuple[SglangAttentionBackendOffer | None, str | None]:
    pm = runtime.plugin_manager
    timeout = runtime.config.plugin_timeout
    outcome = call_plugin_code(
        functools.partial(call_plugin_hook, pm, pm.get_plugin(plugin), HOOK),
        what=f"{HOOK} of plugin {plugin!r}",
        timeout=timeout,
    )
    if outcome.timed_out:
        return None, f"{HOOK} did not return within {timeout:g} s (SGLANG_FL_PLUGIN_TIMEOUT)"
    if outcome.error is not None:
        return None, f"{HOOK} raised {describe_exception(outcome.error)}"
    answers = [a for a in (outcome.value or []) if a is not None]  # pluggy: a list per call
    if not answers:
        return None, None
    offer = answers[0]
    if not isinstance(offer, SglangAttentionBackendOffer):
        return None, f"{HOOK} returned {safe_repr(offer)}, not a SglangAttentionBackendOffer"
    return offer, None


def candidates(
    runtime: Runtime, build_kernel_backend: Callable[[Any], Any]
) -> tuple[list[OpImpl], list[OfferProblem]]:
    """The kernel-based backend and every plugin's offer, asked alone, in pluggy's order."""
    found = [_reference(build_kernel_backend)]
    problems: list[OfferProblem] = []
    hook = getattr(runtime.plugin_manager.hook, HOOK, None)
    for hookimpl in reversed(hook.get_hookimpls() if hook is not None else []):
        plugin = hookimpl.plugin_name
        offer, problem = _offer_of(runtime, plugin)
        if problem is not None:
            if runtime.config.strict:
                raise StrictModeError(f"SGLANG_FL_STRICT=1: plugin {plugin!r}: {problem}")
            _log.warning(
                "sglang-fl: plugin %r: %s; it offers no attention backend", plugin, problem
            )
            problems.append(OfferProblem(plugin, problem))
            continue
        if offer is None:
            continue
        impl = OpImpl(
            op_name=SGLANG_ATTENTION_BACKEND,
            impl_id=_impl_id(plugin),
            kind=BackendImplKind.VENDOR,
            fn=offer.factory,
            vendor=plugin,
            priority=BackendPriority.VENDOR if offer.priority is None else offer.priority,
            available=offer.available,
        )
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
    fields: dict[str, Any] = {
        "op": SGLANG_ATTENTION_BACKEND,
        "runner": Runner.SGLANG_FL,
        "backend": BACKEND_NAME,
    }
    try:
        resolution = _cached_select(runtime, build_kernel_backend)
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
            backend, problem = _build_vendor(impl, model_runner, backend_base)
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
        return backend
    raise AssertionError("the chain always ends with a candidate that builds")


def _build_vendor(impl: OpImpl, model_runner: Any, backend_base: type) -> tuple[Any, str | None]:
    """The vendor's backend, or why not. Called in the engine's thread (current device)."""
    try:
        backend = impl.fn(model_runner)
    except Exception as exc:
        return None, f"its factory raised {describe_exception(exc)}"
    if not isinstance(backend, backend_base):
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
