"""End to end, as a chip maker: ``new-vendor``, one op in pure PyTorch, wheel, fresh venv, kit.

Runs the commands of ``docs/publishing-a-vendor-wheel.md`` as written (a test below checks
that the document shows each of them), in a fresh ``python -m venv`` holding only the core
wheel, torch, pytest and build. The core wheel is ``$KIT_CORE_WHEEL`` (the ``kit`` nox session
builds it) or is built here from ``core/``; torch is ``$KIT_TORCH`` (nox passes its CPU pin).
About two minutes, most of it installing torch.

The page's figures (test counts, stubs, cases, checks) are read from the page (:data:`FIGURES`)
and checked twice: against their formula (the template's stub table, the kit's plan of checks)
without running anything, and against what pytest reports in the walkthrough run.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "publishing-a-vendor-wheel.md"
TEMPLATE_PLUGIN = ROOT / "vendors" / "template" / "src" / "sglang_fl_template" / "plugin.py"
TORCH = os.environ.get("KIT_TORCH", "torch==2.13.0")  # the CPU build on this machine's disk

# The walkthrough's commands, in order; each must appear verbatim in the document.
NEW_VENDOR = "sglang-fl new-vendor my_chip --ops silu_and_mul"
DEVELOP = 'pip install -e ".[test]"'
TEST = "pytest"
TEST_ONE_OP = "pytest --sglang-fl-conformance=my_chip:silu_and_mul"
BUILD = "python -m build"
INSTALL = "pip install dist/sglang_fl_my_chip-0.1.0-py3-none-any.whl"
OPS = "sglang-fl ops"
OPS_JSON = "sglang-fl ops --json"
COMMANDS = (NEW_VENDOR, DEVELOP, TEST, TEST_ONE_OP, BUILD, INSTALL, OPS, OPS_JSON)
# The same project with a stub for every op the template has (the page states its figures too).
NEW_VENDOR_ALL_OPS = "sglang-fl new-vendor my_chip --dir all-ops"

# Every figure the page states, by the words around it.
FIGURES = {
    "generated": r"passes as it is: `(?P<passed>\d+) passed, (?P<skipped>\d+) skipped`",
    "stubs": r"a\s+stub for every op the template has \((?P<stubs>\d+):",
    "all_ops": r"without `--ops` reports `(?P<passed>\d+) passed, (?P<skipped>\d+) skipped`",
    "implemented": r"passes everything \(`(?P<passed>\d+) passed`\)",
    "checks": r"(?P<checks>\d+) value checks: the (?P<cases>\d+) `silu_and_mul` cases",
}
DISCOVERY_TESTS = 2  # tests/test_my_chip_plugin.py
PLUGIN_CHECK = 1  # the kit's check that the plugin loaded
DTYPES = 3  # float32, float16, bfloat16: silu_and_mul's contract dtypes

PACKAGE = "src/sglang_fl_my_chip"
SILU_AND_MUL = '''\
"""``silu_and_mul`` on my_chip: ``x`` ``[num_tokens, 2*d]`` -> new ``[num_tokens, d]``."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def silu_and_mul(obj: Any, x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]
'''
# The halves swapped: the kind of bug the kit is there to catch.
BROKEN = SILU_AND_MUL.replace("F.silu(x[..., :d]) * x[..., d:]", "F.silu(x[..., d:]) * x[..., :d]")
PROBE_STUB = 'return Availability(False, "my_chip: no availability probe written yet (backend.py)")'
PROBE = 'return Availability(True, "pure PyTorch: runs wherever torch runs")'


def figures() -> dict[str, dict[str, int]]:
    """The page's figures, each a dict of the named numbers; a figure the page no longer
    states (its words changed) fails, naming it."""
    text = " ".join(DOC.read_text().split())
    found = {}
    for name, pattern in FIGURES.items():
        match = re.search(pattern, text)
        assert match, f"{DOC.name} no longer states the {name!r} figure ({pattern})"
        found[name] = {key: int(value) for key, value in match.groupdict().items()}
    return found


def stubs_in(plugin_py: Path) -> int:
    """Entries of the registration table ``plugin.py`` hands to ``backend.implementations``."""
    tables = [
        node.args[0]
        for node in ast.walk(ast.parse(plugin_py.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "implementations"
        and node.args
        and isinstance(node.args[0], ast.Dict)
    ]
    assert len(tables) == 1, plugin_py
    return len(tables[0].keys)


def test_page_figures_follow_the_template_and_the_kits_plan() -> None:
    """The formula behind each figure: per stub a signature check that passes and a conformance
    check skipped (chip unavailable); once implemented, one check per case and dtype."""
    page = figures()
    assert page["stubs"]["stubs"] == stubs_in(TEMPLATE_PLUGIN)
    one_op = DISCOVERY_TESTS + PLUGIN_CHECK + 1
    assert page["generated"] == {"passed": one_op, "skipped": 1}
    stubs = page["stubs"]["stubs"]
    assert page["all_ops"] == {"passed": DISCOVERY_TESTS + PLUGIN_CHECK + stubs, "skipped": stubs}
    assert page["checks"]["checks"] == page["checks"]["cases"] * DTYPES
    assert page["implemented"]["passed"] == one_op + page["checks"]["checks"]


def test_document_shows_the_commands_this_test_runs() -> None:
    text = DOC.read_text()
    missing = [command for command in COMMANDS if command not in text]
    assert missing == [], f"{DOC.name} lacks these commands the walkthrough test runs"
    for snippet in (PROBE, SILU_AND_MUL.split("\n\n\n")[-1].strip()):
        assert snippet in text, f"{DOC.name} lacks the code the walkthrough test writes"


class Shell:
    """Runs walkthrough commands in a fresh venv (its ``bin`` first on ``PATH``), like a user."""

    def __init__(self, venv_dir: Path) -> None:
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("SGLANG_FL_") and k not in {"PYTHONPATH", "PYTHONHOME"}
        }
        self.env["VIRTUAL_ENV"] = str(venv_dir)
        self.env["PATH"] = f"{venv_dir / 'bin'}{os.pathsep}{self.env.get('PATH', '')}"

    def __call__(self, command: str, cwd: Path, *, ok: bool = True) -> str:
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        output = done.stdout + done.stderr
        if ok and done.returncode != 0:
            pytest.fail(f"`{command}` exited {done.returncode}:\n{output[-6000:]}", pytrace=False)
        if not ok and done.returncode == 0:
            pytest.fail(f"`{command}` should have failed:\n{output[-6000:]}", pytrace=False)
        return output


def core_wheel(tmp_path: Path) -> Path:
    given = os.environ.get("KIT_CORE_WHEEL")
    if given:
        return Path(given)
    out = tmp_path / "core-dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out)],
        cwd=ROOT / "core",
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("sglang_fl-*.whl")
    return wheel


def summary(output: str) -> dict[str, int]:
    """pytest's closing line as counts: ``{"passed": 58, "skipped": 0, ...}``."""
    last = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed)", line)][-1]
    return {kind: int(n) for n, kind in re.findall(r"(\d+) (\w+)", last)}


# The whole walkthrough in one test: a torch install, two wheel builds, pytest, each capped at
# 600 s by ``sh``; nox's per-test limit (900 s) would cut the sum short.
@pytest.mark.timeout(1800)
def test_walkthrough(tmp_path: Path) -> None:
    page = figures()
    venv_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(venv_dir)
    sh = Shell(venv_dir)
    sh(f"pip install -q '{core_wheel(tmp_path)}' {TORCH} numpy pytest build", tmp_path)

    # 1. Generate with --ops (and, for the page's other figure, with every stub); as generated,
    # each installs and its tests pass (the chip is "unavailable").
    sh(NEW_VENDOR, tmp_path)
    project = tmp_path / "sglang-fl-my-chip"
    sh(NEW_VENDOR_ALL_OPS, tmp_path)
    all_ops = tmp_path / "all-ops"
    stubs = stubs_in(all_ops / PACKAGE / "plugin.py")
    assert stubs == page["stubs"]["stubs"]
    sh(DEVELOP, all_ops)
    out = sh(TEST, all_ops)
    assert summary(out) == page["all_ops"], out
    sh(DEVELOP, project)  # replaces the all-ops project (one distribution name)
    assert stubs_in(project / PACKAGE / "plugin.py") == 1
    out = sh(TEST, project)
    assert summary(out) == page["generated"], out
    assert "my_chip: no availability probe written yet (backend.py)" in out

    # 2. One op in pure PyTorch: the kernel and an availability probe (--ops registered it).
    (project / PACKAGE / "impl" / "activation.py").write_text(SILU_AND_MUL)
    backend = project / PACKAGE / "backend.py"
    assert PROBE_STUB in backend.read_text()
    backend.write_text(backend.read_text().replace(PROBE_STUB, PROBE))
    out = sh(TEST, project)
    assert summary(out) == page["implemented"], out
    cases = sh(
        'python -c "from sglang_fl.ops import get_contract; '
        "c = get_contract('silu_and_mul'); print(len(c.cases), len(c.dtypes))\"",
        project,
    ).split()
    assert [int(n) for n in cases] == [page["checks"]["cases"], DTYPES]

    # 3. Broken on purpose: the failure names vendor, op, case, dtype and the errors.
    (project / PACKAGE / "impl" / "activation.py").write_text(BROKEN)
    out = sh(TEST_ONE_OP, project, ok=False)
    # The empty batch (tokens=0, once per dtype) has no value to get wrong: it passes.
    checks = page["checks"]["checks"]
    assert summary(out) == {"failed": checks - DTYPES, "passed": 2 + 2 + DTYPES}, out
    assert re.search(
        r"vendor 'my_chip' \(sglang-fl-my-chip 0\.1\.0\), op 'silu_and_mul', "
        r"impl 'vendor\.my_chip', case 'tokens=7,d=128,strided', dtype bfloat16, device cpu:\n"
        r"\s+output: max abs error [0-9.e+-]+, max rel error [0-9.e+-]+ "
        r"\(atol=0\.016, rtol=0\.016\)",
        out,
    ), out
    (project / PACKAGE / "impl" / "activation.py").write_text(SILU_AND_MUL)

    # 4. The wheel: built, installed over the editable install, tested, and chosen.
    sh(BUILD, project)
    sh(INSTALL, project)
    location = sh("pip show -f sglang-fl-my-chip", project)
    assert "sglang_fl_my_chip/impl/activation.py" in location  # files of the wheel, not a link
    out = sh(TEST, project)
    assert summary(out) == page["implemented"], out
    table = sh(OPS, project)
    assert re.search(r"silu_and_mul\s+\*vendor\.my_chip\s", table), table
    ops = {report["op"]: report for report in json.loads(sh(OPS_JSON, project))["ops"]}
    chosen = ops["silu_and_mul"]["candidates"][0]
    assert (chosen["impl_id"], chosen["outcome"]) == ("vendor.my_chip", "chosen")
    assert (chosen["plugin"], chosen["distribution"]) == ("my_chip", "sglang-fl-my-chip")
    assert ops["rms_norm"]["chosen"] == "reference.rms_norm"
