"""Hostile plugin distributions, installed for real: none may crash, hang or impersonate.

Issue 12, groups 1 (imports and hooks), 2 (availability probes), 3 (registrations outside a
plugin's own load) and 6 (fork). The distributions are in ``hostile_dists.py``; they are built
into wheels once per module and installed with ``pip --target`` into two sites put on
``PYTHONPATH`` of fresh interpreters: ``hostile`` (every attack, next to a well-behaved vendor)
``fork`` (a plugin whose import takes a while) and ``forker`` (a plugin whose import forks).
Every subprocess has a hard timeout, so a
hang fails the test instead of stalling the run; hooks and probes that never answer are
abandoned after ``SGLANG_FL_PLUGIN_TIMEOUT`` (2 s here).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hostile_dists import FORKER, GOODCHIP, HOOKS, PROBE_IDS, PROBES, REGISTRARS, SLOW_IMPORT
from test_vendor_wheels import environment, install_projects

TIMEOUT_S = "2"  # SGLANG_FL_PLUGIN_TIMEOUT of every run here
RUN_LIMIT_S = 120  # a subprocess still running after this is a hang: the test fails
SITES = {
    "hostile": (GOODCHIP, HOOKS, PROBES, REGISTRARS),
    "fork": (GOODCHIP, SLOW_IMPORT),
    "forker": (GOODCHIP, FORKER),
}


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hostile-dists")
    dists = {d.name: d for ds in SITES.values() for d in ds}
    projects = {name: d.write(root / "src") for name, d in dists.items()}
    for site, members in SITES.items():
        install_projects([projects[d.name] for d in members], root / site)
    return {site: root / site for site in SITES}


def run(
    site: Path, argv: list[str], extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """One fresh interpreter on ``site``; a run that does not end in time is a hang."""
    env = {**environment(site, plugin_timeout=TIMEOUT_S), **(extra_env or {})}
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


def cli_json(site: Path, *argv: str, expect_rc: int = 0) -> dict:
    result = run(site, ["-m", "sglang_fl", *argv, "--json"])
    assert result.returncode == expect_rc, result.stdout + result.stderr
    data: dict = json.loads(result.stdout)
    return data


def script_json(site: Path, code: str) -> dict:
    """Run ``code`` (which prints one JSON object last) and return that object."""
    result = run(site, ["-c", textwrap.dedent(code)])
    assert result.returncode == 0, result.stdout + result.stderr
    data: dict = json.loads(result.stdout.strip().splitlines()[-1])
    return data


# -- the hostile site, through the CLI (its own runtime) and the API (get_runtime) ---------------

API_SCRIPT = """
import json
import time

import sglang_fl
from sglang_fl.dispatch.types import BackendImplKind, OpImpl, Provenance
from sglang_fl.guard import describe_exception

runtime = sglang_fl.get_runtime()
time.sleep(0.2)  # the latecomer's thread keeps trying after loading ended
latecomer = __import__("hostile_registrars.latecomer", fromlist=["STOP"])
latecomer.STOP.set()


def silu(obj, x):
    return "late"


def refusal(action):
    try:
        action()
    except Exception as exc:
        return describe_exception(exc)
    return None


late = OpImpl("silu_and_mul", "vendor.after", BackendImplKind.VENDOR, silu, "after")
forged = Provenance("reference", "sglang-fl", sglang_fl.__version__)


def forged_scope():
    with runtime.registry.plugin_scope(forged):
        runtime.registry.register(late)


decisions = {}
for op in ("silu_and_mul", "gelu_and_mul", "gelu_new", "rms_norm"):
    decisions[op] = runtime.resolve(op).decision.to_dict()
