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
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ._forksafe import reset_locks_in_child
from ._strenum import StrEnum
from .dispatch.types import OpImpl
from .errors import SglangFlError, Unsupported
from .ops import OpContract, Tolerance, get_contract
from .schema import (
    NON_FINITE,
    SCHEMA_VERSION,
    VerifyRecordJson,
    VerifySummaryPayload,
    VerifySummaryRow,
    impl_fields,
    number_from_json,
)

__all__ = [
    "DEFAULT_VERIFY_CALLS",
    "VERIFY_EVENT",
    "Deviation",
    "Verifier",
    "VerifyLogError",
    "VerifySink",
    "VerifyVerdict",
    "deviation",
    "read_verify_records",
    "structure_problem",
    "summarize",
]

_log = logging.getLogger("sglang_fl.verify")

# ``SGLANG_FL_VERIFY=on`` (or ``true``/``yes``): calls checked per layer class.
DEFAULT_VERIFY_CALLS = 16
# The ``event`` of the dispatch-report records a verifier emits.
VERIFY_EVENT = "verify"

# Receives one record per checked call (the dispatch report adds event, pid, process, time).
VerifySink = Callable[[VerifyRecordJson], object]


class VerifyVerdict(StrEnum):
    """What one checked call, or one implementation over a log, came to."""

    PASS = "pass"  # every compared tensor within the contract's tolerance
    FAIL = "fail"  # out of tolerance, or outputs of the wrong type, shape, dtype or device
    UNCHECKED = "unchecked"  # the reference could not judge this call (the record says why)


class VerifyLogError(SglangFlError):
    """A dispatch log that cannot be summarised: missing, malformed, or without verify records."""


# -- comparing two tensors -------------------------------------------------------------------------


@dataclass(frozen=True)
class Deviation:
    """How far ``got`` is from ``want``: ``|got - want| <= atol + rtol * |want|`` per element."""

    max_abs: float  # inf where an element is NaN
    max_rel: float  # over elements whose wanted value is not 0; inf if none is and they differ
    out_of_tolerance: int
    elements: int
    worst: tuple[int, ...] | None  # index of the element furthest beyond its bound

    @property
    def within(self) -> bool:
        return self.out_of_tolerance == 0


def structure_problem(got: object, want: torch.Tensor, what: str) -> str | None:
    """Why ``got`` cannot be compared with ``want`` element by element, or ``None``."""
    if not isinstance(got, torch.Tensor):
        return f"{what} is a {type(got).__name__}, expected a tensor"
    if got.shape != want.shape:
        return f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if got.dtype != want.dtype:
        return f"{what} has dtype {_dtype_name(got.dtype)}, expected {_dtype_name(want.dtype)}"
    if got.device != want.device:
        return f"{what} is on {got.device}, expected {want.device}"
    return None


