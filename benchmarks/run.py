"""Run every benchmark, write ``results/latest.json`` (+ ``.md`` and the plot), print the tables.

Usually run by ``nox -s bench``, which builds both environments it needs: this interpreter's
(SGLang, the sglang-fl wheels, matplotlib) and a small one for the start-up measurements
(torch, the sglang-fl wheels), passed as ``--startup-python``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import calls
import report
import startup

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--startup-python", required=True, help="python of the start-up venv")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--quick", action="store_true", help="fewer shapes, sizes, repetitions")
    parser.add_argument(
        "--update-readme", action="store_true", help="replace the README's bench section"
    )
    parser.add_argument("--command", default="nox -s bench", help="recorded as how it was run")
    args = parser.parse_args(argv)

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
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(),
        "command": args.command + (" -- --quick" if args.quick else ""),
        "machine": {"cpus": os.cpu_count(), "load_average": list(os.getloadavg())},
        "device": "none: no accelerator lent to this run; CUDA vendor vs sgl_kernel not measured",
        "calls": call_results,
        "startup": startup_results,
    }
    result["targets"] = report.targets(result)
    result["duration_s"] = round(time.perf_counter() - began, 1)

    args.out.mkdir(parents=True, exist_ok=True)
    plot_path = report.plot(result, args.out / "startup.png")
    relative_plot = plot_path.relative_to(ROOT).as_posix() if plot_path else None
    text = report.markdown(result, relative_plot)
    (args.out / "latest.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "latest.md").write_text(text)
    print()
    print(text)
    print(f"wrote {args.out / 'latest.json'}, {args.out / 'latest.md'}", end="")
    print(f", {plot_path}" if plot_path else " (no plot: matplotlib missing)")
    if args.update_readme:
        readme = ROOT / "README.md"
        if report.update_readme(readme, text):
            print(f"updated the bench section of {readme}")
        else:
            print(f"{readme} has no {report.README_START} marker; not updated", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
