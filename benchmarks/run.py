"""Run every benchmark, write ``results/latest.json`` (+ ``.md`` and the plot), print the tables.

Usually run by ``nox -s bench``, which builds both environments it needs: this interpreter's
(SGLang, the sglang-fl wheels, the real model's needs, matplotlib) and a small one for the
start-up measurements (torch, the sglang-fl wheels), passed as ``--startup-python``.
``--only e2e`` (or ``calls``, ``startup``, ``attention``, ``collectives``,
``linear_attention``, ``quantization``, ``graphs``; repeatable) runs some parts only: the
per-call and start-up parts write ``latest.*``, the end-to-end part ``e2e.*``, the others
``<part>.*`` (the attention part: the real model with ``--attention-backend sglang_fl`` vs
``torch_native``, plus ``attention.py``'s bookkeeping; ``collectives.py``,
``linear_attention.py``, ``quantization.py`` and ``graphs.py`` (decode compiled by SGLang's CPU
graph runner vs eager, through sglang-fl, and SGLang's own) run as subprocesses, their output
kept); with ``--update-docs`` each also rewrites its marked section of the documentation's page,
``docs/benchmarks.md`` (the plot is copied next to it, to ``docs/assets/``, since the site
holds only what lies under ``docs/``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import calls
import e2e
import report
import startup

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PARTS = (
    "calls",
    "startup",
    "e2e",
    "attention",
    "collectives",
    "linear_attention",
    "quantization",
    "graphs",
)
# Parts that are a script of their own, run as a subprocess (their internals are theirs):
# part -> (script, its arguments, its --quick arguments).
SCRIPT_PARTS = {
    "collectives": ("collectives.py", ["--reps", "30"], ["--reps", "10"]),
    "linear_attention": ("linear_attention.py", [], ["--quick"]),
    "quantization": ("quantization.py", [], ["--quick"]),
    "graphs": ("graphs.py", [], ["--quick"]),
}
SCRIPT_TIMEOUT_S = 7200  # the graphs part compiles a decode step per batch size first
DOC_ATTENTION = ("<!-- bench-attention:start -->", "<!-- bench-attention:end -->")
DOC = ROOT / "docs" / "benchmarks.md"
DOC_PLOT = ROOT / "docs" / "assets" / "startup.png"


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def _machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "load_average": list(os.getloadavg())}


def _date() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _write(out: Path, stem: str, result: dict[str, Any], text: str) -> None:
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{stem}.md").write_text(text)
    print()
    print(text)
    print(f"wrote {out / f'{stem}.json'}, {out / f'{stem}.md'}", flush=True)


def _update_docs(text: str, start: str, end: str) -> None:
    if report.update_section(DOC, text, start, end):
        print(f"updated the {start} section of {DOC}")
    else:
        print(f"{DOC} has no {start} ... {end} markers; not updated", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--startup-python", help="python of the start-up venv (start-up part)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--quick", action="store_true", help="fewer shapes, sizes, repetitions")
    parser.add_argument(
        "--only", action="append", choices=PARTS, help="run only this part (repeatable)"
    )
    parser.add_argument(
        "--update-docs",
        "--update-readme",  # its name when the tables lived in the README
        dest="update_docs",
        action="store_true",
        help=f"replace the bench sections of {DOC.relative_to(ROOT)}",
    )
    parser.add_argument("--command", default="nox -s bench", help="recorded as how it was run")
    args = parser.parse_args(argv)
    parts = set(args.only or PARTS)
    if "startup" in parts and not args.startup_python:
        parser.error("the start-up part needs --startup-python (nox -s bench passes it)")
    options = (["--quick"] if args.quick else []) + [f"--only {part}" for part in args.only or ()]
    command = args.command + (" -- " + " ".join(options) if options else "")
    args.out.mkdir(parents=True, exist_ok=True)

    if parts & {"calls", "startup"}:
        if parts & {"calls", "startup"} != {"calls", "startup"}:
            parser.error("the per-call and start-up parts make one table: run both or neither")
        _calls_and_startup(args, command)
    if "e2e" in parts:
        print("end-to-end decode throughput on a real model (part 4):", flush=True)
        began = time.perf_counter()
        result = {
            "schema_version": 1,
            "date": _date(),
            "commit": _commit(),
            "command": command,
            "machine": _machine(),
            "e2e": e2e.run(repetitions=3 if args.quick else 5),
        }
        result["load_average_end"] = list(os.getloadavg())
        result["duration_s"] = round(time.perf_counter() - began, 1)
        text = report.e2e_markdown(result)
        _write(args.out, "e2e", result, text)
        if args.update_docs:
            _update_docs(text, report.DOC_E2E_START, report.DOC_E2E_END)
    if "attention" in parts:
        _attention(args, command)
    for part in SCRIPT_PARTS:
        if part in parts:
            _script_part(args, command, part)
    return 0


def _script(name: str, arguments: list[str]) -> dict[str, Any]:
    """``benchmarks/<name>`` in a subprocess of this interpreter: its output and exit status."""
    began = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(HERE / name), *arguments],
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        print(proc.stderr[-4000:], file=sys.stderr)
    return {
        "script": f"benchmarks/{name} {' '.join(arguments)}".strip(),
        "returncode": proc.returncode,
        "stdout": proc.stdout,
        "duration_s": round(time.perf_counter() - began, 1),
    }


def _header(command: str) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "date": _date(),
        "commit": _commit(),
        "command": command,
        "machine": _machine(),
    }


def _script_part(args: argparse.Namespace, command: str, part: str) -> None:
    name, full, quick = SCRIPT_PARTS[part]
    print(f"{part} ({name}):", flush=True)
    run = _script(name, quick if args.quick else full)
    result = {**_header(command), part: run}
    text = (
        f"### {part}\n\n{result['date']}, commit {result['commit']}, `{run['script']}` "
        f"(exit {run['returncode']}, {run['duration_s']} s)\n\n```\n{run['stdout'].rstrip()}\n```\n"
    )
    _write(args.out, part, result, text)
    if run["returncode"] != 0:
        raise SystemExit(f"{name} failed (exit {run['returncode']})")


def _attention(args: argparse.Namespace, command: str) -> None:
    print("attention backends on the real model: sglang_fl vs torch_native:", flush=True)
    began = time.perf_counter()
    measured = e2e.run_attention(repetitions=3 if args.quick else 5)
    bookkeeping = _script("attention.py", ["--reps", "7" if args.quick else "15"])
    result = {
        **_header(command),
        "attention": measured,
        "bookkeeping": bookkeeping,
        "duration_s": round(time.perf_counter() - began, 1),
    }
    rows = [
        f"| {what} | {measured[f'{what}_tokens_per_s']['sglang_fl']['median']:.1f} | "
        f"{measured[f'{what}_tokens_per_s']['torch_native']['median']:.1f} | "
        f"{measured['ratios'][what]:.3f}x |"
        for what in ("decode", "prefill")
    ]
    text = "\n".join(
        [
            "### Attention backends on the real model",
            "",
            f"{result['date']}, commit {result['commit']}, `{command}`; {measured['model']} "
            f"{measured['dtype']}, batch {measured['batch']}, {measured['new_tokens']} new tokens, "
            f"{measured['repetitions']} interleaved repetitions (medians; target "
            f">= {measured['target']}x: {'met' if measured['met'] else 'NOT met'}).",
            "",
            "| tokens/s | sglang_fl (reference kernels) | torch_native | ratio |",
            "|---|---:|---:|---:|",
            *rows,
            "",
            f"The backend's own bookkeeping (`{bookkeeping['script']}`, exit "
            f"{bookkeeping['returncode']}):",
            "",
            "```",
            bookkeeping["stdout"].rstrip(),
            "```",
            "",
        ]
    )
    _write(args.out, "attention", result, text)
    if args.update_docs:
        _update_docs(text, *DOC_ATTENTION)


def _calls_and_startup(args: argparse.Namespace, command: str) -> None:
    began = time.perf_counter()
    print("per-call cost (parts 1 and 3):", flush=True)
    call_results = calls.run(repetitions=11 if args.quick else 31, quick=args.quick)
    print("start-up (part 2):", flush=True)
    startup_results = startup.run(
        args.startup_python,
        sys.executable,
        sizes=(50, 2000) if args.quick else (50, 500, 2000),
        repetitions=3 if args.quick else 5,
        wall_repetitions=2 if args.quick else 3,
    )
    result: dict[str, Any] = {
        "schema_version": 1,
        "date": _date(),
        "commit": _commit(),
        "command": command,
        "machine": _machine(),
        "device": "none: no accelerator lent to this run; CUDA vendor vs sgl_kernel not measured",
        "calls": call_results,
        "startup": startup_results,
    }
    result["targets"] = report.targets(result)
    result["duration_s"] = round(time.perf_counter() - began, 1)

    plot_path = report.plot(result, args.out / "startup.png")
    relative_plot = plot_path.relative_to(ROOT).as_posix() if plot_path else None
    text = report.markdown(result, relative_plot)
    _write(args.out, "latest", result, text)
    if not plot_path:
        print("no plot: matplotlib missing")
    if args.update_docs:
        doc_plot = None
        if plot_path:
            DOC_PLOT.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(plot_path, DOC_PLOT)
            doc_plot = DOC_PLOT.relative_to(DOC.parent).as_posix()
        _update_docs(report.markdown(result, doc_plot), report.DOC_START, report.DOC_END)


if __name__ == "__main__":
    sys.exit(main())
