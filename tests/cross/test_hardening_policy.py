"""Hostile plugins against identity, output, settings and long chains (issue 12, groups 4, 5, 7, 8).

Throwaway plugin distributions are built into real wheels once, installed with ``pip install
--target`` into a few site directories (one per group), and inspected through ``python -m
sglang_fl`` and the Python API in fresh interpreters, each with a hard timeout so a hang fails.
The genuine ``sglang-fl-cuda`` wheel is built from ``vendors/cuda`` for the impersonation cases.

Identity (``site_identity``): ``flagdeny`` (a ``flagos`` implementation without a vendor),
``liar`` (declares ``vendor="cuda"``), ``aaasquat`` (sorts before ``cuda`` and claims
``vendor.cuda``), ``kindsquat`` (claims ``flagos.cuda``), ``offline`` (``available=False``,
``fn._is_available = False``), ``badavail`` (``available="no"``), ``refsquat`` (a
``reference``-kind ``reference.silu_and_mul``), next to the real ``cuda``.

Output (``site_output``): ``chatty`` (prints and writes to fd 1 at import, in its hook and in its
probe), ``multiline`` (newlines in its reasons), ``crlf`` (newlines in its import error),
``surrogate`` (a lone surrogate in its import error).

Settings (``site_names``): ``goodchip`` and entry points named ``bad name``, ``bang!`` and
``-dash`` whose modules write a marker file when imported.

Chain (``site_chain``): ``chain`` registers 1,500 ``flagos`` implementations of ``silu_and_mul``,
each declining every call with ``Unsupported``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_vendor_wheels import PYPROJECT, environment, install_projects, sglang_fl

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120  # seconds per subprocess: a hang fails the test instead of waiting

SILU = """
import torch


def silu_and_mul(obj, x):
    d = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :d]) * x[..., d:]
"""

PLUGINS: dict[str, tuple[str, str]] = {
    # entry-point name -> (module source, site)
    "flagdeny": (
        SILU
        + """
from sglang_fl.types import BackendImplKind, OpImpl, hookimpl


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl(op_name="silu_and_mul", impl_id="flagos.flagdeny",
                             kind=BackendImplKind.DEFAULT, fn=silu_and_mul))
""",
        "identity",
    ),
    "liar": (
        SILU
        + """
from sglang_fl.types import BackendImplKind, OpImpl, hookimpl


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl(op_name="silu_and_mul", impl_id="vendor.liar",
                             kind=BackendImplKind.VENDOR, fn=silu_and_mul, vendor="cuda"))
""",
        "identity",
    ),
    "aaasquat": (
        SILU
        + """
from sglang_fl.types import BackendImplKind, OpImpl, hookimpl


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl(op_name="silu_and_mul", impl_id="vendor.cuda",
                             kind=BackendImplKind.VENDOR, fn=silu_and_mul, vendor="aaasquat"))
""",
        "identity",
    ),
    "kindsquat": (
        SILU
        + """
from sglang_fl.types import BackendImplKind, OpImpl, hookimpl


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl(op_name="silu_and_mul", impl_id="flagos.cuda",
                             kind=BackendImplKind.DEFAULT, fn=silu_and_mul))
""",
        "identity",
    ),
    "refsquat": (
        SILU
        + """
from sglang_fl.types import BackendImplKind, OpImpl, hookimpl


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl(op_name="silu_and_mul", impl_id="reference.silu_and_mul",
                             kind=BackendImplKind.REFERENCE, fn=silu_and_mul))
""",
        "identity",
    ),
    "offline": (
        SILU
        + """
from sglang_fl.types import BackendImplKind, OpImpl, hookimpl


def gelu_new(obj, x):
    return x


gelu_new._is_available = False


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl(op_name="silu_and_mul", impl_id="flagos.offline",
                             kind=BackendImplKind.DEFAULT, fn=silu_and_mul, available=False))
    registry.register(OpImpl(op_name="gelu_new", impl_id="flagos.offline",
                             kind=BackendImplKind.DEFAULT, fn=gelu_new))
""",
        "identity",
    ),
    "badavail": (
        SILU
        + """