print(json.dumps({
    "plugins": {p.name: p.to_dict() for p in runtime.plugins},
    "decisions": decisions,
    "latecomer": {"accepted": latecomer.ACCEPTED, "refusals": sorted(set(latecomer.REFUSALS))},
    "after_loading": {
        "register": refusal(lambda: runtime.registry.register(late)),
        "scope": refusal(forged_scope),
    },
}))
"""


@pytest.fixture(scope="module")
def cli_plugins(sites: dict[str, Path]) -> dict[str, dict]:
    data = cli_json(sites["hostile"], "plugins")
    return {p["name"]: p for p in data["plugins"]}


@pytest.fixture(scope="module")
def cli_ops(sites: dict[str, Path]) -> dict[str, dict]:
    data = cli_json(sites["hostile"], "ops")
    return {report["op"]: report for report in data["ops"]}


@pytest.fixture(scope="module")
def api(sites: dict[str, Path]) -> dict:
    return script_json(sites["hostile"], API_SCRIPT)


def candidates(decision: dict) -> dict[str, dict]:
    return {c["impl_id"]: c for c in decision["candidates"]}


# The plugins of the hostile site whose load must fail, and what each error says: the same
# through the CLI and through get_runtime().
FAILED = {
    "dup_b": (
        "'hostile_hooks.dup' is already loaded as plugin 'dup_a': one module can be one plugin only"
    ),
    "lazy_seed": (
        "import of 'hostile_hooks.lazy_seed' failed: ModuleNotFoundError: No module named "
        "'hostile_missing_sdk'"
    ),
    "genexit_hook": "sglang_fl_register_ops raised GeneratorExit",
    "genexit_import": "import of 'hostile_hooks.genexit_import' failed: GeneratorExit: at import",
    "sysexit_hook": "sglang_fl_register_ops raised SystemExit: 3",
    "baseexc_hook": "sglang_fl_register_ops raised PluginBaseError: not an Exception",
    "badstr_hook": (
        "sglang_fl_register_ops raised Unprintable: <str() of the exception raised RuntimeError>"
    ),
    "thread_register": (
        "(work)' registered an implementation while plugin 'thread_register' loads, but only "
        "the thread running its sglang_fl_register_ops hook may register"
    ),
    "runtime_in_hook": (
        "sglang_fl_register_ops raised PluginLoadError: get_runtime() was called from "
        "sglang_fl_register_ops of plugin 'runtime_in_hook' before the runtime finished loading"
    ),
    "runtime_at_import": (
        "import of 'hostile_hooks.runtime_at_import' failed: PluginLoadError: get_runtime() was "
        "called from the import of plugin 'runtime_at_import' before the runtime finished "
        "loading"
    ),
    "runtime_in_thread": "sglang_fl_register_ops did not return within 2 s",
    "sleeper": "sglang_fl_register_ops did not return within 2 s",
    "import_sleeper": (
        "import of 'hostile_hooks.import_sleeper' did not finish within 2 s "
        "(SGLANG_FL_PLUGIN_TIMEOUT); abandoned"
    ),
    "import_joins_runtime": (
        "import of 'hostile_hooks.import_joins_runtime' did not finish within 2 s"
    ),
    "reset_in_hook": (
        "sglang_fl_register_ops raised PluginLoadError: reset_runtime() was called from "
        "sglang_fl_register_ops of plugin 'reset_in_hook'; plugin code cannot load or reset"
    ),
    "aa_latecomer": "sglang_fl_register_ops raised RuntimeError: aa_latecomer fails on purpose",
    "nested_scope": (
        "sglang_fl_register_ops raised RegistrationError: cannot open a registration scope for "
        "reference (sglang-fl 0.1.0): while sglang-fl loads plugins only its loader may"
    ),
}
LOADED = ("goodchip", "dup_a", "lazy_sdk", "probed", "forger", "zz_innocent")


@pytest.mark.parametrize("path", ["cli", "api"])
def test_each_attack_fails_only_its_own_plugin(path, cli_plugins, api):
    plugins = cli_plugins if path == "cli" else api["plugins"]
    for name, error in FAILED.items():
        assert plugins[name]["status"] == "failed", plugins[name]
        assert error in plugins[name]["error"], plugins[name]["error"]
        assert plugins[name]["hooks"] == []
    for name in LOADED:
        assert plugins[name]["status"] == "loaded", plugins[name]


def test_failed_plugins_left_nothing_and_the_first_duplicate_works(api):
    gelu = candidates(api["decisions"]["gelu_and_mul"])
    assert set(gelu) == {"vendor.dup_a", "vendor.lazy_sdk", "reference.gelu_and_mul"}
    assert (gelu["vendor.dup_a"]["plugin"], gelu["vendor.dup_a"]["distribution"]) == (
        "dup_a",
        "sglang-fl-hostile-hooks",
    )


# -- group 2: probes ------------------------------------------------------------------------------

PROBE_REASONS = {
    "badstr": "availability probe raised Unprintable: <str() of the exception raised RuntimeError>",
    "exits": "availability probe raised SystemExit: 0",
    "genexit": "availability probe raised GeneratorExit",
    "odd_answer": (
        "availability probe returned <Unrepresentable whose repr() raised RuntimeError>, not a bool"
    ),
    "shifty": "availability probe raised RuntimeError: no answer for you",
    "blocks": (
        "availability probe did not answer within 2 s (SGLANG_FL_PLUGIN_TIMEOUT); "
        "treated as unavailable"
    ),
}
# A probe resolving an op: through get_runtime() the runtime exists and refuses to resolve for
# plugin code; the CLI's runtime is its own, so the probe's get_runtime() refuses to load one.
RESOLVING_PROBE = {
    "api": (
        "availability probe raised SglangFlError: the availability probe of "
        "'vendor.probed.resolves' asked to resolve op 'rms_norm': plugin code (hooks, "
        "availability probes) cannot resolve ops"
    ),
    "cli": (
        "availability probe raised PluginLoadError: get_runtime() was called from the "
        "availability probe of 'vendor.probed.resolves' before the runtime finished loading"
    ),
}


@pytest.mark.parametrize("path", ["cli", "api"])
def test_probes_that_raise_exit_reenter_or_block_are_unavailable(path, cli_ops, api):
    decision = cli_ops["silu_and_mul"] if path == "cli" else api["decisions"]["silu_and_mul"]
    found = candidates(decision)
    assert decision["chosen"] == "vendor.goodchip"
    for probe in PROBE_IDS:
        verdict = found[f"vendor.probed.{probe}"]
        assert verdict["available"] is False
        assert verdict["outcome"] == "rejected"
        if probe == "resolves":
            # In the CLI's process the global runtime may exist by then after all: the
            # runtime_in_thread attack's thread, abandoned with its hook, goes on loading it in
            # the background. Either refusal is a reason, never a deadlock; which one is timing.
            allowed = (RESOLVING_PROBE[path], RESOLVING_PROBE["api"])
        else:
            allowed = (PROBE_REASONS[probe],)
        assert verdict["availability_reason"].startswith(allowed), verdict


def test_text_ops_survives_the_probes(sites):
    result = run(sites["hostile"], ["-m", "sglang_fl", "ops"])
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("silu_and_mul")]
    assert any("*vendor.goodchip" in row for row in rows)
    assert sum("vendor.probed." in row for row in rows) == len(PROBE_IDS)


# -- group 3: registrations belong to the plugin that made them, and only while it loads ---------


def test_a_failed_plugins_thread_never_registers(api, cli_ops):
    late = api["latecomer"]
    assert late["accepted"] == []
    refusals = "\n".join(late["refusals"])
    # During the innocent plugin's load, after it, and as a forged scope: each refused.
    assert "registered an implementation while plugin 'zz_innocent' loads" in refusals
    assert "registered an implementation after sglang-fl finished loading" in refusals
    assert "only its loader may (provenance comes from the loader)" in refusals
    assert (
        "cannot open a registration scope for reference (sglang-fl 0.1.0): the registry is sealed"
        in refusals
    )
    for decision in (api["decisions"]["silu_and_mul"], cli_ops["silu_and_mul"]):
        assert "vendor.aa_latecomer" not in candidates(decision)


def test_the_innocent_plugin_keeps_its_registration(api):
    innocent = candidates(api["decisions"]["rms_norm"])["vendor.zz_innocent"]
    assert (innocent["plugin"], innocent["outcome"]) == ("zz_innocent", "chosen")


def test_provenance_comes_from_the_loader(api, cli_ops):
    for decision in (api["decisions"]["gelu_new"], cli_ops["gelu_new"]):
        forger = candidates(decision)["vendor.forger"]
        assert (forger["plugin"], forger["distribution"]) == (
            "forger",
            "sglang-fl-hostile-registrars",
        )
        assert "vendor.nested_scope" not in candidates(decision)


def test_nobody_registers_after_loading(api):
    after = api["after_loading"]
    assert after["register"].startswith(
        "RegistrationError: thread 'MainThread' registered an implementation after sglang-fl "
        "finished loading plugins: the registry is sealed"
    )
    assert after["scope"].startswith(
        "RegistrationError: cannot open a registration scope for reference (sglang-fl "
    )
    assert "the registry is sealed" in after["scope"]


# -- group 6: fork while another thread loads plugins ---------------------------------------------

FORK_SCRIPT = """
import json
import os
import sys
import threading
import time
from pathlib import Path