def deviation(got: torch.Tensor, want: torch.Tensor, tolerance: Tolerance) -> Deviation:
    """Element-wise error of two tensors of the same shape, in float64 on the CPU."""
    g = got.detach().to("cpu", torch.float64)
    w = want.detach().to("cpu", torch.float64)
    error = torch.nan_to_num((g - w).abs(), nan=math.inf)
    bound = tolerance.atol + tolerance.rtol * w.abs()
    bad = ~(error <= bound)  # NaN compares false: a NaN is out of tolerance
    if error.numel() == 0:
        return Deviation(0.0, 0.0, 0, 0, None)
    nonzero = w != 0
    if bool(nonzero.any()):
        max_rel = (error[nonzero] / w[nonzero].abs()).max().item()
    else:
        max_rel = 0.0 if not bool((error > 0).any()) else math.inf
    worst = tuple(int(i) for i in torch.unravel_index(torch.argmax(error - bound), error.shape))
    return Deviation(error.max().item(), max_rel, int(bad.sum()), bad.numel(), worst)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# -- the wrapper ---------------------------------------------------------------------------------


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
        chain: Sequence[OpImpl] = (),
    ) -> Callable[..., Any]:
        """The callable to bind for one layer instance: ``fn`` itself unless verify covers it.

        ``layer`` names the layer class; records name the instance by its order of binding in
        this process (``instance``), which for lazily resolved layers is the model's call order.
        ``chain`` (the resolution's: ``impl`` and its fallbacks) is walked for a checked call
        the way ``fn`` walks it, so that each record names the implementation whose output it
        judged, not the chosen one that declined the call with ``Unsupported``.
        """
        if not self.enabled_for(impl.op_name):
            return fn
        contract = get_contract(impl.op_name)
        steps = tuple(chain) if len(chain) > 1 else ()
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
                fn, contract, impl, steps, layer, instance, call, args, kwargs
            )

        verified.__wrapped__ = fn  # type: ignore[attr-defined]
        return verified

    def _checked_call(
        self,
        fn: Callable[..., Any],
        contract: OpContract,
        impl: OpImpl,
        chain: tuple[OpImpl, ...],
        layer: str,
        instance: int,
        call: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        before = [_copy(a) for a in args], {k: _copy(v) for k, v in kwargs.items()}
        ref_args = [_copy(a) for a in args], {k: _copy(v) for k, v in kwargs.items()}
        if chain:
            impl, got = _first_accepting(chain, args, kwargs)
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
            "dtype": None if dtype is None else _dtype_name(dtype),
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
            allowed = ", ".join(_dtype_name(d) for d in contract.tolerances)
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


def _first_accepting(
    chain: Sequence[OpImpl], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[OpImpl, Any]:
    """The first implementation of ``chain`` that does not decline the call, and its result
    (the last one's ``Unsupported``, like any other exception, propagates)."""
    for impl in chain[:-1]:
        try:
            return impl, impl.fn(*args, **kwargs)
        except Unsupported:
            continue
    return chain[-1], chain[-1].fn(*args, **kwargs)


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


# -- reading a dispatch log back -----------------------------------------------------------------


# The fields verify-report reads from each verify record, and what each must be.
_TEXT_FIELDS = ("op", "impl_id", "layer")
_OPTIONAL_TEXT_FIELDS = ("distribution", "version", "dtype", "problem", "worst")
_NUMBER_FIELDS = ("max_abs_error", "max_rel_error", "atol", "rtol")
_COUNT_FIELDS = ("instance", "call")
_VERDICTS = {verdict.value: verdict for verdict in VerifyVerdict}


def _read_log_text(path: Path) -> str:
    """The log's text: a regular file only (a FIFO would block the reader, ``/dev/zero``
    never end), opened without blocking and checked before anything is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise VerifyLogError(f"dispatch log {str(path)!r} not found") from None
    except OSError as exc:
        raise VerifyLogError(f"dispatch log {str(path)!r} cannot be read ({exc})") from None
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise VerifyLogError(
                f"dispatch log {str(path)!r} is not a regular file; expected the file "
                "SGLANG_FL_DISPATCH_LOG wrote"
            )
        try:
            return handle.read().decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise VerifyLogError(f"dispatch log {str(path)!r} cannot be read ({exc})") from None


def _checked_record(record: dict[str, Any], where: str) -> dict[str, Any]:
    """``record`` with its numbers as floats, or :class:`VerifyLogError` naming the field."""

    def bad(name: str, expected: str) -> VerifyLogError:
        shown = repr(record.get(name, "<missing>"))[:80]
        return VerifyLogError(
            f"{where}: verify record field {name!r} is {shown}; expected {expected} (is this "
            "a dispatch log sglang-fl wrote?)"
        )

    checked = dict(record)
    for name in _TEXT_FIELDS:
        if type(record.get(name)) is not str:
            raise bad(name, "a string")
    for name in _OPTIONAL_TEXT_FIELDS:
        if record.get(name) is not None and type(record[name]) is not str:
            raise bad(name, "a string or null")
    for name in _COUNT_FIELDS:
        value = record.get(name)
        if type(value) is not int or value < 0:
            raise bad(name, "a count (an integer >= 0)")
    pid = record.get("pid")
    if pid is not None and type(pid) is not int:
        raise bad("pid", "an integer or null")
    verdict = record.get("verdict")
    if type(verdict) is not str or verdict not in _VERDICTS:
        raise bad("verdict", f"one of {', '.join(_VERDICTS)}")
    checked["verdict"] = _VERDICTS[verdict]
    for name in _NUMBER_FIELDS:
        try:
            checked[name] = number_from_json(record.get(name))
        except ValueError:
            raise bad(name, f"a number, null or one of {', '.join(NON_FINITE)}") from None
    return checked


def read_verify_records(path: str | Path) -> list[dict[str, Any]]:
    """The ``verify`` records of a dispatch log, in file order, each checked field by field.

    Anything that is not such a log (not a regular file, a line that is not a JSON object, a
    verify record with a missing or mistyped field, an unknown verdict) is a
    :class:`VerifyLogError` naming the file and line: exit 2 in ``sglang-fl verify-report``.
    """
    path = Path(path)
    text = _read_log_text(path)
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise VerifyLogError(
                f"{where}: not a JSON record ({exc.msg}); expected the JSON lines "
                "SGLANG_FL_DISPATCH_LOG writes"
            ) from None
        except RecursionError:
            raise VerifyLogError(
                f"{where}: not a dispatch-log record (nested too deeply)"
            ) from None
        if not isinstance(record, dict):
            raise VerifyLogError(
                f"{where}: a JSON {type(record).__name__}, not a record (an object); expected "
                "the JSON lines SGLANG_FL_DISPATCH_LOG writes"
            )
        if record.get("event") == VERIFY_EVENT:
            records.append(_checked_record(record, where))
    if not records:
        raise VerifyLogError(
            f"{path} holds no verify records; run with SGLANG_FL_VERIFY set (e.g. "
            "SGLANG_FL_VERIFY=on) and SGLANG_FL_DISPATCH_LOG pointing at this file"
        )
    return records


def _ordered(value: float) -> float:
    """A NaN error sorts as the largest (``max`` with NaN depends on the order otherwise)."""
    return math.inf if math.isnan(value) else value


def _where(record: Mapping[str, Any]) -> str:
    return f"{record['layer']} #{record['instance']} (pid {record.get('pid')})"


def summarize(records: Sequence[Mapping[str, Any]], log: str) -> VerifySummaryPayload:
    """Per op and implementation: calls checked, the worst error, the verdict, where it broke."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for record in records:
        groups.setdefault((record["op"], record["impl_id"]), []).append(record)
    rows: list[VerifySummaryRow] = []
    for (op, impl_id), group in groups.items():
        failed = [r for r in group if r["verdict"] == VerifyVerdict.FAIL]
        checked = [r for r in group if r["verdict"] != VerifyVerdict.UNCHECKED]
        verdict = (
            VerifyVerdict.FAIL
            if failed
            else VerifyVerdict.PASS
            if checked
            else VerifyVerdict.UNCHECKED
        )
        measured = [r for r in checked if r.get("max_abs_error") is not None]
        worst = max(measured, key=lambda r: _ordered(r["max_abs_error"]), default=None)
        first = failed[0] if failed else None
        rows.append(
            {
                "op": op,
                "impl_id": impl_id,
                "distribution": group[0].get("distribution"),
                "version": group[0].get("version"),
                "calls_checked": len(checked),
                "calls_failed": len(failed),
                "calls_unchecked": len(group) - len(checked),
                "max_abs_error": None if worst is None else worst["max_abs_error"],
                "max_rel_error": max(
                    (r["max_rel_error"] for r in measured if r["max_rel_error"] is not None),
                    key=_ordered,
                    default=None,
                ),
                "worst_dtype": None if worst is None else worst.get("dtype"),
                "atol": None if worst is None else worst.get("atol"),
                "rtol": None if worst is None else worst.get("rtol"),
                "verdict": verdict,
                "first_offending_layer": None if first is None else _where(first),
                "first_problem": None if first is None else first.get("problem"),
            }
        )
    rows.sort(key=lambda row: (row["verdict"] != VerifyVerdict.FAIL, row["op"], row["impl_id"]))
    return {
        "schema_version": SCHEMA_VERSION,
        "log": log,
        "rows": rows,
        "violations": sum(1 for row in rows if row["verdict"] is VerifyVerdict.FAIL),
    }
