#!/usr/bin/env bash
# Run nox from a small tools venv that this script creates on first use (.venv-tools/).
# Every session then builds its own fresh environment; nothing else needs to be installed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$root/.venv-tools"
python="${PYTHON:-python3}"
if [ ! -x "$tools/bin/nox" ]; then
    "$python" -m venv "$tools"
    "$tools/bin/python" -m pip install --quiet --upgrade pip
    "$tools/bin/python" -m pip install --quiet "nox>=2024.10.9"  # --reuse-venv (scripts/demo.sh)
fi
cd "$root"
exec "$tools/bin/nox" "$@"
