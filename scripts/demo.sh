#!/usr/bin/env bash
# The main job: a real chat model (SmolLM2-135M-Instruct) answering on the CPU through sglang-fl,
# then the dispatch report. Creates (first run) or reuses the demo environment: SGLang 0.5.23 and
# this checkout's core wheel; fetches and converts the model once into ~/.cache/sglang-fl/models/.
# Extra arguments go to scripts/demo.py: --prompt "your question", --max-new-tokens N, --dtype
# bfloat16, --quant (serve it quantized to W8A8 int8 and have transformers judge the answers:
# its greedy tokens or near-ties of them, teacher-forced; tests/sglang/teacher_forced.py).
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/nox.sh" --reuse-venv=yes -s demo -- "$@"