from sglang_fl.types import BackendImplKind, OpImpl, hookimpl


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl(op_name="silu_and_mul", impl_id="flagos.badavail",
                             kind=BackendImplKind.DEFAULT, fn=silu_and_mul, available="no"))
""",
        "identity",
    ),
    "chatty": (
        SILU
        + """
import os
import sys

from sglang_fl.types import Availability, BackendImplKind, OpImpl, hookimpl

print("chatty: imported")
os.write(1, b"chatty: raw write at import\\n")
sys.__stdout__.write("chatty: buffered in the original stdout\\n")  # no newline flush: a pipe


def probe():
    print("chatty: probing")
    os.write(1, b"{not json\\n")
    return Availability(True, "probed")


@hookimpl
def sglang_fl_register_ops(registry):
    print("chatty: registering")
    registry.register(OpImpl(op_name="silu_and_mul", impl_id="vendor.chatty",
                             kind=BackendImplKind.VENDOR, fn=silu_and_mul, vendor="chatty",
                             available=probe))


@hookimpl
def sglang_fl_platform():
    print("chatty: asked for a platform")
    return None
""",
        "output",
    ),
    "multiline": (
        SILU
        + """
from sglang_fl.types import Availability, BackendImplKind, OpImpl, hookimpl

FORGED = "\\nrms_norm  *vendor.forged  vendor  forged  999  x 1  yes  chosen: forged\\n"


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl(op_name="silu_and_mul", impl_id="vendor.multiline",
                             kind=BackendImplKind.VENDOR, fn=silu_and_mul, vendor="multiline",
                             available=lambda: Availability(False, "no device" + FORGED)))
    registry.declare_no_kernel("rms_norm", "not yet" + FORGED)
""",
        "output",
    ),
    "crlf": (
        """
raise RuntimeError("boom\\r\\nforged   sglang-fl-forged   9.9   loaded\\u2028x")
""",
        "output",
    ),
    "surrogate": (
        """
raise RuntimeError("bad bytes: " + b"\\xff\\xfe".decode("utf-8", "surrogateescape"))
""",
        "output",
    ),
    "chain": (
        SILU
        + """
from sglang_fl.types import BackendImplKind, OpImpl, Unsupported, hookimpl

LENGTH = 1500


def declining(obj, x):
    raise Unsupported("declines everything")


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register_many(
        OpImpl(op_name="silu_and_mul", impl_id=f"flagos.chain.{n:04d}",
               kind=BackendImplKind.DEFAULT, fn=declining)
        for n in range(LENGTH)
    )
""",
        "chain",
    ),
    "goodchip": (
        SILU
        + """
from sglang_fl.types import BackendImplKind, OpImpl, hookimpl


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl(op_name="silu_and_mul", impl_id="vendor.goodchip",
                             kind=BackendImplKind.VENDOR, fn=silu_and_mul, vendor="goodchip"))
""",
        "names",
    ),
}
# Entry-point names the settings could never spell: each module leaves a marker if imported.
ODD_NAMES = {"bad name": "oddspace", "bang!": "oddbang", "-dash": "odddash"}
ODD_MODULE = """
import os
from pathlib import Path

Path(os.environ["ODD_MARKERS"], __name__).touch()


def register_builtins(registry):
    pass
