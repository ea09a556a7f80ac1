"""``sglang-fl``: which plugins loaded, which kernel won for every op, and why.

Every command has ``--json`` whose shape is documented in docs/reference/cli.md and
versioned by ``schema_version``. A plugin that fails to load is reported, never fatal here.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import io
import json
import os
import platform
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

from . import scaffold
from ._version import __version__
from .config import Settings
from .dispatch.identity import IDENTITY_RULE
from .dispatch.resolve import CandidateOutcome, Resolution
from .errors import NoImplementationError, SglangFlError
from .hook_report import (
    HookReport,
    ImplementationReport,
    firstresult_disagreements,
    hooks_report,
    implementation_flags,
)
from .integrations.sglang.backend_selection import select, selection_named
from .integrations.vllm.compat import vllm_version
from .loader import ENTRY_POINT_GROUP, PluginStatus
from .ops import SELECTIONS, STANDARD_OPS, get_contract
from .ops.attention import SGLANG_ATTENTION_BACKEND
from .ops.graph_runner import SGLANG_GRAPH_RUNNER
from .runtime import Runtime
from .schema import (
    SCHEMA_VERSION,
    ContractJson,
    DecisionJson,
    DoctorPayload,
    ExplainPayload,
    InPlaceJson,
    OpReport,
    OpsPayload,
    PluginsPayload,
    SglangReport,
    TorchReport,
    portable_json,
    provenance_fields,
)
from .verify_report import read_verify_records, summarize


def _runtime() -> Runtime:
    return Runtime(Settings.from_environment(), inspecting=True)


# What a selection shows where an op shows its contract's signature and SGLang layer.
_SELECTION_SIGNATURE = {
    SGLANG_ATTENTION_BACKEND: (
        "factory(model_runner) -> sglang AttentionBackend",
        "--attention-backend sglang_fl",
    ),
    SGLANG_GRAPH_RUNNER: (
        "factory(model_runner) -> sglang decode graph runner",
        "get_graph_runner_cls() of a platform sglang-fl provides",
    ),
}


def _never_built(model_runner: Any, **options: Any) -> Any:
    raise AssertionError("the CLI only inspects the selection; it builds nothing")


def _decide(runtime: Runtime, op_name: str) -> Resolution:
    selection = selection_named(op_name)
    if selection is not None:
        return select(runtime, _never_built, selection)
    return runtime.resolve(op_name)


def _op_report(runtime: Runtime, op_name: str) -> OpReport:
    """One op's (or selection's) decision record, or its error, plus the contract's identity."""
    if op_name in _SELECTION_SIGNATURE:
        signature, sglang_layer = _SELECTION_SIGNATURE[op_name]
    else:
        contract = get_contract(op_name)
        signature, sglang_layer = contract.signature_text(), contract.sglang_layer
    error: str | None = None
    try:
        decision = _decide(runtime, op_name).decision.to_dict()
    except SglangFlError as exc:
        # NoImplementationError carries the decision that rejected every candidate;
        # StrictModeError (an explicit choice that cannot be met) carries none.
        error = str(exc)
        carried = exc.decision if isinstance(exc, NoImplementationError) else None
        decision = carried.to_dict() if carried is not None else _undecided(runtime, op_name)
    return {
        "op": op_name,
        "signature": signature,
        "sglang_layer": sglang_layer,
        "chosen": decision["chosen"],
        "error": error,
        "order": decision["order"],
        "order_source": decision["order_source"],
        "candidates": decision["candidates"],
        "no_kernel": [
            {**provenance_fields(gap.provenance), "reason": gap.reason}
            for gap in (() if op_name in SELECTIONS else runtime.registry.no_kernel(op_name))
        ],
    }


def _undecided(runtime: Runtime, op_name: str) -> DecisionJson:
    """The order an op would have used, for an error that carries no decision."""
    plan = runtime.policy.plan(op_name)
    return {
        "op": op_name,
        "chosen": None,
        "order": list(plan.texts()),
        "order_source": plan.source,
        "candidates": [],
    }


