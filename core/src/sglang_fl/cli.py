"""``sglang-fl``: which plugins loaded, which kernel won for every op, and why.

Every command has ``--json`` whose shape is documented in the README ("Inspection") and
versioned by ``schema_version``. A plugin that fails to load is reported, never fatal here.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import platform
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import __version__, scaffold
from .config import Settings
from .errors import NoImplementationError, SglangFlError
from .loader import ENTRY_POINT_GROUP, FAILED
from .ops import STANDARD_OPS, get_contract
from .runtime import Runtime

SCHEMA_VERSION = 1


def _runtime() -> Runtime:
    return Runtime(Settings.from_environment(), inspecting=True)


def _op_report(runtime: Runtime, op_name: str) -> dict[str, Any]:
    """One op's decision record, or its error, plus the contract's identity."""
    contract = get_contract(op_name)
    report: dict[str, Any] = {
        "op": op_name,
        "signature": contract.signature_text(),
        "sglang_layer": contract.sglang_layer,
        "no_kernel": [
            {
                "plugin": gap.provenance.plugin,
                "distribution": gap.provenance.distribution,
                "version": gap.provenance.version,
                "reason": gap.reason,
            }
            for gap in runtime.registry.no_kernel(op_name)
        ],
    }
    try:
        decision = runtime.resolve(op_name).decision
    except NoImplementationError as exc:
        if exc.decision is not None:
            return {**report, **exc.decision.to_dict(), "error": str(exc)}
        failure: SglangFlError = exc
    except SglangFlError as exc:  # StrictModeError: an explicit choice that cannot be met
        failure = exc
    else:
        return {**report, **decision.to_dict(), "error": None}
    return {
        **report,
        "chosen": None,
        "order": [str(token) for token in runtime.policy.order_for(op_name)],
        "order_source": runtime.policy.order_source(op_name),
        "candidates": [],
        "error": str(failure),
    }


def _emit(args: argparse.Namespace, payload: dict[str, Any], text: Callable[[], str]) -> None:
    if args.json:
        print(json.dumps({"schema_version": SCHEMA_VERSION, **payload}, indent=2))
    else:
        print(text())


def format_table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """Left-aligned columns under a dashed rule; ``None`` cells print empty."""
    cells = [list(map(str, header)), *[["" if c is None else str(c) for c in r] for r in rows]]
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
        if args.verbose:
            out += "".join(
                f"\n\n{p.name}: {p.details}" for p in runtime.plugins if p.details is not None
            )
        return out

    _emit(args, {"entry_point_group": ENTRY_POINT_GROUP, "plugins": records}, text)
    return 0


def cmd_ops(args: argparse.Namespace) -> int:
    runtime = _runtime()
    reports = [_op_report(runtime, op) for op in STANDARD_OPS]

    def text() -> str:
        rows = []
        for report in reports:
            if report["error"] is not None:
                rows.append((report["op"], "-", "", "", "", "", "", f"ERROR: {report['error']}"))
                continue
            for c in report["candidates"]:
                mark = "*" if c["outcome"] == "chosen" else ""
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

    _emit(args, {"ops": reports}, text)
    return 0 if all(r["error"] is None for r in reports) else 1


def cmd_explain(args: argparse.Namespace) -> int:
    runtime = _runtime()
    report = _op_report(runtime, args.op)

    def text() -> str:
        lines = [f"{report['op']}: {report['signature']}  (SGLang layer {report['sglang_layer']})"]
        if report["error"] is not None:
            lines.append(f"  no implementation: {report['error']}")
            return "\n".join(lines)
        lines.append(f"  order: {' > '.join(report['order'])}  (from {report['order_source']})")
        for c in report["candidates"]:
            lines.append(
                f"  {c['outcome']:>8}  {c['impl_id']}  [{c['kind']}, vendor={c['vendor']}, "
                f"priority={c['priority']}, from {c['plugin']} ({c['distribution']} "
                f"{c['version']})]"
            )
            lines.append(f"            {c['reason']}")
            if c["availability_reason"] and c["outcome"] != "rejected":
                lines.append(f"            availability: {c['availability_reason']}")
        for gap in report["no_kernel"]:
            lines.append(
                f"  no kernel from {gap['plugin']} ({gap['distribution']} {gap['version']}): "
                f"{gap['reason']}"
            )
        return "\n".join(lines)

    _emit(args, report, text)
    return 0 if report["error"] is None else 1


def _torch_report() -> dict[str, Any]:
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


def cmd_doctor(args: argparse.Namespace) -> int:
    runtime = _runtime()
    problems = [
        f"plugin {p.name!r} ({p.distribution}) failed: {p.error}"
        for p in runtime.plugins
        if p.status == FAILED
    ]
    if problems and runtime.config.strict:
        problems.append("SGLANG_FL_STRICT=1: SGLang start-up would abort on the failure(s) above")
    for op_name in STANDARD_OPS:
        try:
            runtime.resolve(op_name)
        except SglangFlError as exc:
            problems.append(f"op {op_name!r}: {exc}")
    payload = {
        "sglang_fl": {"version": __version__, "module": __file__},
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "platform": platform.platform(),
        "torch": _torch_report(),
        "sglang": {"version": _installed_version("sglang")},
        "configuration": runtime.config.to_dict(),
        "plugins": {
            status: [p.name for p in runtime.plugins if p.status == status]
            for status in ("loaded", "failed", "disabled")
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
            f"sglang    {payload['sglang']['version'] or 'not installed'}",
            f"config    file: {payload['configuration']['config_file'] or '(none)'}",
        ]
        for key, entry in payload["configuration"]["settings"].items():
            lines.append(f"  {key:16} = {entry['value']!r:30} ({entry['source']})")
        for status, names in payload["plugins"].items():
            lines.append(f"plugins {status:9} {', '.join(names) or '-'}")
        lines.append("problems: none" if not problems else "problems:")
        lines.extend(f"  - {p}" for p in problems)
        return "\n".join(lines)

    _emit(args, payload, text)
    return 0 if not problems else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-fl",
        description="Inspect sglang-fl: loaded plugins, chosen kernels, and why.",
    )
    parser.add_argument("--version", action="version", version=f"sglang-fl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, handler: Callable[[argparse.Namespace], int], help_text: str):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(handler=handler)
        return p

    plugins = command("plugins", cmd_plugins, "list vendor plugins and how they loaded")
    plugins.add_argument("--verbose", "-v", action="store_true", help="show tracebacks")
    command("ops", cmd_ops, "every op, every candidate, and which one is chosen")
    explain = command("explain", cmd_explain, "the decision trace of one op")
    explain.add_argument("op", help=f"one of: {', '.join(STANDARD_OPS)}")
    command("doctor", cmd_doctor, "environment, configuration and plugin problems")
    scaffold.add_cli(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except (SglangFlError, KeyError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"sglang-fl: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
