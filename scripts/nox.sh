#!/usr/bin/env bash
# Run nox from a small tools venv that this script creates on first use (.venv-tools/): nox and
# uv, which makes and fills every session's fresh environment (noxfile.py). Nothing else needs
# to be installed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$root/.venv-tools"
python="${PYTHON:-python3}"
if [ ! -x "$tools/bin/nox" ] || [ ! -x "$tools/bin/uv" ]; then
    "$python" -m venv "$tools"
    "$tools/bin/python" -m pip install --quiet --upgrade pip
    # nox >= 2024.10.9: --reuse-venv (scripts/demo.sh); the uv extra puts uv beside nox.
    "$tools/bin/python" -m pip install --quiet "nox[uv]>=2024.10.9"
fi
cd "$root"
exec "$tools/bin/nox" "$@"
