"""The README's Install commands, run as written in a fresh venv.

The commands are read from the first ``bash`` block of the README's ``## Install`` section, so
the README and this test cannot drift apart. They run with ``bash -euo pipefail`` in a copy of
the checkout's distribution sources (building writes ``dist/`` and ``build/`` there), in a new
``python -m venv`` whose ``bin`` comes first on ``PATH``. The section says to run them in the
venv where SGLang and torch live; that venv is stood in for by one holding only torch (the
CPU build named by ``$INSTALL_TEST_TORCH``, which ``nox -s cross`` sets). Needs PyPI, as the
commands do (``pip install build``, build isolation fetching setuptools).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# The operators' page of the documentation repeats the section; it must not drift from this one.
DOCS_PAGE = ROOT / "docs" / "running.md"
TORCH_ENV = "INSTALL_TEST_TORCH"
COMMANDS_TIMEOUT_S = 1200


def install_section(page: Path) -> str:
    """The ``## Install`` section of ``page``, up to the next ``## `` heading."""
    found = re.search(r"^## Install\n(.*?)(?=^## )", page.read_text(), re.MULTILINE | re.DOTALL)
    assert found, f"{page} has no '## Install' section"
    return found.group(1)


def install_commands(page: Path = README) -> str:
    """The first ``bash`` block of the ``## Install`` section."""
    section = install_section(page)
    block = re.search(r"^```bash\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    assert block, "the Install section has no ```bash block"
    return block.group(1)


def test_install_section_builds_and_installs_the_wheels() -> None:
    commands = install_commands()
    assert "pip install sglang-fl " not in commands, "not on PyPI yet: the block must not say so"
    assert "sglang-fl ops" in commands


def test_the_documentation_shows_the_same_install_section() -> None:
    assert install_commands(DOCS_PAGE) == install_commands(), (
        f"the Install commands of {DOCS_PAGE} differ from the README's, which this file runs"
    )


# A torch install (capped at 900 s) and the commands (COMMANDS_TIMEOUT_S) in one test: above nox's
# per-test limit of 900 s.
@pytest.mark.timeout(2400)
def test_install_commands_work_as_written_in_a_fresh_venv(tmp_path: Path) -> None:
    torch_requirement = os.environ.get(TORCH_ENV)
    if not torch_requirement:
        pytest.fail(f"set {TORCH_ENV} to the torch requirement to install (nox -s cross does)")
    checkout = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")
    for part in ("core", "vendors"):
        shutil.copytree(ROOT / part, checkout / part, ignore=ignore)
    venv_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(venv_dir)
    bin_dir = venv_dir / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["VIRTUAL_ENV"] = str(venv_dir)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    pip = [str(bin_dir / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, torch_requirement, "numpy"], check=True, env=env, timeout=900)

    script = "set -euo pipefail\n" + install_commands()
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMANDS_TIMEOUT_S,
    )
    assert done.returncode == 0, f"the Install commands failed:\n{done.stdout}\n{done.stderr}"
    assert "rms_norm" in done.stdout, f"`sglang-fl ops` printed no op table:\n{done.stdout}"

    listed = subprocess.run(
        [str(bin_dir / "sglang-fl"), "plugins", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    by_distribution = {p["distribution"]: p for p in json.loads(listed.stdout)["plugins"]}
    assert by_distribution["sglang-fl-cuda"]["status"] == "loaded", by_distribution
    installed = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "show", "sglang-fl", "sglang-fl-cuda"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert installed.count(f"Location: {venv_dir}") == 2, installed
