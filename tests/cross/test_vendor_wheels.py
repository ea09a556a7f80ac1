"""Vendor distributions installed next to the installed core, as users get them.

Throwaway vendor projects are written here, installed into a site directory of their own (as
their wheels would install: ``installed_dists.install_project``), and inspected through the
``sglang-fl`` CLI and the Python API in fresh interpreters whose ``PYTHONPATH`` is that site:

- ``goodchip``: a working vendor (all three ops, available; rms_norm declines float16);
- ``brokenimport``: its module imports an SDK that is not installed;
- ``misspelled``: its ``sglang_fl_register_ops`` hook implementation names ``registy``;
- ``thief``: registers its own ``vendor.thief`` and then ``vendor.goodchip``, owned by another
  distribution, so all of its registrations must be rolled back.
- ``seedchip`` (entry point ``my_chip``): the seed page's vendor code unchanged
  (``register_builtins``, ``functools.wraps`` wrappers carrying ``_is_available``), packaged.

Also the issue's "done when": core + the template wheel, built for real from ``vendors/template``
with ``python -m build`` and installed with ``pip install --target``: the packaging path a chip
maker takes. Run by ``nox -s cross`` (a venv holding only the core wheel, pytest, build and
setuptools).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from installed_dists import install_project

from sglang_fl.ops import STANDARD_OPS

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE_SOURCE = ROOT / "vendors" / "template"
OPS = ("silu_and_mul", "rms_norm", "rotary_embedding")  # the ops goodchip registers
# The ops the new-vendor template has a stub for: all but the MoE shared-expert gate function
# (the collectives included, with a FlagCX-style communicator).
TEMPLATE_OPS = tuple(op for op in STANDARD_OPS if op != "fused_gate_sigmoid_mul")
OURS = ("brokenimport", "goodchip", "misspelled", "thief")

PYPROJECT = """
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang-fl-{name}"
version = "{version}"
requires-python = ">=3.10"
dependencies = ["sglang-fl>=0.1,<0.2"]

[project.entry-points."sglang_fl.backends"]
{ep_name} = "{entry_point}"

[tool.setuptools.packages.find]
where = ["src"]
"""

GOODCHIP = '''
"""A working vendor: pure-torch kernels that count their calls."""

import torch
import torch.nn.functional as F

from sglang_fl import Unsupported, hookimpl
from sglang_fl.dispatch.backends import Backend
from sglang_fl.dispatch.types import Availability

CALLS = {"silu_and_mul": 0, "rms_norm": 0, "rotary_embedding": 0}


class GoodChip(Backend):
    @property
    def name(self):
        return "goodchip"

    def is_available(self):
        return Availability(True, "goodchip: 1 simulated device")


def silu_and_mul(obj, x):
    CALLS["silu_and_mul"] += 1
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def rms_norm(obj, x, residual=None):
    if x.dtype == torch.float16:
        raise Unsupported("goodchip: no float16 rms_norm")
    CALLS["rms_norm"] += 1
    h = x.float()
    if residual is not None:
        h = h + residual.float()
        residual = h.to(x.dtype)
    out = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + obj.variance_epsilon)
           * obj.weight).to(x.dtype)
    return out if residual is None else (out, residual)


def rotary_embedding(obj, query, key, cos, sin, position_ids, rotary_interleaved=False,
                     inplace=True):
    raise Unsupported("goodchip: rotary not taped out yet")


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register_many(GoodChip().implementations({
        "silu_and_mul": silu_and_mul,
        "rms_norm": rms_norm,
        "rotary_embedding": rotary_embedding,
    }))


@hookimpl
def sglang_fl_platform():
    return None
'''

BROKENIMPORT = """
import sglang_fl_brokenimport_sdk  # not installed: the import of this plugin fails

from sglang_fl import hookimpl


@hookimpl
def sglang_fl_register_ops(registry):
    raise AssertionError("never reached")
"""

MISSPELLED = """
from sglang_fl import hookimpl


@hookimpl
def sglang_fl_register_ops(registy):
    raise AssertionError("pluggy refuses this hook implementation before calling it")
"""

THIEF = """
from sglang_fl import hookimpl
from sglang_fl.dispatch.types import BackendImplKind, BackendPriority, OpImpl


def silu_and_mul(obj, x):
    raise AssertionError("rolled back: never bound")


