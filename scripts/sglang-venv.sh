#!/usr/bin/env bash
# An SGLang venv on the CPU for developing a vendor wheel: SGLang 0.5.23 and its CPU run-time
# needs (requirements/sglang-cpu.txt), this checkout's core and each PROJECT_DIR given (your
# vendor project) installed editable, kept at .nox/sglang_venv and reused by the next run.
# Usage: bash scripts/sglang-venv.sh [PROJECT_DIR...]; then . .nox/sglang_venv/bin/activate
set -euo pipefail
projects=()
for project in "$@"; do
    projects+=("$(cd "$project" && pwd)")  # absolute: nox runs from the repository root
done
exec "$(dirname "${BASH_SOURCE[0]}")/nox.sh" --reuse-venv=yes -s sglang_venv -- ${projects[@]+"${projects[@]}"}
