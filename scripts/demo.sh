#!/usr/bin/env bash
# The main job: SGLang generating on the CPU through sglang-fl, then the dispatch report.
# Creates (first run) or reuses the demo environment: SGLang 0.5.23 and this checkout's core
# wheel; builds a tiny model offline. Extra arguments go to scripts/demo.py (--arch qwen2, ...).
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/nox.sh" --reuse-venv=yes -s demo -- "$@"