"""


def write_plugin(root: Path, ep_name: str, module: str, source: str) -> Path:
    """A project whose entry point ``ep_name`` names the module ``module``."""
    project = root / module
    package = project / "src" / module
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(source))
    pyproject = PYPROJECT.format(
        name=module.removeprefix("sglang_fl_").replace("_", "-"),
        version="0.1.0",
        ep_name=json.dumps(ep_name),
        entry_point=module,
    )
    (project / "pyproject.toml").write_text(pyproject)
    return project


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hardening-policy")
    jobs: list[tuple[Path, Path]] = []
    for name, (source, site) in PLUGINS.items():
        jobs.append((write_plugin(root / "src", name, f"sglang_fl_{name}", source), root / site))
    for ep_name, module in ODD_NAMES.items():
        jobs.append((write_plugin(root / "src", ep_name, module, ODD_MODULE), root / "names"))
    cuda = root / "src" / "cuda"
    shutil.copytree(
        ROOT / "vendors" / "cuda",
        cuda,
        ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", "tests"),
    )
    jobs.append((cuda, root / "identity"))
    result = {}
    for site in ("identity", "output", "names", "chain"):
        members = [project for project, out in jobs if out == root / site]
        result[site] = install_projects(members, root / site / "site")
    return result


def run_json(site: Path, *argv: str, expect_rc: int | None = 0, **settings: str) -> dict:
    result = sglang_fl(site, *argv, "--json", **settings)
    if expect_rc is not None:
        assert result.returncode == expect_rc, result.stdout + result.stderr
    data = json.loads(result.stdout)  # the whole of stdout is one JSON document
    assert data["schema_version"] == 1
    return data


def candidates(site: Path, op: str, **settings: str) -> dict[str, dict]:
    report = run_json(site, "explain", op, expect_rc=None, **settings)
    return {c["impl_id"]: c for c in report["candidates"]}


def plugins(site: Path, **settings: str) -> dict[str, dict]:
    return {p["name"]: p for p in run_json(site, "plugins", **settings)["plugins"]}


# -- group 4: identity --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def identity_plugins(sites: dict[str, Path]) -> dict[str, dict]:
    return plugins(sites["identity"])


def test_flagos_implementation_without_vendor_is_denied_by_its_plugin_name(sites) -> None:
    site = sites["identity"]
    assert candidates(site, "silu_and_mul")["flagos.flagdeny"]["outcome"] == "chosen"
    denied = candidates(site, "silu_and_mul", deny_vendors="flagdeny")["flagos.flagdeny"]
    assert denied["outcome"] == "rejected"
    assert denied["reason"].startswith("plugin 'flagdeny' is denied (environment SGLANG_FL_DENY")
    allowed = candidates(site, "silu_and_mul", allow_vendors="cuda")
    assert allowed["flagos.flagdeny"]["outcome"] == "rejected"
    assert "not in the allow list ['cuda']" in allowed["flagos.flagdeny"]["reason"]
    # Core's reference backend is not a vendor: the lists never exclude it.
    assert allowed["reference.silu_and_mul"]["outcome"] == "chosen"


def test_declared_vendor_must_be_the_entry_point_name(sites, identity_plugins) -> None:
    liar = identity_plugins["liar"]
    assert liar["status"] == "failed"
    assert "vendor='cuda'" in liar["error"]
    assert "a plugin's vendor name is its entry-point name, 'liar'" in liar["error"]
    allowed = candidates(sites["identity"], "silu_and_mul", allow_vendors="cuda")
    assert not any(c["distribution"] == "sglang-fl-liar" for c in allowed.values())
    assert allowed["vendor.cuda"]["distribution"] == "sglang-fl-cuda"


def test_impl_id_of_another_plugin_cannot_be_claimed(sites, identity_plugins) -> None:
    # aaasquat loads before cuda (sorted by name) and claims vendor.cuda: it fails, cuda loads.
    squat = identity_plugins["aaasquat"]
    assert squat["status"] == "failed"
    assert "impl_id 'vendor.cuda'" in squat["error"]
    assert "must be 'vendor.aaasquat' or start with 'vendor.aaasquat.'" in squat["error"]
    kind = identity_plugins["kindsquat"]
    assert kind["status"] == "failed"
    assert "impl_id 'flagos.cuda'" in kind["error"]
    # Core's reference impl ids are core's: a plugin cannot stand in for the reference.
    ref = identity_plugins["refsquat"]
    assert ref["status"] == "failed"
    assert "registered 'reference.silu_and_mul'" in ref["error"]
    # Refused for its kind before its impl_id is looked at: only core registers `reference`.
    assert "kind=BackendImplKind.REFERENCE; that kind is core's" in ref["error"]
    cuda = identity_plugins["cuda"]
    assert (cuda["status"], cuda["error"], cuda["distribution"]) == (
        "loaded",
        None,
        "sglang-fl-cuda",
    )
    genuine = candidates(sites["identity"], "rms_norm")["vendor.cuda"]
    assert (genuine["plugin"], genuine["distribution"]) == ("cuda", "sglang-fl-cuda")


def test_identity_rule_is_reported(sites) -> None:
    data = run_json(sites["identity"], "plugins")
    assert "its impl_ids are <kind>.<name>" in data["identity_rule"]
    text = sglang_fl(sites["identity"], "plugins")
    assert "identity: a plugin is its entry-point name" in text.stdout


def test_declared_unavailable_is_unavailable(sites, identity_plugins) -> None:
    silu = candidates(sites["identity"], "silu_and_mul")["flagos.offline"]
    assert (silu["outcome"], silu["available"]) == ("rejected", False)
    assert silu["reason"] == "unavailable: declared available=False when registered"
    gelu = candidates(sites["identity"], "gelu_new")
    assert gelu["flagos.offline"]["available"] is False
    assert gelu["reference.gelu_new"]["outcome"] == "chosen"
    bad = identity_plugins["badavail"]
    assert bad["status"] == "failed"
    assert "available='no'" in bad["error"]
    assert "expected None, True, False" in bad["error"]


# -- group 5: output ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [("plugins",), ("ops",), ("explain", "silu_and_mul"), ("doctor",), ("hooks",)],
    ids=" ".join,
)
def test_plugin_output_never_reaches_json(sites, argv) -> None:
    result = sglang_fl(sites["output"], *argv, "--json")
    data = json.loads(result.stdout)
    assert data["schema_version"] == 1
    assert "chatty: imported" in result.stderr
    assert "chatty: raw write" in result.stderr
    assert "chatty: buffered in the original stdout" in result.stderr
    for chatter in ("chatty: ", "raw write", "{not json"):
        assert chatter not in result.stdout


def test_newlines_cannot_forge_table_rows(sites) -> None:
    result = sglang_fl(sites["output"], "ops")
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if "forged" in line]
    # Each forged text stays inside its own row, escaped, never a row of its own.
    assert len(rows) == 2
    assert all("\\nrms_norm  *vendor.forged" in row for row in rows)
    assert not any(
        line.startswith("rms_norm  *vendor.forged") for line in result.stdout.splitlines()
    )
    plugins_text = sglang_fl(sites["output"], "plugins").stdout
    (crlf,) = [line for line in plugins_text.splitlines() if "forged" in line]
    assert crlf.startswith("crlf ")
    assert "boom\\r\\nforged" in crlf
    assert "\\u2028x" in crlf
    explain = sglang_fl(sites["output"], "explain", "rms_norm").stdout
    assert not any(line.startswith("rms_norm  *") for line in explain.splitlines())


@pytest.mark.parametrize("argv", [("plugins",), ("ops",), ("doctor",), ("hooks",)], ids=" ".join)
def test_lone_surrogate_does_not_crash_text_output(sites, argv) -> None:
    result = sglang_fl(sites["output"], *argv)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode in (0, 1)
    if argv[0] in ("plugins", "doctor"):
        assert "bad bytes: \\udcff\\udcfe" in result.stdout


@pytest.mark.parametrize("argv", [("ops", "--json"), ("plugins",)], ids=" ".join)
def test_closed_pipe_is_no_traceback(sites, argv) -> None:
    """The reader is gone before the command writes a byte (deterministic EPIPE)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "sglang_fl", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment(sites["output"]),
    )
    assert process.stdout is not None
    process.stdout.close()
    _, stderr = process.communicate(timeout=TIMEOUT)
    assert b"Traceback" not in stderr, stderr.decode()
    assert b"BrokenPipeError" not in stderr
    assert process.returncode == 1


