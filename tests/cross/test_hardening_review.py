"""Hostile plugin wheels of the second outside review (issue 26), installed for real.

Each plugin is a real project built into a wheel and installed with ``pip install --target``
into a site put on ``PYTHONPATH`` of fresh interpreters, each with a hard timeout (a hang fails
the test). ``SGLANG_FL_PLUGIN_TIMEOUT`` is 2 s in every run.

- ``review`` site, next to the well-behaved ``goodchip``:
  ``blockreg`` (its kernel is a lazy proxy: ``inspect.signature()`` of it blocks inside
  ``registry.register()``), ``lazyprobe`` (seed layout: ``fn._is_available`` lookups that block
  or ``sys.exit(3)``), ``aaimpostor`` (sorts before ``cuda``: ``str`` subclasses that claim
  ``vendor.cuda`` and vendor ``cuda``), ``badreason`` (an ``Availability.reason`` whose
  ``__str__`` and ``__format__`` raise), ``shadow`` (registers kind ``reference`` with a high
  priority and wrong numerics), ``decliner`` (declines every call with ``Unsupported``), and the
  genuine ``sglang-fl-cuda`` wheel built from ``vendors/cuda``.
- ``pluggy16`` site: pluggy 1.6.0 installed over the venv's, and ``lazyattr``, whose module
  lists a lazily imported attribute after its hook (``__dir__``/``__getattr__``), read only by
  ``pm.register()`` under pluggy < 1.7; the lookup blocks.
- ``kit`` site: ``slowprobe``, whose availability probe never answers, for the conformance kit.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_vendor_wheels import PYPROJECT, environment, install_projects

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = "2"  # SGLANG_FL_PLUGIN_TIMEOUT of every run
RUN_LIMIT_S = 120  # a subprocess still running after this is a hang: the test fails
HOLD_S = 600  # "forever" for what blocks

_SILU = """
import torch


def silu_and_mul(obj, x):
    d = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :d]) * x[..., d:]
"""

PLUGINS: dict[str, tuple[str, str]] = {
    # entry-point name -> (module source, site)
    "goodchip": (
        _SILU
        + """
from sglang_fl.types import BackendImplKind, OpImpl, hookimpl


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl("silu_and_mul", "vendor.goodchip", BackendImplKind.VENDOR,
                             silu_and_mul, "goodchip"))
""",
        "review",
    ),
    "blockreg": (
        """
import time

from sglang_fl.types import BackendImplKind, OpImpl, hookimpl


class LazyKernel:
    # A proxy that loads its kernel on first use; inspect.signature() asks for it.
    def __call__(self, obj, x):
        return x

    @property
    def __signature__(self):
        time.sleep(HOLD_S)


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl("gelu_and_mul", "vendor.blockreg", BackendImplKind.VENDOR,
                             LazyKernel(), "blockreg"))
""",
        "review",
    ),
    "lazyprobe": (
        """
import sys
import time

from sglang_fl.types import BackendImplKind, OpImpl


class Kernel:
    def __init__(self, lookup):
        self.lookup = lookup

    def __call__(self, obj, x):
        return x

    def __getattr__(self, name):  # fn._is_available, looked up lazily
        if name == "_is_available":
            return self.lookup()
        raise AttributeError(name)


def hangs():
    time.sleep(HOLD_S)


def exits():
    sys.exit(3)


def register_builtins(registry):
    registry.register(OpImpl("gelu_new", "vendor.lazyprobe.hangs", BackendImplKind.VENDOR,
                             Kernel(hangs), "lazyprobe", priority=1000))
    registry.register(OpImpl("gelu_quick", "vendor.lazyprobe.exits", BackendImplKind.VENDOR,
                             Kernel(exits), "lazyprobe", priority=1000))
""",
        "review",
    ),
    "aaimpostor": (
        _SILU
        + """
from sglang_fl.types import BackendImplKind, OpImpl, hookimpl


class Liar(str):
    # Passes the identity rule's `vendor != name` and `startswith(namespace)` checks.
    def startswith(self, *args, **kwargs):
        return True

    def __ne__(self, other):
        return False


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl("silu_and_mul", Liar("vendor.cuda"), BackendImplKind.VENDOR,
                             silu_and_mul, Liar("cuda"), priority=10_000))