def _emit(args: argparse.Namespace, payload: Mapping[str, Any], text: Callable[[], str]) -> None:
    """``payload`` (one of :mod:`sglang_fl.schema`'s payloads) as JSON, or ``text()``, written
    to the command's own output stream (see :func:`_command_stdout`)."""
    out: TextIO = args.stdout
    rendered = (
        json.dumps(portable_json(payload), indent=2, allow_nan=False) if args.json else text()
    )
    encoding = getattr(out, "encoding", None) or "utf-8"
    # A lone surrogate (or any character the stream cannot encode) is escaped, not fatal.
    out.write(rendered.encode(encoding, "backslashreplace").decode(encoding) + "\n")
    out.flush()


def printable(value: object) -> str:
    """``value`` as one line of text: control characters (a plugin's multi-line error, which
    would forge rows) and lone surrogates escaped as Python writes them (``\\n``, ``\\udc80``)."""
    text = "" if value is None else str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


@contextmanager
def _command_stdout() -> Iterator[TextIO]:
    """The stream a command's output goes to; while open, anything else written to standard
    output (a plugin's ``print()`` at import, a library writing to file descriptor 1) goes to
    standard error, so ``--json`` output stays one JSON document."""
    original = sys.stdout
    try:
        fd, err_fd = original.fileno(), sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test's capture)
        sys.stdout = sys.stderr
        try:
            yield original
        finally:
            sys.stdout = original
        return
    original.flush()
    sys.stderr.flush()
    saved = os.dup(fd)
    out = io.TextIOWrapper(io.FileIO(saved, "w"), encoding=original.encoding, errors="strict")
    os.dup2(err_fd, fd)
    sys.stdout = sys.stderr
    try:
        yield out
    finally:
        sys.stdout = original
        # What a plugin left buffered in a stdout object it kept goes to stderr too.
        for stream in (original, sys.__stdout__, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except (OSError, ValueError):  # closed by the plugin: nothing left to flush
                pass
        os.dup2(saved, fd)
        try:
            out.close()
        except BrokenPipeError:
            _discard(out)


def _discard(out: TextIO) -> None:
    """After a ``BrokenPipeError`` (``sglang-fl ops --json | head -c 10``): send what is left
    to ``os.devnull``, as the Python docs recommend, so the exit flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, out.fileno())
    except (OSError, ValueError):
        pass  # not a real file: nothing is flushed at exit
    finally:
        os.close(devnull)


def format_table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """Left-aligned columns under a dashed rule; ``None`` cells print empty; every cell is
    :func:`printable`, so no value can break a row."""
    cells = [list(map(printable, header)), *[list(map(printable, r)) for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def cmd_plugins(args: argparse.Namespace) -> int:
    runtime = _runtime()
    records = [p.to_dict() for p in runtime.plugins]

    def text() -> str:
        rows = [
            (
                p["name"],
                p["distribution"],
                p["version"],
                p["status"],
                ",".join(p["hooks"]),
                p["error"],
            )
            for p in records
        ]
        out = format_table(rows, ("plugin", "distribution", "version", "status", "hooks", "error"))
        out += f"\n\nidentity: {IDENTITY_RULE}"
        if args.verbose:
            out += "".join(
                f"\n\n{p.name}: {p.details}" for p in runtime.plugins if p.details is not None
            )
        return out

    payload: PluginsPayload = {
        "schema_version": SCHEMA_VERSION,
        "entry_point_group": ENTRY_POINT_GROUP,
        "identity_rule": IDENTITY_RULE,
        "plugins": records,
    }
    _emit(args, payload, text)
    return 0


def cmd_ops(args: argparse.Namespace) -> int:
    runtime = _runtime()
    ops = [_op_report(runtime, op) for op in STANDARD_OPS]
    selections = [_op_report(runtime, name) for name in SELECTIONS]
    reports = [*ops, *selections]

    def text() -> str:
        rows: list[tuple[object, ...]] = []
        for report in reports:
            if report["error"] is not None:
                rows.append((report["op"], "-", "", "", "", "", "", f"ERROR: {report['error']}"))
                continue
            for c in report["candidates"]:
                mark = "*" if c["outcome"] is CandidateOutcome.CHOSEN else ""
                rows.append(
                    (
                        report["op"],
                        mark + c["impl_id"],
                        c["kind"],
                        c["vendor"] or "-",
                        c["priority"],
                        f"{c['distribution']} {c['version']}",
                        "yes" if c["available"] else ("no" if c["available"] is False else "?"),
                        f"{c['outcome']}: {c['reason']}",
                    )
                )
            for gap in report["no_kernel"]:
                provenance = f"{gap['distribution']} {gap['version']}"
                verdict = f"no kernel: {gap['reason']}"
                rows.append((report["op"], "-", "", gap["plugin"], "", provenance, "-", verdict))
        header = (
            "op",
            "impl_id",
            "kind",
            "vendor",
            "priority",
            "provenance",
            "available",
            "verdict",
        )
        return format_table(rows, header) + "\n(* = chosen; `sglang-fl explain OP` for the trace)"

    payload: OpsPayload = {"schema_version": SCHEMA_VERSION, "ops": ops, "selections": selections}
    _emit(args, payload, text)
    return 0 if all(r["error"] is None for r in reports) else 1


def contract_text(contract: ContractJson) -> list[str]:
    """``explain``'s contract section: the contract in words, its rules as formulas, dtypes and
    tolerances, what may be written in place, and every case the kit runs."""
    lines = ["contract:"]
    lines.extend(f"  {line}".rstrip() for line in contract["details"].splitlines())
    if contract["rules"]:
        lines.append("rules:")
        for rule in contract["rules"]:
            wrapped = textwrap.wrap(rule["formula"], 92 - len(rule["name"]))
            lines.append(f"  {rule['name']}: {wrapped[0]}")
            lines.extend(f"  {' ' * len(rule['name'])}  {more}" for more in wrapped[1:])
    if contract["layer_attributes"]:
        lines.append(f"layer (obj) attributes read: {', '.join(contract['layer_attributes'])}")
    tolerances = ", ".join(
        f"{t['dtype']} (atol={t['atol']:g}, rtol={t['rtol']:g})" for t in contract["tolerances"]
    )
    lines.append(f"dtypes: {tolerances}")
    cases = len(contract["cases"])
    lines.append(f"in place (over the kit's {cases} cases):")
    for entry in contract["in_place"]:
        lines.append(f"  {entry['argument']}: {_in_place_verdict(entry, cases)}")
    runs = f" x {len(contract['world_sizes'])} world sizes" if contract["world_sizes"] else ""
    lines.append(
        f"kit: {cases} cases x {len(contract['dtypes'])} dtypes{runs} = {contract['checks']} "
        "checks against the reference"
    )
    if contract["world_sizes"]:
        peers = f", with its peer {', '.join(contract['peers'])}" if contract["peers"] else ""
        sizes = ", ".join(map(str, contract["world_sizes"]))
        lines.append(f"  a collective: each case runs on {sizes} spawned ranks{peers}")
    lines.extend(f"  {name}" for name in contract["cases"])
    return lines


def _in_place_verdict(entry: InPlaceJson, cases: int) -> str:
    """One argument's in-place rule, as the kit's cases state it."""
    outputs = ", ".join(str(i) for i in entry["outputs"])
    parts = []
    if entry["written"]:
        every = "every case" if entry["written"] == cases else f"{entry['written']} cases"
        parts.append(f"written in place and returned as output {outputs} ({every})")
    if entry["untouched"]:
        every = "every case" if entry["untouched"] == cases else f"{entry['untouched']} cases"
        parts.append(f"must stay untouched ({every})")
    if entry["written"] + entry["untouched"] < cases:
        parts.append("unchecked in the other cases")
    return "; ".join(parts)


def cmd_explain(args: argparse.Namespace) -> int:
    runtime = _runtime()
    report = _op_report(runtime, args.op)
    contract = None if args.op in SELECTIONS else get_contract(args.op).describe()

    def text() -> str:
        lines = [f"{report['op']}: {report['signature']}  (SGLang layer {report['sglang_layer']})"]
        if contract is not None:
            lines.append(f"  {contract['summary']}")
        lines.extend(_decision_text(report))
        if contract is not None:
            lines.extend(["", *contract_text(contract)])
        return "\n".join(map(printable, lines))  # one line each, whatever a plugin wrote

    payload: ExplainPayload = {"schema_version": SCHEMA_VERSION, **report, "contract": contract}
    _emit(args, payload, text)
    return 0 if report["error"] is None else 1


def _decision_text(report: OpReport) -> list[str]:
    """``explain``'s decision section: the order, then every candidate's verdict."""
    lines = []
    if report["error"] is not None:
        lines.append(f"  no implementation: {report['error']}")
        return lines
    lines.append(f"  order: {' > '.join(report['order'])}  (from {report['order_source']})")
    for c in report["candidates"]:
        lines.append(
            f"  {c['outcome']:>8}  {c['impl_id']}  [{c['kind']}, vendor={c['vendor']}, "
            f"priority={c['priority']}, from {c['plugin']} ({c['distribution']} "
            f"{c['version']})]"
        )
        lines.append(f"            {c['reason']}")
        if c["availability_reason"] and c["outcome"] is not CandidateOutcome.REJECTED:
            lines.append(f"            availability: {c['availability_reason']}")
    for gap in report["no_kernel"]:
        lines.append(
            f"  no kernel from {gap['plugin']} ({gap['distribution']} {gap['version']}): "
            f"{gap['reason']}"
        )
    return lines


def _torch_report() -> TorchReport:
    try:
        import torch
    except ImportError as exc:
        return {"version": None, "error": str(exc)}
    cuda_available = torch.cuda.is_available()
    return {
        "version": torch.__version__,
        "cuda": {
            "built_with": torch.version.cuda,
            "available": cuda_available,
            "device_count": torch.cuda.device_count() if cuda_available else 0,
        },
        # Not imported: an installed torch_npu without CANN breaks the process that imports it.
        "torch_npu_installed": importlib.util.find_spec("torch_npu") is not None,
    }


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _sglang_report(runtime: Runtime, problems: list[str]) -> SglangReport:
    """SGLang's version, the platform sglang-fl offers it here and the attention backend an
    engine gets; asking SGLang's own accelerator probes imports SGLang (a few seconds)."""
    report: SglangReport = {
        "version": _installed_version("sglang"),
        "platform": None,
        "platform_source": None,
        "platform_reason": "SGLang is not installed",
        "attention_backend": None,
        "attention_backend_reason": "SGLang is not installed",
        "attention_implementation": None,
    }
    if report["version"] is None:
        return report
    from .integrations.sglang.platform_choice import choose_platform, default_attention_backend

    try:
        choice = choose_platform(runtime)
    except SglangFlError as exc:  # a plugin's bad platform answer under SGLANG_FL_STRICT=1
        problems.append(f"SGLang platform: {exc}")
        report["platform_reason"] = report["attention_backend_reason"] = str(exc)
        return report
    backend, why = default_attention_backend(choice, runtime)
    report["platform"], report["platform_source"] = choice.path, choice.source.value
    report["platform_reason"] = choice.reason
    report["attention_backend"], report["attention_backend_reason"] = backend, why
    if backend == "sglang_fl":
        try:
            chosen = _decide(runtime, SGLANG_ATTENTION_BACKEND).decision.chosen
        except SglangFlError as exc:
            problems.append(f"selection {SGLANG_ATTENTION_BACKEND!r}: {exc}")
        else:
            report["attention_implementation"] = chosen.impl_id
    return report


def cmd_doctor(args: argparse.Namespace) -> int:
    runtime = _runtime()
    problems = [
        f"plugin {p.name!r} ({p.distribution}) failed: {p.error}"
        for p in runtime.plugins
        if p.status is PluginStatus.FAILED
    ]
    if problems and runtime.config.strict:
        problems.append("SGLANG_FL_STRICT=1: SGLang start-up would abort on the failure(s) above")
    dispatch_log = runtime.config.dispatch_log_problem()
    if dispatch_log is not None:
        problems.append(f"{dispatch_log}; sglang-fl's SGLang plugin would not start")
    problems.extend(runtime.config.warnings)  # unknown variables, an empty allow list
    problems.extend(runtime.setting_warnings)
    for op_name in STANDARD_OPS:
        try:
            runtime.resolve(op_name)
        except SglangFlError as exc:
            problems.append(f"op {op_name!r}: {exc}")
    problems.extend(firstresult_disagreements(hooks_report(runtime)))
    sglang = _sglang_report(runtime, problems)
    payload: DoctorPayload = {
        "schema_version": SCHEMA_VERSION,
        "sglang_fl": {"version": __version__, "module": __file__},
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "platform": platform.platform(),
        "torch": _torch_report(),
        "sglang": sglang,
        "vllm": {"version": vllm_version()},
        "configuration": runtime.config.to_dict(),
        "plugins": {
            status.value: [p.name for p in runtime.plugins if p.status is status]
            for status in PluginStatus
        },
        "problems": problems,
    }

    def text() -> str:
        torch_info = payload["torch"]
        lines = [
            f"sglang-fl {__version__}  ({__file__})",
            f"python    {payload['python']['version']}  ({sys.executable})",
            f"platform  {payload['platform']}",
            f"torch     {torch_info.get('version')}  cuda: {torch_info.get('cuda')}  "
            f"torch_npu installed: {torch_info.get('torch_npu_installed')}",
            f"sglang    {sglang['version'] or 'not installed'}",
            *_sglang_lines(sglang),
            *([f"vllm      {payload['vllm']['version']}"] if payload["vllm"]["version"] else []),
            f"config    file: {payload['configuration']['config_file'] or '(none)'}",
        ]
        for key, entry in payload["configuration"]["settings"].items():
            lines.append(f"  {key:16} = {entry['value']!r:30} ({entry['source']})")
        for status, names in payload["plugins"].items():
            lines.append(f"plugins {status:9} {', '.join(names) or '-'}")
        lines.append("problems: none" if not problems else "problems:")
        lines.extend(f"  - {p}" for p in problems)
        return "\n".join(map(printable, lines))  # one line each, whatever a plugin wrote

    _emit(args, payload, text)
    return 0 if not problems else 1


def _sglang_lines(sglang: SglangReport) -> list[str]:
    """``doctor``'s two lines under the SGLang version: platform and attention backend."""
    if sglang["version"] is None:
        return []
    platform_name = sglang["platform"] or "SGLang's own"
    backend = sglang["attention_backend"] or "chosen by SGLang"
    if sglang["attention_implementation"]:
        backend += f" -> {sglang['attention_implementation']}"
    return [
        f"  platform           {platform_name}  ({sglang['platform_reason']})",
        f"  attention backend  {backend}  ({sglang['attention_backend_reason']})",
    ]


def cmd_hooks(args: argparse.Namespace) -> int:
    report = hooks_report(_runtime(), args.hook)

    def where(i: ImplementationReport) -> tuple[str, str, str]:
        return (f"{i['distribution']} {i['version']}", i["function"], f"{i['file']}:{i['line']}")

    def answer(hook: HookReport, plugin: str) -> str:
        found = [a for a in hook["answers"] or () if a["plugin"] == plugin]
        if not found:
            return "-"
        if found[0]["problem"] is not None:
            return f"ignored: {found[0]['problem']}"
        return repr(found[0]["answer"]) + (" (wins)" if plugin == hook["winner"] else "")

    def text() -> str:
        blocks = []
        for hook in report["hooks"]:
            kind = "  [firstresult]" if hook["firstresult"] else ""
            head = f"{hook['name']}({', '.join(hook['arguments'])}){kind}\n  {hook['doc']}\n"
            header = ["#", "plugin", "provenance", "function", "location", "flags"]
            rows: list[list[object]] = []
            for n, i in enumerate(hook["implementations"], 1):
                rows.append([n, i["plugin"], *where(i), ",".join(implementation_flags(i))])
                if hook["answers"] is not None:
                    rows[-1].append(answer(hook, i["plugin"]))
            header += ["answer"] if hook["answers"] is not None else []
            table = format_table(rows, header) if rows else "(no implementation)"
            blocks.append(head + textwrap.indent(table, "  "))
        if report["unmatched"]:
            rows = [
                [u["hook"], u["plugin"], *where(u), ",".join(implementation_flags(u))]
                for u in report["unmatched"]
            ]
            header = ["hook", "plugin", "provenance", "function", "location", "flags"]
            table = format_table(rows, header)
            blocks.append("implementations matching no hook specification\n" + table)
        if report["unregistered_plugins"]:
            rows = [
                [p["name"], f"{p['distribution']} {p['version']}", p["status"], p["error"]]
                for p in report["unregistered_plugins"]
            ]
            table = format_table(rows, ["plugin", "provenance", "status", "error"])
            blocks.append("plugins that never registered (they implement nothing)\n" + table)
        return "\n\n".join(blocks) + "\n\n(# = call order: pluggy calls 1 first)"

    _emit(args, {"schema_version": SCHEMA_VERSION, **report}, text)
    return 0


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def cmd_verify_report(args: argparse.Namespace) -> int:
    summary = summarize(read_verify_records(args.log), args.log)

    def text() -> str:
        rows = [
            (
                row["op"],
                row["impl_id"],
                f"{row['distribution']} {row['version']}",
                row["calls_checked"],
                row["calls_failed"],
                _number(row["max_abs_error"]),
                _number(row["max_rel_error"]),
                f"{row['worst_dtype']} atol={_number(row['atol'])} rtol={_number(row['rtol'])}",
                row["verdict"],
                row["first_offending_layer"] or "-",
            )
            for row in summary["rows"]
        ]
        header = (
            "op",
            "impl_id",
            "provenance",
            "checked",
            "failed",
            "max abs",
            "max rel",
            "tolerance (worst call)",
            "verdict",
            "first offending layer",
        )
        lines = [format_table(rows, header)]
        for row in summary["rows"]:
            if row["first_problem"]:
                lines.append(f"{row['op']} {row['impl_id']}: {row['first_problem']}")
            elif row["calls_unchecked"]:
                lines.append(f"{row['op']} {row['impl_id']}: {row['calls_unchecked']} unchecked")
        verdict = f"{summary['violations']} implementation(s) out of tolerance"
        lines.append(verdict if summary["violations"] else "every checked call within tolerance")
        return "\n".join(lines)

    _emit(args, summary, text)
    return 1 if summary["violations"] else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-fl",
        description="Inspect sglang-fl: loaded plugins, chosen kernels, and why.",
    )
    parser.add_argument("--version", action="version", version=f"sglang-fl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str, handler: Callable[[argparse.Namespace], int], help_text: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(handler=handler, inspects=True)
        return p

    plugins = command("plugins", cmd_plugins, "list vendor plugins and how they loaded")
    plugins.add_argument("--verbose", "-v", action="store_true", help="show tracebacks")
    command("ops", cmd_ops, "every op, every candidate, and which one is chosen")
    explain = command(
        "explain", cmd_explain, "one op's decision trace and its whole contract (what the kit runs)"
    )
    explain.add_argument("op", help=f"one of: {', '.join((*STANDARD_OPS, *SELECTIONS))}")
    command("doctor", cmd_doctor, "environment, configuration and plugin problems")
    hooks = command("hooks", cmd_hooks, "every hook, its implementations in call order, answers")
    hooks.add_argument("hook", nargs="?", help="only this hook")
    verify = command(
        "verify-report",
        cmd_verify_report,
        "verify mode's findings in a dispatch log, per op and implementation (exit 1: violation)",
    )
    verify.add_argument(
        "log", help="the SGLANG_FL_DISPATCH_LOG file of a run with SGLANG_FL_VERIFY"
    )
    scaffold.add_cli(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not getattr(args, "inspects", False):  # e.g. new-vendor: no plugin code runs
        return _run(args)
    with _command_stdout() as args.stdout:
        try:
            return _run(args)
        except BrokenPipeError:  # the reader went away: not an error of ours
            _discard(args.stdout)
            return 1


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.handler(args))
    except SglangFlError as exc:  # bad input; anything else is a bug and keeps its traceback
        print(f"sglang-fl: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
