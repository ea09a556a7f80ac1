#!/usr/bin/env bash
# The whole test suite (the README's test command): every default nox session, each in a nox
# run of its own, then a table of each session's wall time and status and the total
# (scripts/timed_sessions.py); exit 0 only if every session passed. With arguments it is plain
# nox (`bash scripts/test.sh -s tests`, `-l`, ...).
set -euo pipefail
scripts="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ "$#" -gt 0 ]; then
    exec "$scripts/nox.sh" "$@"
fi
"$scripts/nox.sh" --version >/dev/null  # creates the tools venv (nox) on first use
exec "$scripts/../.venv-tools/bin/python" "$scripts/timed_sessions.py"
