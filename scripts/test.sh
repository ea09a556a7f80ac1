#!/usr/bin/env bash
# The whole test suite (the README's test command): every default nox session.
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/nox.sh" "$@"