""",
        "review",
    ),
    "badreason": (
        _SILU
        + """
from sglang_fl.types import Availability, BackendImplKind, OpImpl, hookimpl


class Reason(str):
    def __str__(self):
        raise RuntimeError("no text for you")

    def __format__(self, spec):
        raise RuntimeError("no format for you")


def probe():
    return Availability(True, Reason("ready"))


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl("silu_and_mul", "vendor.badreason", BackendImplKind.VENDOR,
                             silu_and_mul, "badreason", available=probe))
""",
        "review",
    ),
    "shadow": (
        """
from sglang_fl.types import BackendImplKind, OpImpl, hookimpl


def rms_norm(obj, x, residual=None):
    return x * 0  # wrong numerics


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl("rms_norm", "reference.shadow.rms_norm", BackendImplKind.REFERENCE,
                             rms_norm, priority=10_000))
""",
        "review",
    ),
    "decliner": (
        """
from sglang_fl import Unsupported
from sglang_fl.types import BackendImplKind, OpImpl, hookimpl


def silu_and_mul(obj, x):
    raise Unsupported("decliner declines every call")


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl("silu_and_mul", "flagos.decliner", BackendImplKind.DEFAULT,
                             silu_and_mul))
""",
        "review",
    ),
    "lazyattr": (
        _SILU
        + """
import time

from sglang_fl.types import BackendImplKind, OpImpl, hookimpl


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl("silu_and_mul", "vendor.lazyattr", BackendImplKind.VENDOR,
                             silu_and_mul, "lazyattr"))


def __getattr__(name):
    if name == "zz_sdk":  # a lazily imported SDK module that never finishes loading
        time.sleep(HOLD_S)
    raise AttributeError(name)


def __dir__():
    return sorted([*globals(), "zz_sdk"])
""",
        "pluggy16",
    ),
    "slowprobe": (
        _SILU
        + """
import time

from sglang_fl.types import BackendImplKind, OpImpl, hookimpl


def never_answers():
    time.sleep(HOLD_S)
    return True


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl("silu_and_mul", "vendor.slowprobe", BackendImplKind.VENDOR,
                             silu_and_mul, "slowprobe", available=never_answers))
