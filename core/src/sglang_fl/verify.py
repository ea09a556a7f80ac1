"""Verify mode: run a routed op's reference beside it, live, and say which op breaks accuracy.

Engine-agnostic: an integration hands :meth:`Verifier.wrap` the callable it is about to bind
(the chosen implementation), that implementation's :class:`OpImpl`, and a label for the layer
class; it binds what comes back. With verify off (``SGLANG_FL_VERIFY`` unset or ``0``), or for
an op ``SGLANG_FL_VERIFY_OPS`` does not name, that is ``fn`` itself: nothing changes per call.

Otherwise, for the first N calls of each layer class in the process, the wrapper runs the op's
contract reference on copies of the inputs, compares the outputs (and every input both sides
wrote in place) within the contract's tolerance for the input dtype, and hands one ``verify``
record per call to the report sink. The first violation of each op is logged as a warning
naming the op, the implementation and its distribution. Once a class's N calls are spent, a
call costs one integer comparison more than the implementation alone. The implementation's
own result is always what the layer returns: verify observes, it never corrects.

The tensor comparison is :mod:`sglang_fl.comparison`'s (the kit's too); reading the records
back is :mod:`sglang_fl.verify_report`'s.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ._forksafe import reset_locks_in_child
from ._strenum import StrEnum
from .comparison import deviation, dtype_name, structure_problem
from .dispatch.binder import FallbackChain
from .dispatch.types import OpImpl
from .ops import OpContract, Tolerance, get_contract
from .schema import VerifyRecordJson, impl_fields

__all__ = ["VERIFY_EVENT", "Verifier", "VerifySink", "VerifyVerdict"]

_log = logging.getLogger("sglang_fl.verify")

# The ``event`` of the dispatch-report records a verifier emits.
VERIFY_EVENT = "verify"

# Receives one record per checked call (the dispatch report adds event, pid, process, time).
VerifySink = Callable[[VerifyRecordJson], object]


class VerifyVerdict(StrEnum):
    """What one checked call, or one implementation over a log, came to."""

    PASS = "pass"  # every compared tensor within the contract's tolerance
    FAIL = "fail"  # out of tolerance, or outputs of the wrong type, shape, dtype or device
    UNCHECKED = "unchecked"  # the reference could not judge this call (the record says why)


def _tracing_or_capturing() -> bool:
    """Whether this call is traced by torch.compile or captured into a CUDA graph: a check there
    would be baked into the graph, or synchronise with the host, which capture forbids. Such
    calls run unchecked and spend no budget; replays of a graph never reach Python at all."""
    return torch.compiler.is_compiling() or (
        torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()
    )


def _copy(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _primary_input(args: Sequence[Any], kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    """The tensor whose dtype picks the tolerance: the first floating-point input after ``obj``."""
    tensors = [a for a in itertools.chain(args[1:], kwargs.values()) if isinstance(a, torch.Tensor)]
    return next((t for t in tensors if t.is_floating_point()), tensors[0] if tensors else None)


def _tensors(output: Any, name: str) -> Iterator[tuple[str, Any]]:
    """``("output", t)`` or ``("output[0]", t0), ...``: an op's result as named parts."""
    if isinstance(output, (tuple, list)):
        for index, part in enumerate(output):
            yield f"{name}[{index}]", part
    else:
        yield name, output


@dataclass
class _Budget:
    """Calls of one layer class still to check, and instances bound so far (shared, per class)."""

    left: int
    checked: int = 0
    instances: int = 0


@dataclass(frozen=True)
class _Comparison:
    verdict: VerifyVerdict
    max_abs: float | None = None
    max_rel: float | None = None
    worst: str | None = None
    problem: str | None = None