def test_head_of_large_json_is_no_traceback(sites) -> None:
    """The issue's ``sglang-fl ops --json | head -c 10``; 1,500 candidates overflow the pipe."""
    result = subprocess.run(
        ["bash", "-c", f"{sys.executable} -m sglang_fl ops --json | head -c 10"],
        capture_output=True,
        text=True,
        env=environment(sites["chain"]),
        timeout=TIMEOUT,
        check=False,
    )
    assert result.stdout == '{\n  "schem'
    assert "Traceback" not in result.stderr, result.stderr
    assert "BrokenPipe" not in result.stderr


# -- group 7: settings --------------------------------------------------------------------------


def test_odd_entry_point_names_are_refused_unimported(sites, tmp_path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {**environment(sites["names"]), "ODD_MARKERS": str(markers)}
    result = subprocess.run(
        [sys.executable, "-m", "sglang_fl", "plugins", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=TIMEOUT,
        check=False,
    )
    found = {p["name"]: p for p in json.loads(result.stdout)["plugins"]}
    for name in ODD_NAMES:
        assert found[name]["status"] == "failed"
        assert f"entry-point name {name!r} is not a valid plugin name" in found[name]["error"]
    assert found["goodchip"]["status"] == "loaded"
    assert list(markers.iterdir()) == []  # refused before import
    # Under STRICT a refused name is a failure like any other; SGLANG_FL_PLUGINS leaves it out.
    strict = subprocess.run(
        [sys.executable, "-c", "import sglang_fl; sglang_fl.get_runtime()"],
        capture_output=True,
        text=True,
        env={**env, "SGLANG_FL_STRICT": "1"},
        timeout=TIMEOUT,
        check=False,
    )
    assert strict.returncode != 0
    assert "is not a valid plugin name" in strict.stderr
    only = plugins(sites["names"], plugins="goodchip", strict="1")
    assert {only[name]["status"] for name in ODD_NAMES} == {"disabled"}


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("plugins", "goodchp"),
        ("disable_plugins", "goodchp"),
        ("allow_vendors", "goodchp"),
        ("deny_vendors", "goodchp"),
    ],
)
def test_names_matching_nothing_installed_are_warned(sites, setting, value) -> None:
    result = sglang_fl(sites["names"], "doctor", "--json", **{setting: value})
    variable = f"SGLANG_FL_{setting.upper()}"
    expected = f"{variable} (environment {variable}) names 'goodchp', which matches no installed"
    assert expected in result.stderr
    assert "(did you mean 'goodchip'?)" in result.stderr
    problems = json.loads(result.stdout)["problems"]
    assert any(p.startswith(expected) for p in problems)
    assert result.returncode == 1