""",
        "kit",
    ),
}
SITES = ("review", "pluggy16", "kit")


def write_plugin(root: Path, name: str, source: str) -> Path:
    project = root / name
    package = project / "src" / f"sglang_fl_{name}"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        textwrap.dedent(source).replace("HOLD_S", str(HOLD_S)).lstrip()
    )
    pyproject = PYPROJECT.format(
        name=name,
        version="0.1.0",
        ep_name=json.dumps(name),
        entry_point=f"sglang_fl_{name}",
    )
    (project / "pyproject.toml").write_text(pyproject)
    return project


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hardening-review")
    jobs = [
        (write_plugin(root / "src", name, source), root / site / "dist")
        for name, (source, site) in PLUGINS.items()
    ]
    cuda = root / "src" / "cuda"
    shutil.copytree(
        ROOT / "vendors" / "cuda",
        cuda,
        ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", "tests"),
    )
    jobs.append((cuda, root / "review" / "dist"))
    for site in SITES:
        members = [project for project, out in jobs if out == root / site / "dist"]
        install_projects(members, root / site / "site")
    # pluggy 1.6 over the venv's: its pm.register() reads every attribute dir() lists.
    pluggy = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--target", str(root / "pluggy16" / "site"), "pluggy==1.6.0"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert pluggy.returncode == 0, f"installing pluggy 1.6.0 failed:\n{pluggy.stderr}"
    return {site: root / site / "site" for site in SITES}


def run(site: Path, argv: list[str], **settings: str) -> subprocess.CompletedProcess[str]:
    """One fresh interpreter on ``site``; a run that does not end in time is a hang."""
    env = environment(site, plugin_timeout=TIMEOUT_S, **settings)
    try:
        return subprocess.run(
            [sys.executable, *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=RUN_LIMIT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{argv} hung: still running after {RUN_LIMIT_S} s\n{exc.stderr}")


def cli_json(site: Path, *argv: str, expect_rc: int | None = 0, **settings: str) -> dict:
    result = run(site, ["-m", "sglang_fl", *argv, "--json"], **settings)
    if expect_rc is not None:
        assert result.returncode == expect_rc, result.stdout + result.stderr
    data: dict = json.loads(result.stdout)  # all of stdout is one (strict) JSON document
    return data


@pytest.fixture(scope="module")
def review_plugins(sites: dict[str, Path]) -> dict[str, dict]:
    return {p["name"]: p for p in cli_json(sites["review"], "plugins")["plugins"]}


@pytest.fixture(scope="module")
def review_ops(sites: dict[str, Path]) -> dict[str, dict]:
    return {r["op"]: r for r in cli_json(sites["review"], "ops")["ops"]}


# -- 1. plugin code outside the bounded worker or under a core lock -------------------------------


def test_a_hook_blocking_inside_register_is_abandoned(review_plugins) -> None:
    """Before: register() held the registry lock while inspecting the proxy, and the loader's
    abandon_scope() waited for that lock forever (`plugins` hung despite the timeout)."""
    blocked = review_plugins["blockreg"]
    assert blocked["status"] == "failed"
    assert "did not return within 2 s" in blocked["error"]
    assert review_plugins["goodchip"]["status"] == "loaded"


def test_probe_lookups_that_block_or_exit_make_kernels_unavailable(review_ops) -> None:
    """Before: `ops` hung on the blocking lookup, and the exiting one ended `ops --json` with
    exit 3 and no output."""
    hangs = {c["impl_id"]: c for c in review_ops["gelu_new"]["candidates"]}
    assert hangs["vendor.lazyprobe.hangs"]["outcome"] == "rejected"
    assert "did not answer within 2 s" in hangs["vendor.lazyprobe.hangs"]["reason"]
    exits = {c["impl_id"]: c for c in review_ops["gelu_quick"]["candidates"]}
    assert exits["vendor.lazyprobe.exits"]["outcome"] == "rejected"
    assert "SystemExit: 3" in exits["vendor.lazyprobe.exits"]["reason"]
    assert review_ops["gelu_new"]["chosen"] == "reference.gelu_new"


def test_pm_register_reads_no_lazy_attribute_under_pluggy_1_6(sites) -> None:
    """Before: pluggy 1.6's register() looked up `zz_sdk` in the loading thread: a hang."""
    site = sites["pluggy16"]
    version = run(site, ["-c", "import pluggy; print(pluggy.__version__)"])
    assert version.stdout.strip() == "1.6.0", version.stderr
    plugins = {p["name"]: p for p in cli_json(site, "plugins")["plugins"]}
    lazy = plugins["lazyattr"]
    # The lookup happens in the bounded import worker now: the plugin fails, the host runs.
    assert lazy["status"] == "failed"
    assert "did not finish within 2 s" in lazy["error"]


# -- 2. strings that pass isinstance(str) but lie --------------------------------------------------


def test_a_str_subclass_cannot_impersonate_the_cuda_wheel(review_plugins, sites) -> None:
    """Before: aaimpostor registered `vendor.cuda` as vendor `cuda`, the real wheel failed as
    "already owned", and PREFER=vendor:cuda chose the impostor."""
    impostor = review_plugins["aaimpostor"]
    assert impostor["status"] == "failed"
    # Its strings are copied as plain str: its lying vendor is what the identity rule sees.
    refusal = "registered 'vendor.cuda' with vendor='cuda'; a plugin's vendor name"
    assert refusal in impostor["error"]
    cuda = review_plugins["cuda"]
    assert (cuda["status"], cuda["error"], cuda["distribution"]) == (
        "loaded",
        None,
        "sglang-fl-cuda",
    )
    report = cli_json(sites["review"], "explain", "silu_and_mul", prefer="vendor:cuda")
    by_id = {c["impl_id"]: c for c in report["candidates"]}
    assert by_id["vendor.cuda"]["distribution"] == "sglang-fl-cuda"
    assert all(c["plugin"] != "aaimpostor" for c in report["candidates"])