class Verifier:
    """Wraps bound implementations so that the first ``calls`` calls per layer class are checked.

    One verifier per process and engine integration: it counts calls per layer label across
    every instance of that class, and warns once per op.
    """

    def __init__(self, calls: int, ops: Sequence[str] | None, sink: VerifySink) -> None:
        if calls < 0:
            raise ValueError(f"calls per layer class must be >= 0, got {calls}")
        self.calls = calls
        self.ops = None if ops is None else frozenset(ops)
        self.sink = sink
        self._budgets: dict[str, _Budget] = {}
        self._warned: set[tuple[str, VerifyVerdict]] = set()
        self._lock = threading.Lock()
        reset_locks_in_child(self)  # a thread checking a call at fork time must not hang the child

    def _reset_locks_after_fork(self) -> None:
        self._lock = threading.Lock()

    def enabled_for(self, op_name: str) -> bool:
        return self.calls > 0 and (self.ops is None or op_name in self.ops)

    def wrap(
        self,
        fn: Callable[..., Any],
        impl: OpImpl,
        layer: str,
        chain: FallbackChain | None = None,
    ) -> Callable[..., Any]:
        """The callable to bind for one layer instance: ``fn`` itself unless verify covers it.

        ``layer`` names the layer class; records name the instance by its order of binding in
        this process (``instance``), which for lazily resolved layers is the model's call order.
        ``chain`` (the binding ``fn`` calls: ``impl`` and its fallbacks) serves a checked call,
        declines reported as ``fn`` reports them, so that each record names the implementation
        whose output it judged, not the chosen one that declined the call with ``Unsupported``.
        """
        if not self.enabled_for(impl.op_name):
            return fn
        contract = get_contract(impl.op_name)
        walked = chain if chain is not None and len(chain.impls) > 1 else None
        with self._lock:
            budget = self._budgets.setdefault(layer, _Budget(left=self.calls))
            instance = budget.instances
            budget.instances += 1

        def verified(*args: Any, **kwargs: Any) -> Any:
            # Once the class's budget is spent, this comparison is the whole per-call cost.
            if budget.left <= 0 or _tracing_or_capturing():
                return fn(*args, **kwargs)
            with self._lock:
                if budget.left <= 0:
                    call = None
                else:
                    budget.left -= 1
                    budget.checked += 1
                    call = budget.checked
            if call is None:
                return fn(*args, **kwargs)
            return self._checked_call(
                fn, contract, impl, walked, layer, instance, call, args, kwargs
            )

        verified.__wrapped__ = fn  # type: ignore[attr-defined]
        return verified

    def _checked_call(
        self,
        fn: Callable[..., Any],
        contract: OpContract,
        impl: OpImpl,
        chain: FallbackChain | None,
        layer: str,
        instance: int,
        call: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        before = [_copy(a) for a in args], {k: _copy(v) for k, v in kwargs.items()}
        ref_args = [_copy(a) for a in args], {k: _copy(v) for k, v in kwargs.items()}
        if chain is not None:
            impl, got = chain.serve(args, kwargs)
        else:  # an exception here is the implementation's: it propagates
            got = fn(*args, **kwargs)
        first = _primary_input(args, kwargs)
        dtype = None if first is None else first.dtype
        comparison = self._compare(contract, dtype, got, (args, kwargs), before, ref_args)
        record: VerifyRecordJson = {
            "op": contract.name,
            "layer": layer,
            "instance": instance,
            "call": call,
            **impl_fields(impl),
            "dtype": None if dtype is None else dtype_name(dtype),
            "shape": None if first is None else list(first.shape),
            "max_abs_error": comparison.max_abs,
            "max_rel_error": comparison.max_rel,
            "atol": None,
            "rtol": None,
            "worst": comparison.worst,
            "verdict": comparison.verdict,
            "problem": comparison.problem,
        }
        if dtype is not None and dtype in contract.tolerances:
            tolerance = contract.tolerance(dtype)
            record["atol"], record["rtol"] = tolerance.atol, tolerance.rtol
        if comparison.verdict is not VerifyVerdict.PASS:
            self._warn_once(record)
        self.sink(record)
        return got

    def _compare(
        self,
        contract: OpContract,
        dtype: torch.dtype | None,
        got: Any,
        called: tuple[Sequence[Any], Mapping[str, Any]],
        before: tuple[Sequence[Any], Mapping[str, Any]],
        reference: tuple[list[Any], dict[str, Any]],
    ) -> _Comparison:
        if dtype is None or dtype not in contract.tolerances:
            allowed = ", ".join(dtype_name(d) for d in contract.tolerances)
            return _Comparison(
                VerifyVerdict.UNCHECKED,
                problem=f"the contract has no tolerance for dtype {dtype}; it has: {allowed}",
            )
        tolerance = contract.tolerance(dtype)
        try:
            want = contract.reference(*reference[0], **reference[1])
        except Exception as exc:  # reported in the record and logged: never breaks the model
            return _Comparison(
                VerifyVerdict.UNCHECKED,
                problem=f"the reference raised {type(exc).__name__}: {exc}",
            )
        try:
            got_parts = list(_tensors(contract.canonical_output(got), "output"))
        except Exception as exc:  # e.g. a top-k result that is not (weights, ids)
            return _Comparison(
                VerifyVerdict.FAIL,
                problem=f"the output is not the contract's ({type(exc).__name__}: {exc})",
            )
        want_parts = list(_tensors(contract.canonical_output(want), "output"))
        if len(got_parts) != len(want_parts):
            return _Comparison(
                VerifyVerdict.FAIL,
                problem=f"returned {len(got_parts)} result(s), expected {len(want_parts)}",
            )
        compared = [(name, g, w) for (name, g), (_, w) in zip(got_parts, want_parts, strict=True)]
        compared += _written_in_place(contract, called, before, reference)
        return _judge(compared, tolerance)

    def _warn_once(self, record: VerifyRecordJson) -> None:
        """The first violation of each op, and the first unchecked call of each, are logged."""
        key = (record["op"], record["verdict"])
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        _log.warning(
            "sglang-fl verify: op %s, implementation %s (%s %s), %s in %s #%d (%s %s): %s "
            "(logged once per op; see the dispatch log's verify records)",
            record["op"],
            record["impl_id"],
            record["distribution"],
            record["version"],
            "violates the contract's tolerance"
            if record["verdict"] is VerifyVerdict.FAIL
            else "could not be checked",
            record["layer"],
            record["instance"],
            record["dtype"],
            record["shape"],
            record["problem"],
        )


def _written_in_place(
    contract: OpContract,
    called: tuple[Sequence[Any], Mapping[str, Any]],
    before: tuple[Sequence[Any], Mapping[str, Any]],
    reference: tuple[list[Any], dict[str, Any]],
) -> list[tuple[str, Any, torch.Tensor]]:
    """Inputs the reference wrote in place and the implementation wrote too, by parameter name.

    An input only the implementation wrote is one the contract lets it use (a fused norm's
    ``x``/``residual``); its values are judged through the returned outputs. An implementation
    that returns new tensors instead of writing them is judged by those outputs as well.
    """
    names = list(contract.signature.parameters)
    found = []
    for position, (now, then, ref) in enumerate(
        zip(called[0], before[0], reference[0], strict=True)
    ):
        if position and isinstance(now, torch.Tensor):
            name = names[position] if position < len(names) else f"args[{position}]"
            found.append((name, now, then, ref))
    for key, now in called[1].items():
        if isinstance(now, torch.Tensor):
            found.append((key, now, before[1][key], reference[1][key]))
    return [
        (f"input {name}", now, ref)
        for name, now, then, ref in found
        if not torch.equal(ref, then) and not torch.equal(now, then)
    ]


def _judge(compared: Iterable[tuple[str, Any, Any]], tolerance: Tolerance) -> _Comparison:
    """One verdict over every compared pair: the worst pair names the error."""
    max_abs = max_rel = 0.0
    worst_name: str | None = None
    worst_excess = -math.inf
    failures: list[str] = []
    for name, got, want in compared:
        if not isinstance(want, torch.Tensor):
            if got != want:
                failures.append(f"{name} is {got!r}, expected {want!r}")
            continue
        problem = structure_problem(got, want, name)
        if problem is not None:
            return _Comparison(VerifyVerdict.FAIL, worst=name, problem=problem)
        dev = deviation(got, want, tolerance)
        max_abs, max_rel = max(max_abs, dev.max_abs), max(max_rel, dev.max_rel)
        excess = dev.max_abs - tolerance.atol
        if dev.elements and excess > worst_excess:
            worst_name, worst_excess = name, excess
        if not dev.within:
            failures.append(
                f"{name}: {dev.out_of_tolerance} of {dev.elements} elements out of tolerance "
                f"(atol={tolerance.atol:g}, rtol={tolerance.rtol:g}), max abs error "
                f"{dev.max_abs:.3g}, max rel error {dev.max_rel:.3g}, "
                f"worst at {list(dev.worst or ())}"
            )
    verdict = VerifyVerdict.FAIL if failures else VerifyVerdict.PASS
    return _Comparison(verdict, max_abs, max_rel, worst_name, "; ".join(failures) or None)
