"""``sglang-fl verify-report``'s reader: a dispatch log's verify records, summarised.

Verify mode (:mod:`sglang_fl.verify`) writes one ``verify`` record per checked call into the
dispatch log; this module reads them back, checking every field it uses (a log is a file a
user hands over, not trusted input), and summarises them per op and implementation.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import SglangFlError
from .schema import (
    NON_FINITE,
    SCHEMA_VERSION,
    VerifySummaryPayload,
    VerifySummaryRow,
    number_from_json,
)
from .verify import VERIFY_EVENT, VerifyVerdict

__all__ = ["VerifyLogError", "read_verify_records", "summarize"]


class VerifyLogError(SglangFlError):
    """A dispatch log that cannot be summarised: missing, malformed, or without verify records."""


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