def rms_norm(obj, x, residual=None):
    raise AssertionError("rolled back: never bound")


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl(op_name="silu_and_mul", impl_id="vendor.thief",
                             kind=BackendImplKind.VENDOR, fn=silu_and_mul, vendor="thief",
                             priority=BackendPriority.VENDOR + 50))
    registry.register(OpImpl(op_name="rms_norm", impl_id="vendor.goodchip",
                             kind=BackendImplKind.VENDOR, fn=rms_norm, vendor="thief",
                             priority=BackendPriority.VENDOR + 50))
"""

# The seed page's vendor (shared/seed/vendor-integration.txt), unchanged, plus packaging: the
# Backend class, register_builtins() and impl/ functions, with a stand-in ``my_chip_sdk`` that
# reports one device so that the seed's availability probe says yes.
SEED_FILES = {
    "src/my_chip_sdk/__init__.py": """
def device_count():
    return 1
""",
    "src/sglang_fl_seedchip/__init__.py": "",
    "src/sglang_fl_seedchip/my_chip.py": """
from sglang_fl.dispatch.backends import Backend


class MyChipBackend(Backend):
    _available = None

    @property
    def name(self) -> str:
        return "my_chip"

    def is_available(self) -> bool:
        if MyChipBackend._available is None:
            try:
                import my_chip_sdk
                MyChipBackend._available = my_chip_sdk.device_count() > 0
            except ImportError:
                MyChipBackend._available = False
        return MyChipBackend._available

    def silu_and_mul(self, obj, x):
        from .impl.activation import silu_and_mul_my_chip
        return silu_and_mul_my_chip(obj, x)

    def rms_norm(self, obj, x, residual=None):
        from .impl.normalization import rms_norm_my_chip
        return rms_norm_my_chip(obj, x, residual)

    def rotary_embedding(self, obj, query, key, cos, sin, position_ids,
                         rotary_interleaved=False, inplace=True):
        from .impl.rotary import rotary_embedding_my_chip
        return rotary_embedding_my_chip(
            obj, query, key, cos, sin, position_ids, rotary_interleaved, inplace
        )
""",
    "src/sglang_fl_seedchip/register_ops.py": """
import functools
from sglang_fl.dispatch.types import OpImpl, BackendImplKind, BackendPriority


