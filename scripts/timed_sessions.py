"""Run every default nox session as its own nox invocation and print each one's wall time.

``scripts/test.sh`` (the README's test command, and so ``.ci/run``) runs this with the tools
venv's Python. nox's own summary says which sessions passed but not how long each took, and the
suite has a time budget (``BUDGET_S``, on a 2-core machine). So the sessions nox selects by
default (``nox --list --json``) run one by one, each in a ``nox --session NAME`` of its own; a
failed session does not stop the others, and at the end a table gives each session's seconds and
status, then the total. The exit status is 0 only if sessions ran and every one passed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOX = [sys.executable, "-m", "nox"]
# The whole suite's wall-time budget on a 2-core machine (see the README's test command).
BUDGET_S = 25 * 60


@dataclass(frozen=True)
class Outcome:
    session: str
    seconds: float
    status: str  # "passed", "failed (exit N)" or "interrupted"


def default_sessions() -> list[str]:
    """The names nox runs when given none (``nox.options.sessions``), parametrized ones expanded."""
    listed = subprocess.run(
        [*NOX, "--list", "--json"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if listed.returncode != 0:
        raise SystemExit(f"`nox --list --json` failed (exit {listed.returncode}):\n{listed.stderr}")
    try:
        entries = json.loads(listed.stdout)
        return [str(entry["session"]) for entry in entries]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        message = f"`nox --list --json` printed no session list ({error}):\n{listed.stdout}"
        raise SystemExit(message) from error


def run_session(name: str, extra: list[str]) -> Outcome:
    """One ``nox --session name``, its output streamed as it comes."""
    print(f"\n=== nox --session {name} ===", flush=True)
    start = time.monotonic()
    try:
        code = subprocess.run([*NOX, "--session", name, *extra], cwd=ROOT, check=False).returncode
    except KeyboardInterrupt:
        return Outcome(name, time.monotonic() - start, "interrupted")
    seconds = time.monotonic() - start
    return Outcome(name, seconds, "passed" if code == 0 else f"failed (exit {code})")


def table(outcomes: list[Outcome]) -> str:
    """Session, seconds and status per row, then the total against the budget."""
    width = max([len("session"), *(len(o.session) for o in outcomes)])
    lines = [f"{'session':<{width}}  {'seconds':>8}  status", f"{'-' * width}  {'-' * 8}  ------"]
    lines += [f"{o.session:<{width}}  {o.seconds:>8.1f}  {o.status}" for o in outcomes]
    total = sum(o.seconds for o in outcomes)
    verdict = "within" if total <= BUDGET_S else "OVER"
    lines.append(f"{'total':<{width}}  {total:>8.1f}  {total / 60:.1f} min, {verdict} the budget")
    lines.append(f"(budget: {BUDGET_S // 60} min on a 2-core machine)")
    return "\n".join(lines)


def main(extra: list[str]) -> int:
    """Run the default sessions (``extra`` goes to each nox call); 0 only if all passed."""
    sessions = default_sessions()
    if not sessions:
        print("nox lists no default sessions: nothing was tested", file=sys.stderr)
        return 1
    outcomes: list[Outcome] = []
    for name in sessions:
        outcome = run_session(name, extra)
        outcomes.append(outcome)
        if outcome.status == "interrupted":
            break
    print("\n=== session times ===\n" + table(outcomes), flush=True)
    not_run = sessions[len(outcomes) :]
    if not_run:
        print(f"not run: {', '.join(not_run)}")
    failed = [o.session for o in outcomes if o.status != "passed"]
    if failed or not_run:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 130 if outcomes[-1].status == "interrupted" else 1
    print(f"all {len(outcomes)} sessions passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
