"""Prove the import contracts catch the edges they exist for: plant each in a copy, lint it.

Usage: ``python scripts/check_import_contracts.py`` (import-linter installed; run by
``nox -s lint``). The repository's sources are copied to a temporary directory, the copy is
linted as it is (every contract kept), then once per planted edge, each time with one import
added that reopens a loop the contracts forbid; every planted run must break the named contract.
Exit status 0 when all of that holds, 1 otherwise (each failure says which edge got through).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("core/src", "vendors/cuda/src", "vendors/ascend/src", "vendors/template/src")
LINT = "import sys; from importlinter.cli import lint_imports_command; lint_imports_command()"

# (file in the copy, the import planted at its end, the contract it must break)
PLANTED = (
    (
        "core/src/sglang_fl/integrations/sglang/attention_backend.py",
        "from .plugin import get_router as _planted",
        "SGLang integration: the entry point over the seams it hooks",
    ),
    (
        "core/src/sglang_fl/integrations/sglang/router.py",
        "from .plugin import register as _planted",
        "SGLang integration: the entry point over the seams it hooks",
    ),
    (
        "core/src/sglang_fl/testing/collectives.py",
        "from .checks import plan as _planted",
        "The kit: pytest entry points over the checks",
    ),
    (
        "core/src/sglang_fl/config.py",
        "from .verify import Verifier as _planted",
        "Core imports only downwards",
    ),
    (
        "vendors/template/src/sglang_fl_template/plugin.py",
        "from sglang_fl.testing.checks import plan as _planted",
        "Vendors import only the public plugin API of core",
    ),
)


def lint(copy: Path) -> subprocess.CompletedProcess[str]:
    paths = os.pathsep.join(str(copy / source) for source in SOURCES)
    env = {**os.environ, "PYTHONPATH": paths, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-c", LINT, "--no-cache"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def main() -> int:
    failures = []
    with tempfile.TemporaryDirectory(prefix="import-contracts-") as tmp:
        copy = Path(tmp)
        shutil.copy2(ROOT / "pyproject.toml", copy / "pyproject.toml")
        for source in SOURCES:
            shutil.copytree(ROOT / source, copy / source, ignore=shutil.ignore_patterns("*.pyc"))
        clean = lint(copy)
        if clean.returncode != 0:
            print(clean.stdout + clean.stderr)
            print("the unplanted copy does not lint clean; nothing planted was checked")
            return 1
        for target, line, contract in PLANTED:
            path = copy / target
            original = path.read_text()
            path.write_text(f"{original}\n{line}\n")
            try:
                result = lint(copy)
            finally:
                path.write_text(original)
            broken = result.returncode != 0 and any(
                contract in out_line and "BROKEN" in out_line
                for out_line in _joined_contract_lines(result.stdout)
            )
            verdict = "caught" if broken else "NOT CAUGHT"
            print(f"{verdict}: {target}: {line!r} -> {contract!r}")
            if not broken:
                failures.append(target)
                print(result.stdout[-3000:] + result.stderr[-3000:])
    return 1 if failures else 0


def _joined_contract_lines(output: str) -> list[str]:
    """import-linter wraps a long contract name over two lines: join each with the next."""
    lines = output.splitlines()
    return [f"{a} {b}" for a, b in zip(lines, [*lines[1:], ""], strict=True)]


if __name__ == "__main__":
    sys.exit(main())