def test_installed_names_are_not_warned(sites) -> None:
    result = sglang_fl(
        sites["names"], "doctor", "--json", plugins="goodchip", deny_vendors="goodchip"
    )
    assert "matches no installed" not in result.stderr


@pytest.mark.parametrize("where", ["directory", "under a file"])
def test_unusable_dispatch_log_is_named_by_doctor(sites, tmp_path, where) -> None:
    target = tmp_path if where == "directory" else tmp_path / "file" / "dispatch.jsonl"
    (tmp_path / "file").write_text("")
    data = run_json(sites["names"], "doctor", expect_rc=1, dispatch_log=str(target))
    (problem,) = [p for p in data["problems"] if "DISPATCH_LOG" in p]
    assert problem.startswith(f"SGLANG_FL_DISPATCH_LOG={str(target)!r} (environment")
    assert ("is a directory" if where == "directory" else "is not a directory") in problem
    # The SGLang integration's dispatch report refuses it at start-up, naming the variable.
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sglang_fl\n"
            "from sglang_fl.dispatch_report import DispatchReport\n"
            "DispatchReport(sglang_fl.get_runtime().config.dispatch_log)",
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        env=environment(sites["names"], dispatch_log=str(target)),
    )
    assert "sglang_fl.errors.ConfigError: SGLANG_FL_DISPATCH_LOG=" in check.stderr, check.stderr
    assert not os.path.exists(tmp_path / "file" / "dispatch.jsonl")


# -- group 8: long fallback chains --------------------------------------------------------------


def test_a_thousand_declining_implementations_reach_the_reference(sites) -> None:
    script = textwrap.dedent(
        """
        import sys, torch, sglang_fl
        from sglang_fl.ops import get_contract
        resolution = sglang_fl.get_runtime().resolve("silu_and_mul")
        fallbacks = resolution.decision.fallbacks
        print(len(fallbacks), fallbacks[-1].impl_id, sys.getrecursionlimit())
        x = torch.randn(4, 16)
        expected = get_contract("silu_and_mul").reference(None, x)
        torch.testing.assert_close(resolution.fn(None, x), expected, rtol=0, atol=0)
        torch.testing.assert_close(resolution.fn(None, x), expected, rtol=0, atol=0)
        print("reached")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=environment(sites["chain"]),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1500", "reference.silu_and_mul", "1000", "reached"]
    # The first decline is warned once per implementation, not once per call.
    assert result.stderr.count("flagos.chain.0000 declined a call") == 1