def _bind_is_available(fn, is_available_fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    wrapper._is_available = is_available_fn
    return wrapper


def register_builtins(registry) -> None:
    from .my_chip import MyChipBackend

    backend = MyChipBackend()
    is_avail = backend.is_available

    impls = [
        OpImpl(
            op_name="silu_and_mul",
            impl_id="vendor.my_chip",
            kind=BackendImplKind.VENDOR,
            fn=_bind_is_available(backend.silu_and_mul, is_avail),
            vendor="my_chip",
            priority=BackendPriority.VENDOR,
        ),
        OpImpl(
            op_name="rms_norm",
            impl_id="vendor.my_chip",
            kind=BackendImplKind.VENDOR,
            fn=_bind_is_available(backend.rms_norm, is_avail),
            vendor="my_chip",
            priority=BackendPriority.VENDOR,
        ),
        OpImpl(
            op_name="rotary_embedding",
            impl_id="vendor.my_chip",
            kind=BackendImplKind.VENDOR,
            fn=_bind_is_available(backend.rotary_embedding, is_avail),
            vendor="my_chip",
            priority=BackendPriority.VENDOR,
        ),
    ]
    registry.register_many(impls)
""",
    "src/sglang_fl_seedchip/impl/__init__.py": "",
    "src/sglang_fl_seedchip/impl/activation.py": """
from sglang_fl.ops.activation.silu_and_mul import reference


def silu_and_mul_my_chip(obj, x):
    return reference(obj, x)
""",
    "src/sglang_fl_seedchip/impl/normalization.py": """
from sglang_fl.ops.normalization.rms_norm import reference


def rms_norm_my_chip(obj, x, residual=None):
    return reference(obj, x, residual)
""",
    "src/sglang_fl_seedchip/impl/rotary.py": """
from sglang_fl.ops.rotary.rotary_embedding import reference


def rotary_embedding_my_chip(obj, query, key, cos, sin, position_ids, rotary_interleaved,
                             inplace):
    return reference(obj, query, key, cos, sin, position_ids, rotary_interleaved, inplace)
""",
}


def write_seed_project(root: Path) -> Path:
    project = root / "seedchip"
    for relative, text in SEED_FILES.items():
        path = project / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    (project / "pyproject.toml").write_text(
        PYPROJECT.format(
            name="seedchip",
            version="0.2.0",
            ep_name="my_chip",  # entry-point name = vendor id
            entry_point="sglang_fl_seedchip.register_ops",
        )
    )
    return project


VENDORS = {
    "goodchip": ("0.3.0", GOODCHIP),
    "brokenimport": ("1.0.0", BROKENIMPORT),
    "misspelled": ("0.0.1", MISSPELLED),
    "thief": ("6.6.6", THIEF),
}


def write_project(root: Path, name: str, version: str, source: str) -> Path:
    project = root / name
    package = project / "src" / f"sglang_fl_{name}"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(source))
    (project / "pyproject.toml").write_text(
        PYPROJECT.format(name=name, version=version, ep_name=name, entry_point=f"sglang_fl_{name}")
    )
    return project


def build_wheel(project: Path, out: Path) -> Path:
    """``python -m build --no-isolation --wheel``: the real packaging path; returns the wheel."""
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", str(out),
         str(project)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"building {project.name} failed:\n{done.stdout}{done.stderr}"
    (wheel,) = out.glob("*.whl")
    return wheel


def pip_install(wheels: list[Path], target: Path) -> None:
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet"),
            *("--disable-pip-version-check", "--target", str(target), *map(str, wheels)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def install_projects(projects: list[Path], site: Path) -> Path:
    """Each project installed into ``site`` as its wheel would install it; returns ``site``."""
    for project in projects:
        install_project(project, site)
    return site


@pytest.fixture(scope="session")
def installs(tmp_path_factory) -> dict[str, Path]:
    """``mixed``: the four throwaway vendors; ``template``: only the template wheel."""
    root = tmp_path_factory.mktemp("vendor-wheels")
    projects = [write_project(root / "src", n, v, s) for n, (v, s) in VENDORS.items()]
    projects.append(write_seed_project(root / "src"))
    template = root / "src" / "template"
    shutil.copytree(
        TEMPLATE_SOURCE,
        template,
        ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", "tests"),
    )
    targets = {"mixed": root / "site-mixed", "template": root / "site-template"}
    install_projects(projects, targets["mixed"])
    installed = sorted(p.name.split("-")[0] for p in targets["mixed"].glob("*.dist-info"))
    assert installed == [f"sglang_fl_{n}" for n in sorted((*OURS, "seedchip"))]
    template_wheel = build_wheel(template, root / "dist-template")
    assert template_wheel.name == "sglang_fl_template-0.1.0-py3-none-any.whl"
    pip_install([template_wheel], targets["template"])
    return targets


def environment(site: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_FL_")}
    env["PYTHONPATH"] = str(site)
    env.update({f"SGLANG_FL_{k.upper()}": v for k, v in settings.items()})
    return env


def sglang_fl(site: Path, *argv: str, **settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglang_fl", *argv],
        capture_output=True,
        text=True,
        env=environment(site, **settings),
        timeout=180,
        check=False,
    )


def sglang_fl_json(site: Path, *argv: str, expect_rc: int = 0, **settings: str) -> dict:
    result = sglang_fl(site, *argv, "--json", **settings)
    assert result.returncode == expect_rc, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert data["schema_version"] == 1
    return data


def preinstalled_plugins() -> set[str]:
    """Entry points this interpreter already sees (none in ``nox -s cross``)."""
    return {ep.name for ep in importlib.metadata.entry_points(group="sglang_fl.backends")}


# -- the four throwaway vendors -------------------------------------------------------------------


@pytest.fixture(scope="session")
def mixed_plugins(installs) -> dict[str, dict]:
    data = sglang_fl_json(installs["mixed"], "plugins")
    assert data["entry_point_group"] == "sglang_fl.backends"
    return {p["name"]: p for p in data["plugins"]}


def test_installed_wheels_are_discovered_with_their_distribution(mixed_plugins):
    assert set(OURS) | {"reference"} <= set(mixed_plugins)
    for name in OURS:
        record = mixed_plugins[name]
        assert record["distribution"] == f"sglang-fl-{name}"
        assert record["version"] == VENDORS[name][0]
        assert record["module"] == f"sglang_fl_{name}"
        assert record["builtin"] is False
    assert mixed_plugins["reference"]["status"] == "loaded"
    assert mixed_plugins["reference"]["distribution"] == "sglang-fl"


def test_working_vendor_loaded(mixed_plugins):
    good = mixed_plugins["goodchip"]
    assert good["status"] == "loaded"
    assert good["error"] is None
    assert good["hooks"] == ["sglang_fl_platform", "sglang_fl_register_ops"]


def test_seed_layout_vendor_loads_unchanged(mixed_plugins):
    seed = mixed_plugins["my_chip"]
    assert seed["status"] == "loaded", seed
    assert seed["distribution"] == "sglang-fl-seedchip"
    assert seed["version"] == "0.2.0"
    assert seed["module"] == "sglang_fl_seedchip.register_ops"
    assert seed["hooks"] == ["sglang_fl_register_ops"]


def test_import_failure_reported(mixed_plugins):
    broken = mixed_plugins["brokenimport"]
    assert broken["status"] == "failed"
    assert broken["hooks"] == []
    assert broken["error"] == (
        "import of 'sglang_fl_brokenimport' failed: ModuleNotFoundError: "
        "No module named 'sglang_fl_brokenimport_sdk'"
    )


def test_misspelled_hook_argument_reported(mixed_plugins):
    misspelled = mixed_plugins["misspelled"]
    assert misspelled["status"] == "failed"
    assert misspelled["error"].startswith("invalid hook implementation:")
    assert "registy" in misspelled["error"]
    assert "sglang_fl_register_ops" in misspelled["error"]


def test_impl_id_conflict_names_both_distributions(mixed_plugins):
    thief = mixed_plugins["thief"]
    assert thief["status"] == "failed"
    assert "RegistrationError" in thief["error"]
    assert "impl_id 'vendor.goodchip'" in thief["error"]
    assert "plugin 'thief' (sglang-fl-thief)" in thief["error"]
    assert "already owned by plugin 'goodchip' (sglang-fl-goodchip)" in thief["error"]


def test_ops_json_every_op_resolves_without_the_failed_plugins(installs):
    data = sglang_fl_json(installs["mixed"], "ops")
    assert [op["op"] for op in data["ops"]] == list(STANDARD_OPS)
    assert all(op["error"] is None for op in data["ops"])
    for op in (op for op in data["ops"] if op["op"] in OPS):  # the ones goodchip registers
        assert op["chosen"] == "vendor.goodchip", op
        ids = [c["impl_id"] for c in op["candidates"]]
        assert "vendor.thief" not in ids  # rolled back with the conflicting registration
        assert f"reference.{op['op']}" in ids
        good = next(c for c in op["candidates"] if c["impl_id"] == "vendor.goodchip")
        assert (good["plugin"], good["distribution"], good["version"]) == (
            "goodchip",
            "sglang-fl-goodchip",
            "0.3.0",
        )
        assert good["available"] is True
        assert good["availability_reason"] == "goodchip: 1 simulated device"
        # Every vendor.goodchip candidate comes from goodchip: the thief's copy never landed.
        owners = {c["distribution"] for c in op["candidates"] if c["impl_id"] == "vendor.goodchip"}
        assert owners == {"sglang-fl-goodchip"}
        seed = next(c for c in op["candidates"] if c["impl_id"] == "vendor.my_chip")
        assert (seed["plugin"], seed["distribution"], seed["vendor"]) == (
            "my_chip",
            "sglang-fl-seedchip",
            "my_chip",
        )
        assert seed["available"] is True  # the seed's own probe, via fn._is_available
        assert seed["outcome"] == "fallback"
        assert seed["reason"] == "same order and priority as vendor.goodchip; impl_id sorts after"
        ref = next(c for c in op["candidates"] if c["impl_id"] == f"reference.{op['op']}")
        assert ref["outcome"] == "fallback"
        assert ref["reason"].startswith("lower in the order: matches reference")


def test_explain_names_provenance_and_fallback(installs):
    result = sglang_fl(installs["mixed"], "explain", "rms_norm")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "order: flagos > vendor > reference  (from default)" in out
    assert (
        "chosen  vendor.goodchip  [vendor, vendor=goodchip, priority=100, "
        "from goodchip (sglang-fl-goodchip 0.3.0)]"
    ) in out
    assert "fallback  reference.rms_norm" in out
    assert "thief" not in out


def test_doctor_reports_the_three_failures(installs):
    data = sglang_fl_json(installs["mixed"], "doctor", expect_rc=1)
    assert set(OURS) - {"goodchip"} <= set(data["plugins"]["failed"])
    assert "goodchip" in data["plugins"]["loaded"]
    problems = "\n".join(data["problems"])
    for name in ("brokenimport", "misspelled", "thief"):
        assert f"plugin {name!r} (sglang-fl-{name}) failed" in problems


def test_strict_cli_still_reports(installs):
    data = sglang_fl_json(installs["mixed"], "plugins", strict="1")
    statuses = {p["name"]: p["status"] for p in data["plugins"]}
    assert statuses["brokenimport"] == "failed"
    assert statuses["goodchip"] == "loaded"


def test_allow_list_skips_the_broken_ones(installs):
    data = sglang_fl_json(installs["mixed"], "plugins", plugins="goodchip", strict="1")
    statuses = {p["name"]: p["status"] for p in data["plugins"]}
    assert statuses["goodchip"] == "loaded"
    for name in ("brokenimport", "misspelled", "thief"):
        assert statuses[name] == "disabled"


API_SCRIPT = r"""
import json, sys
from types import SimpleNamespace

import torch

import sglang_fl
import sglang_fl_goodchip
from sglang_fl.ops import STANDARD_OPS

runtime = sglang_fl.get_runtime()
report = {
    "plugins": {p.name: [p.status, p.distribution, p.version, p.error] for p in runtime.plugins},
    "owner": str(runtime.registry.owner("vendor.goodchip")),
    "thief_owner": runtime.registry.owner("vendor.thief"),
    "impls": {
        op: [[i.impl_id, i.provenance.plugin, i.provenance.distribution, i.provenance.version]
             for i in runtime.registry.implementations(op)]
        for op in STANDARD_OPS
    },
    "chosen": {op: runtime.resolve(op).decision.chosen.impl_id for op in STANDARD_OPS},
}
gen = torch.Generator().manual_seed(0)
results = {}
for dtype in (torch.float32, torch.float16):
    inputs = STANDARD_OPS["rms_norm"].make_inputs(
        STANDARD_OPS["rms_norm"].cases[0], dtype, torch.device("cpu"), gen)
    got = runtime.resolve("rms_norm").fn(inputs.obj, *inputs.args)
    want = STANDARD_OPS["rms_norm"].reference(inputs.obj, *inputs.args)
    results[str(dtype)] = torch.allclose(got, want, atol=1e-3, rtol=1e-3)
x = torch.randn(4, 32, generator=gen)
silu = runtime.resolve("silu_and_mul").fn(SimpleNamespace(), x)
results["silu"] = torch.equal(silu, STANDARD_OPS["silu_and_mul"].reference(None, x))
case = STANDARD_OPS["rotary_embedding"].cases[-1]
inputs = STANDARD_OPS["rotary_embedding"].make_inputs(case, torch.float32, torch.device("cpu"), gen)
want = STANDARD_OPS["rotary_embedding"].reference(
    inputs.obj, *[a.clone() for a in inputs.args], **{**inputs.kwargs, "inplace": False})
got = runtime.resolve("rotary_embedding").fn(inputs.obj, *inputs.args, **inputs.kwargs)
results["rotary"] = all(torch.equal(g, w) for g, w in zip(got, want))
# The seed vendor's wrapped bound methods, called as the bridges call them (positionally).
seed = {}
for op in ("silu_and_mul", "rms_norm", "rotary_embedding"):  # what the seed vendor registers
    contract = STANDARD_OPS[op]
    (impl,) = [i for i in runtime.registry.implementations(op) if i.impl_id == "vendor.my_chip"]
    case = contract.cases[-1]
    a = contract.make_inputs(case, torch.bfloat16, torch.device("cpu"), gen)
    copies = tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in a.args)
    got = impl.fn(a.obj, *a.args, *a.kwargs.values())
    want = contract.reference(a.obj, *copies, *a.kwargs.values())
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    seed[op] = all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
from sglang_fl_seedchip.my_chip import MyChipBackend
seed["probe_cached"] = MyChipBackend._available
report["seed"] = seed
report["results"] = results
report["calls"] = sglang_fl_goodchip.CALLS
json.dump(report, sys.stdout)
"""


def test_python_api(installs):
    result = subprocess.run(
        [sys.executable, "-c", API_SCRIPT],
        capture_output=True,
        text=True,
        env=environment(installs["mixed"]),
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    plugins = report["plugins"]
    assert plugins["goodchip"][:3] == ["loaded", "sglang-fl-goodchip", "0.3.0"]
    assert plugins["thief"][0] == "failed"
    assert "sglang-fl-thief" in plugins["thief"][3]
    assert "sglang-fl-goodchip" in plugins["thief"][3]
    assert plugins["brokenimport"][0] == "failed"
    assert plugins["misspelled"][0] == "failed"
    assert report["owner"] == "goodchip (sglang-fl-goodchip 0.3.0)"
    assert report["thief_owner"] is None
    for op in OPS:
        assert report["chosen"][op] == "vendor.goodchip"
        impls = report["impls"][op]
        # Registrations come from the loaded plugins, nothing from the failed ones.
        assert {i[1] for i in impls} <= {"reference", "goodchip", "my_chip"} | (
            preinstalled_plugins()
        )
        assert ["vendor.goodchip", "goodchip", "sglang-fl-goodchip", "0.3.0"] in impls
        assert [f"reference.{op}", "reference", "sglang-fl"] == impls[0][:3]
        assert not any(i[1] == "thief" for i in impls)
    # float32 ran on goodchip; float16 was declined (Unsupported) and ran on the reference;
    # rotary is always declined by goodchip and falls back, with the reference's numerics.
    assert report["results"] == {
        "torch.float32": True,
        "torch.float16": True,
        "silu": True,
        "rotary": True,
    }
    assert report["calls"] == {"silu_and_mul": 1, "rms_norm": 1, "rotary_embedding": 0}
    assert report["seed"] == {
        "silu_and_mul": True,
        "rms_norm": True,
        "rotary_embedding": True,
        "probe_cached": True,
    }
    assert "goodchip: no float16 rms_norm" in result.stderr  # the hand-off warning
    assert "goodchip: rotary not taped out yet" in result.stderr


def test_python_api_strict_raises_plugin_load_error(installs):
    result = subprocess.run(
        [sys.executable, "-c", "import sglang_fl; sglang_fl.get_runtime()"],
        capture_output=True,
        text=True,
        env=environment(installs["mixed"], strict="1"),
        timeout=180,
        check=False,
    )
    assert result.returncode == 1
    assert "sglang_fl.errors.PluginLoadError: SGLANG_FL_STRICT=1: plugin 'brokenimport'" in (
        result.stderr
    )
    assert "(sglang-fl-brokenimport 1.0.0) failed to load" in result.stderr


# -- done when: core + template ------------------------------------------------------------------


def test_template_only_plugins(installs):
    data = sglang_fl_json(installs["template"], "plugins")
    plugins = {p["name"]: p for p in data["plugins"]}
    assert set(plugins) == {"reference", "template"} | preinstalled_plugins()
    template = plugins["template"]
    assert template["status"] == "loaded", template
    assert template["distribution"] == "sglang-fl-template"
    assert template["version"] == "0.1.0"
    assert template["module"] == "sglang_fl_template.plugin"
    assert template["error"] is None
    assert "sglang_fl_register_ops" in template["hooks"]
    assert plugins["reference"]["status"] == "loaded"


def test_template_only_ops_resolve_to_reference(installs):
    data = sglang_fl_json(installs["template"], "ops")
    assert [op["op"] for op in data["ops"]] == list(STANDARD_OPS)
    for op in data["ops"]:
        assert op["error"] is None
        assert op["chosen"] == f"reference.{op['op']}"
        chosen = op["candidates"][0]
        assert (chosen["outcome"], chosen["distribution"]) == ("chosen", "sglang-fl")
        template = [c for c in op["candidates"] if c["distribution"] == "sglang-fl-template"]
        assert len(template) == (op["op"] in TEMPLATE_OPS), op["candidates"]
        if not template:
            continue
        (candidate,) = template
        assert candidate["impl_id"] == "vendor.template"
        assert candidate["plugin"] == "template"
        assert candidate["kind"] == "vendor"
        assert candidate["vendor"] == "template"
        assert candidate["available"] is False
        assert candidate["outcome"] == "rejected"
        assert candidate["availability_reason"]  # the template's probe says why
        assert candidate["reason"] == f"unavailable: {candidate['availability_reason']}"


def test_template_only_console_script(installs):
    """The installed ``sglang-fl`` console script, not only ``python -m sglang_fl``."""
    script = Path(sys.executable).with_name("sglang-fl")
    assert script.exists()
    result = subprocess.run(
        [str(script), "explain", "silu_and_mul"],
        capture_output=True,
        text=True,
        env=environment(installs["template"]),
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "chosen  reference.silu_and_mul" in result.stdout
    assert "rejected  vendor.template" in result.stdout
    assert "from template (sglang-fl-template 0.1.0)" in result.stdout