import sglang_fl
from sglang_fl.guard import describe_exception

started = Path(os.environ["SLOW_IMPORT_STARTED"])
loader = threading.Thread(target=sglang_fl.get_runtime, daemon=True)
loader.start()
deadline = time.monotonic() + 60
while not started.exists():
    assert time.monotonic() < deadline, "the plugin's import never started"
    time.sleep(0.01)
sys.stdout.flush()
forked_at = time.monotonic()
pid = os.fork()
if pid == 0:
    try:
        runtime = sglang_fl.get_runtime()
        child = {
            "slowimport": runtime.plugin("slowimport").status,
            "candidates": sorted(
                c.impl.impl_id for c in runtime.resolve("silu_and_mul").decision.candidates
            ),
        }
    except Exception as exc:
        child = {"error": describe_exception(exc)}
    os.write(1, (json.dumps(child) + "\\n").encode())
    os._exit(0)
waited = time.monotonic() - forked_at
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.02)
else:
    os.kill(pid, 9)
    print(json.dumps({"hung": True}))
    sys.exit(0)
print(json.dumps({"hung": False, "exit": os.waitstatus_to_exitcode(status)}))
"""


def fork_run(site: Path, tmp_path: Path, import_s: str) -> tuple[dict, dict]:
    """The child's report and the parent's, forking while the plugin's import sleeps."""
    result = run(
        site,
        ["-c", textwrap.dedent(FORK_SCRIPT)],
        {"SLOW_IMPORT_STARTED": str(tmp_path / "started"), "SLOW_IMPORT_S": import_s},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    parent = lines[-1]
    assert parent == {"hung": False, "exit": 0}, result.stdout + result.stderr
    return lines[0], parent


def test_fork_during_a_load_waits_for_it(sites, tmp_path):
    child, _ = fork_run(sites["fork"], tmp_path, import_s="1")
    assert child == {
        "slowimport": "loaded",
        "candidates": ["reference.silu_and_mul", "vendor.goodchip", "vendor.slowimport"],
    }


def test_a_child_forked_by_a_plugin_mid_load_gets_a_clear_error(sites, tmp_path):
    report = tmp_path / "forker.json"
    result = run(
        sites["forker"],
        ["-m", "sglang_fl", "plugins", "--json"],
        {"FORKER_REPORT": str(report)},
    )
    assert result.returncode == 0, result.stderr
    plugins = {p["name"]: p["status"] for p in json.loads(result.stdout)["plugins"]}
    assert plugins == {"reference": "loaded", "forker": "loaded", "goodchip": "loaded"}
    child = json.loads(report.read_text())
    assert child["forking_thread"].startswith(
        "PluginLoadError: get_runtime() was called from the import of plugin 'forker' before the "
        "runtime finished loading"
    ), child
    assert child["fresh_thread"].startswith(
        "PluginLoadError: this process was forked by plugin code while its parent was loading "
        "sglang-fl plugins"
    ), child