def test_a_reason_whose_str_raises_is_kept_as_plain_text(review_ops, sites) -> None:
    """Before: Runtime.resolve and `ops --json` crashed on the reason's __str__/__format__."""
    candidates = {c["impl_id"]: c for c in review_ops["silu_and_mul"]["candidates"]}
    assert candidates["vendor.badreason"]["availability_reason"] == "ready"
    text = run(sites["review"], ["-m", "sglang_fl", "explain", "silu_and_mul"])
    assert text.returncode == 0, text.stderr
    assert "availability: ready" in text.stdout


# -- 3. kind reference is core's ------------------------------------------------------------------


def test_a_plugin_cannot_register_kind_reference(review_plugins, review_ops, sites) -> None:
    """Before: reference.shadow.rms_norm won by default and under PER_OP=rms_norm=reference."""
    shadow = review_plugins["shadow"]
    assert shadow["status"] == "failed"
    assert "kind=BackendImplKind.REFERENCE; that kind is core's" in shadow["error"]
    assert review_ops["rms_norm"]["chosen"] == "reference.rms_norm"
    pinned = cli_json(sites["review"], "explain", "rms_norm", per_op="rms_norm=reference")
    assert pinned["chosen"] == "reference.rms_norm"
    chosen = next(c for c in pinned["candidates"] if c["outcome"] == "chosen")
    assert (chosen["plugin"], chosen["distribution"]) == ("reference", "sglang-fl")


# -- 4./5. verify names who ran; NaN stays JSON ----------------------------------------------------

VERIFY_SCRIPT = """
import json
import sys

import torch

import sglang_fl
from sglang_fl.dispatch_report import DispatchReport, ReportEvent
from sglang_fl.verify import Verifier

report = DispatchReport(__import__("pathlib").Path(sys.argv[1]))
resolution = sglang_fl.get_runtime().resolve("silu_and_mul")
verifier = Verifier(3, None, lambda record: report.emit(ReportEvent.VERIFY, **record))
chain = resolution.bind()
fn = verifier.wrap(chain.fn, resolution.decision.chosen, "Layer", chain=chain)
nan = torch.full((2, 8), float("nan"))
for x in (torch.randn(4, 8), torch.randn(4, 8), nan):
    fn(None, x)
print(json.dumps({"chosen": resolution.decision.chosen.impl_id}))
"""


def test_verify_names_the_fallback_that_ran_and_writes_strict_json(sites, tmp_path) -> None:
    """Before: `flagos.decliner: fail 3/3` though it never computed a call, and a NaN wrote
    a bare `Infinity` that jq and JSON.parse reject."""
    log = tmp_path / "dispatch.jsonl"
    result = run(
        sites["review"],
        ["-c", VERIFY_SCRIPT, str(log)],
        plugins="decliner",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"chosen": "flagos.decliner"}

    def refuse(constant: str) -> None:
        raise AssertionError(f"non-standard JSON constant {constant} in the dispatch log")

    records = [json.loads(line, parse_constant=refuse) for line in log.read_text().splitlines()]
    assert [r["impl_id"] for r in records] == ["reference.silu_and_mul"] * 3
    assert [r["verdict"] for r in records] == ["pass", "pass", "fail"]  # a NaN is out of bounds
    assert records[2]["max_abs_error"] == "Infinity"
    summary = cli_json(sites["review"], "verify-report", str(log), expect_rc=1)
    (row,) = summary["rows"]
    assert (row["impl_id"], row["calls_checked"], row["calls_failed"]) == (
        "reference.silu_and_mul",
        3,
        1,
    )
    assert row["max_abs_error"] == "Infinity"


# -- 10. the kit honours SGLANG_FL_PLUGIN_TIMEOUT --------------------------------------------------

KIT_SCRIPT = """
import json
import time

from sglang_fl.testing import checks

started = time.monotonic()
outcomes = [(c.id, c.run()) for c in checks.plan("slowprobe", op="silu_and_mul")]
print(json.dumps({
    "seconds": time.monotonic() - started,
    "outcomes": {name: [o.status, o.message] for name, o in outcomes},
}))
"""


def test_the_kit_waits_for_a_probe_no_longer_than_the_plugin_timeout(sites) -> None:
    """Before: the kit's own cache waited 60 s for the probe, whatever the setting."""
    result = run(sites["kit"], ["-c", KIT_SCRIPT])
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["seconds"] < 30
    messages = " ".join(message for _, message in report["outcomes"].values())
    assert "did not answer within 2 s" in messages
