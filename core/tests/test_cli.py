"""``sglang-fl``: every command with and without ``--json``, in-process and as a real process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_fl import __version__, cli
from sglang_fl.ops import STANDARD_OPS, get_contract

OPS = list(STANDARD_OPS)
PLUGIN_KEYS = {"name", "module", "distribution", "version", "status", "hooks", "error", "builtin"}
CANDIDATE_KEYS = {
    "impl_id",
    "kind",
    "vendor",
    "priority",
    "plugin",
    "distribution",
    "version",
    "available",
    "availability_reason",
    "outcome",
    "reason",
}

GOOD = """
from sglang_fl import hookimpl
from sglang_fl.dispatch.types import Availability, BackendImplKind, OpImpl

def silu(obj, x):
    return x

def probe():
    return Availability(False, "acme: no chip on this machine")

@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl(op_name="silu_and_mul", impl_id="vendor.acme",
                             kind=BackendImplKind.VENDOR, fn=silu, vendor="acme",
                             priority=100, available=probe))
"""


def value_and_source(entry: dict) -> dict:
    """The effective value and where it came from (``variable``/``help`` are checked apart)."""
    return {"value": entry["value"], "source": entry["source"]}


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    code, out, _ = run_cli(capsys, *argv, "--json")
    return code, json.loads(out)


def run_process(*argv: str, env: dict[str, str] | None = None, pythonpath: Path | None = None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_FL_")}
    full_env.update(env or {})
    if pythonpath is not None:
        full_env["PYTHONPATH"] = os.pathsep.join(
            [str(pythonpath), *filter(None, [full_env.get("PYTHONPATH")])]
        )
    return subprocess.run(
        [sys.executable, "-m", "sglang_fl", *argv],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
        check=False,
    )


@pytest.fixture
def only(monkeypatch):
    """Restrict loading to the named entry points (independent of what else is installed)."""

    def select(*names: str) -> None:
        monkeypatch.setenv("SGLANG_FL_PLUGINS", ",".join(names))

    return select


# -- plugins --------------------------------------------------------------------------------------


def test_plugins_json(capsys, plugin_site, only):
    plugin_site.plugin("acme", GOOD, version="2.5")
    only("acme")
    code, data = run_json(capsys, "plugins")
    assert code == 0
    assert data["schema_version"] == 1
    assert data["entry_point_group"] == "sglang_fl.backends"
    by_name = {p["name"]: p for p in data["plugins"]}
    for plugin in data["plugins"]:
        assert set(plugin) == PLUGIN_KEYS
    assert by_name["reference"] == {
        "name": "reference",
        "module": "sglang_fl.reference",
        "distribution": "sglang-fl",
        "version": __version__,
        "status": "loaded",
        "hooks": ["sglang_fl_register_ops"],
        "error": None,
        "builtin": True,
    }
    assert by_name["acme"]["status"] == "loaded"
    assert by_name["acme"]["distribution"] == "sglang-fl-acme"
    assert by_name["acme"]["version"] == "2.5"
    assert data["plugins"][0]["name"] == "reference"


def test_plugins_text_lists_failures_with_errors(capsys, plugin_site, only):
    plugin_site.plugin("acme", GOOD)
    plugin_site.plugin("broken", "import sglang_fl_missing_sdk\n")
    only("acme", "broken")
    code, out, _ = run_cli(capsys, "plugins")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["plugin", "distribution", "version", "status", "hooks", "error"]
    broken = next(line for line in lines if line.startswith("broken"))
    assert "sglang-fl-broken" in broken
    assert "failed" in broken
    assert "No module named 'sglang_fl_missing_sdk'" in broken
    acme = next(line for line in lines if line.startswith("acme"))
    assert "loaded" in acme
    assert "Traceback" not in out


def test_plugins_verbose_shows_tracebacks(capsys, plugin_site, only):
    plugin_site.plugin("broken", "import sglang_fl_missing_sdk\n")
    only("broken")
    code, out, _ = run_cli(capsys, "plugins", "--verbose")
    assert code == 0
    assert "broken: Traceback" in out


def test_plugins_disabled_listed_with_reason(capsys, plugin_site, only):
    plugin_site.plugin("acme", GOOD)
    only()
    code, data = run_json(capsys, "plugins")
    assert code == 0
    acme = next(p for p in data["plugins"] if p["name"] == "acme")
    assert acme["status"] == "disabled"
    assert acme["error"] == "not in SGLANG_FL_PLUGINS (environment SGLANG_FL_PLUGINS)"


def test_strict_failure_still_reported_by_plugins(capsys, plugin_site, only, monkeypatch):
    plugin_site.plugin("broken", "raise ImportError('no sdk')\n")
    only("broken")
    monkeypatch.setenv("SGLANG_FL_STRICT", "1")
    code, data = run_json(capsys, "plugins")
    assert code == 0
    broken = next(p for p in data["plugins"] if p["name"] == "broken")
    assert broken["status"] == "failed"
    assert "no sdk" in broken["error"]


# -- ops ------------------------------------------------------------------------------------------


def test_ops_json(capsys, plugin_site, only):
    plugin_site.plugin("acme", GOOD)
    only("acme")
    code, data = run_json(capsys, "ops")
    assert code == 0
    assert data["schema_version"] == 1
    # The ops; the selections apart (their candidates are not registered kernels).
    assert [op["op"] for op in data["ops"]] == list(OPS)
    assert [s["op"] for s in data["selections"]] == [
        "sglang_attention_backend",
        "sglang_graph_runner",
    ]
    backend, runner = data["selections"]
    assert backend["chosen"] == "reference.sglang_fl_attention"
    assert backend["signature"] == "factory(model_runner) -> sglang AttentionBackend"
    assert runner["chosen"] == "reference.sglang_graph_runner"
    assert runner["signature"] == "factory(model_runner) -> sglang decode graph runner"
    for op in data["ops"]:
        assert op["error"] is None
        assert op["chosen"] == f"reference.{op['op']}"
        assert op["order"] == ["flagos", "vendor", "reference"]
        assert op["order_source"] == "default"
        # A kernel takes its layer first, a collective its process group.
        first = "group" if get_contract(op["op"]).collective else "obj"
        assert op["signature"].startswith(f"{op['op']}({first}, ")
        for candidate in op["candidates"]:
            assert set(candidate) == CANDIDATE_KEYS
    silu = data["ops"][0]
    assert silu["sglang_layer"] == "SiluAndMul"
    acme = next(c for c in silu["candidates"] if c["impl_id"] == "vendor.acme")
    assert acme["outcome"] == "rejected"
    assert acme["available"] is False
    assert acme["availability_reason"] == "acme: no chip on this machine"
    assert acme["reason"] == "unavailable: acme: no chip on this machine"
    assert (acme["plugin"], acme["distribution"], acme["version"]) == (
        "acme",
        "sglang-fl-acme",
        "1.0",
    )
    assert (acme["kind"], acme["vendor"], acme["priority"]) == ("vendor", "acme", 100)
    chosen = silu["candidates"][0]
    assert chosen["outcome"] == "chosen"
    assert chosen["distribution"] == "sglang-fl"


def test_ops_text(capsys, plugin_site, only):
    plugin_site.plugin("acme", GOOD)
    only("acme")
    code, out, _ = run_cli(capsys, "ops")
    assert code == 0
    assert out.splitlines()[0].split() == [
        "op",
        "impl_id",
        "kind",
        "vendor",
        "priority",
        "provenance",
        "available",
        "verdict",
    ]
    for op in OPS:
        assert f"*reference.{op}" in out
    acme = next(line for line in out.splitlines() if "vendor.acme" in line)
    assert "sglang-fl-acme 1.0" in acme
    assert " no " in acme
    assert "rejected: unavailable: acme: no chip on this machine" in acme
    assert "(* = chosen" in out


WITHOUT_KERNEL = """
from sglang_fl import hookimpl

@hookimpl
def sglang_fl_register_ops(registry):
    registry.declare_no_kernel("layer_norm", "the acme SDK has no layer norm")
"""


def test_ops_say_why_a_vendor_has_no_kernel(capsys, plugin_site, only):
    plugin_site.plugin("acme", WITHOUT_KERNEL)
    only("acme")
    code, data = run_json(capsys, "ops")
    assert code == 0
    reports = {op["op"]: op for op in data["ops"]}
    assert reports["layer_norm"]["no_kernel"] == [
        {
            "plugin": "acme",
            "distribution": "sglang-fl-acme",
            "version": "1.0",
            "reason": "the acme SDK has no layer norm",
        }
    ]
    assert reports["rms_norm"]["no_kernel"] == []
    _, out, _ = run_cli(capsys, "ops")
    (line,) = [line for line in out.splitlines() if "no kernel:" in line]
    assert line.split()[:3] == ["layer_norm", "-", "acme"]
    assert line.endswith("no kernel: the acme SDK has no layer norm")
    _, out, _ = run_cli(capsys, "explain", "layer_norm")
    assert "  no kernel from acme (sglang-fl-acme 1.0): the acme SDK has no layer norm" in out


def test_ops_with_an_unresolvable_op_exits_1(capsys, only, monkeypatch):
    only()
    monkeypatch.setenv("SGLANG_FL_PER_OP", "rms_norm=vendor:nope")
    code, data = run_json(capsys, "ops")
    assert code == 1
    rms = next(op for op in data["ops"] if op["op"] == "rms_norm")
    assert rms["chosen"] is None
    assert "no usable implementation of op 'rms_norm'" in rms["error"]
    # The same OP shape as a resolved op: the order applied and every candidate's verdict.
    assert rms["order"] == ["vendor:nope"]
    assert rms["order_source"] == "environment SGLANG_FL_PER_OP"
    (candidate,) = rms["candidates"]
    assert candidate["impl_id"] == "reference.rms_norm"
    assert (candidate["plugin"], candidate["distribution"], candidate["version"]) == (
        "reference",
        "sglang-fl",
        __version__,
    )
    assert candidate["outcome"] == "rejected"
    assert candidate["reason"] == "matches no token of the order [vendor:nope]"
    assert next(op for op in data["ops"] if op["op"] == "silu_and_mul")["error"] is None
    code, out, _ = run_cli(capsys, "ops")
    assert code == 1
    assert "ERROR: no usable implementation of op 'rms_norm'" in out


# -- explain --------------------------------------------------------------------------------------


def test_explain_text(capsys, plugin_site, only):
    plugin_site.plugin("acme", GOOD)
    only("acme")
    code, out, _ = run_cli(capsys, "explain", "silu_and_mul")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "silu_and_mul: silu_and_mul(obj, x)  (SGLang layer SiluAndMul)"
    assert lines[1] == f"  {get_contract('silu_and_mul').summary}"
    assert lines[2] == "  order: flagos > vendor > reference  (from default)"
    assert "chosen  reference.silu_and_mul" in out
    assert "rejected  vendor.acme  [vendor, vendor=acme, priority=100, from acme" in out
    assert "unavailable: acme: no chip on this machine" in out


def test_explain_json(capsys, monkeypatch, only):
    only()
    monkeypatch.setenv("SGLANG_FL_PREFER", "reference")
    code, data = run_json(capsys, "explain", "rotary_embedding")
    assert code == 0
    assert data["schema_version"] == 1
    assert data["op"] == "rotary_embedding"
    assert data["chosen"] == "reference.rotary_embedding"
    assert data["order"] == ["reference", "flagos", "vendor"]
    assert data["order_source"] == "environment SGLANG_FL_PREFER"
    assert data["error"] is None
    assert set(data) == {
        "schema_version",
        "op",
        "signature",
        "sglang_layer",
        "no_kernel",
        "chosen",
        "order",
        "order_source",
        "candidates",
        "error",
        "contract",
    }
    assert data["contract"] == get_contract("rotary_embedding").describe()


def test_explain_prints_the_whole_contract(capsys, only):
    """Summary, the contract in words, the masks as formulas, dtypes and tolerances, the
    in-place rules and every case the kit runs."""
    only()
    code, out, _ = run_cli(capsys, "explain", "decode_attention")
    assert code == 0
    contract = get_contract("decode_attention")
    described = contract.describe()
    assert contract.summary in out
    assert contract.details.splitlines()[0] in out
    assert "sliding window: obj.sliding_window_size = w >= 0: query i sees the keys" in out
    assert "the key at i - w is included" in " ".join(out.split())
    assert "soft-capping: obj.logit_cap = c > 0" in out
    assert "float32 (atol=2e-05, rtol=2e-05)" in out
    assert "  q: must stay untouched (every case)" in out
    cases = len(contract.cases)
    assert f"kit: {cases} cases x 3 dtypes = {described['checks']} checks" in out
    assert all(f"  {case.name}" in out.splitlines() for case in contract.cases)
    code, out, _ = run_cli(capsys, "explain", "store_kv_cache")
    assert "  k_cache: written in place and returned as output 0 (every case)" in out


def test_explain_a_collective_names_its_world_sizes(capsys, only):
    only()
    code, data = run_json(capsys, "explain", "send")
    assert code == 0
    assert data["contract"]["world_sizes"] == [2, 4]
    assert data["contract"]["peers"] == ["recv"]
    _, out, _ = run_cli(capsys, "explain", "send")
    assert "a collective: each case runs on 2, 4 spawned ranks, with its peer recv" in out


def test_explain_unresolvable(capsys, monkeypatch, only):
    only()
    monkeypatch.setenv("SGLANG_FL_PER_OP", "silu_and_mul=flagos")
    code, out, _ = run_cli(capsys, "explain", "silu_and_mul")
    assert code == 1
    assert "no implementation: no usable implementation of op 'silu_and_mul'" in out


def test_explain_unknown_op_exits_2_with_suggestion(capsys):
    code, out, err = run_cli(capsys, "explain", "rms_nrom")
    assert code == 2
    assert out == ""
    assert "sglang-fl: error: unknown op 'rms_nrom' (did you mean 'rms_norm'?)" in err


def test_a_bug_keeps_its_traceback(monkeypatch):
    """Only sglang-fl's own errors become exit status 2; a KeyError from a bug propagates."""

    def buggy(args):
        return {}["missing"]

    monkeypatch.setattr(cli, "cmd_ops", buggy)
    with pytest.raises(KeyError, match="missing"):
        cli.main(["ops"])


# -- doctor ---------------------------------------------------------------------------------------


def test_doctor_json(capsys, plugin_site, only, tmp_path, monkeypatch):
    plugin_site.plugin("acme", GOOD)
    plugin_site.plugin("broken", "raise RuntimeError('firmware')\n")
    config = tmp_path / "fl.toml"
    config.write_text('deny_vendors = ["evil"]\n')
    monkeypatch.setenv("SGLANG_FL_CONFIG", str(config))
    only("acme", "broken")
    code, data = run_json(capsys, "doctor")
    assert code == 1  # a failed plugin is a problem
    assert data["schema_version"] == 1
    assert set(data) == {
        "schema_version",
        "sglang_fl",
        "python",
        "platform",
        "torch",
        "sglang",
        "vllm",
        "configuration",
        "plugins",
        "problems",
    }
    assert data["sglang_fl"]["version"] == __version__
    assert data["python"]["executable"] == sys.executable
    assert data["torch"]["version"].startswith("2.")
    assert set(data["torch"]["cuda"]) == {"built_with", "available", "device_count"}
    assert "version" in data["sglang"]
    configuration = data["configuration"]
    assert configuration["config_file"] == str(config)
    assert value_and_source(configuration["settings"]["deny_vendors"]) == {
        "value": ["evil"],
        "source": f"config file {config}",
    }
    assert value_and_source(configuration["settings"]["plugins"]) == {
        "value": ["acme", "broken"],
        "source": "environment SGLANG_FL_PLUGINS",
    }
    assert value_and_source(configuration["settings"]["prefer"]) == {
        "value": None,
        "source": "default",
    }
    assert data["plugins"]["loaded"][:2] == ["reference", "acme"]
    assert data["plugins"]["failed"] == ["broken"]
    assert len(data["problems"]) == 2
    assert data["problems"][0].startswith("plugin 'broken' (sglang-fl-broken) failed:")
    assert "firmware" in data["problems"][0]
    # The config file denies a vendor nothing installed is called.
    assert data["problems"][1].startswith(
        f"SGLANG_FL_DENY_VENDORS (config file {config}) names 'evil', which matches no installed"
    )


def test_doctor_text_healthy(capsys, only):
    only()
    code, out, _ = run_cli(capsys, "doctor")
    assert code == 0
    assert out.startswith(f"sglang-fl {__version__}")
    assert "problems: none" in out
    assert "plugins loaded    reference" in out
    assert "  strict           = False" in out
    assert "(default)" in out


def test_doctor_strict_and_unresolvable_op(capsys, plugin_site, only, monkeypatch):
    plugin_site.plugin("broken", "raise RuntimeError('firmware')\n")
    only("broken")
    monkeypatch.setenv("SGLANG_FL_STRICT", "1")
    monkeypatch.setenv("SGLANG_FL_PER_OP", "rms_norm=vendor:broken")
    code, out, _ = run_cli(capsys, "doctor")
    assert code == 1
    assert "plugin 'broken' (sglang-fl-broken) failed" in out
    assert "SGLANG_FL_STRICT=1: SGLang start-up would abort" in out
    assert "op 'rms_norm'" in out


# -- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["plugins", "ops", "doctor"])
def test_bad_configuration_exits_2_with_the_message(capsys, monkeypatch, command):
    monkeypatch.setenv("SGLANG_FL_PREFER", "gpu")
    code, out, err = run_cli(capsys, command)
    assert code == 2
    assert out == ""
    assert err.startswith("sglang-fl: error: SGLANG_FL_PREFER: invalid selection token 'gpu'")


def test_missing_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([])
    assert info.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


def test_trace_in_process(capsys, monkeypatch, only):
    only()
    monkeypatch.setenv("SGLANG_FL_TRACE", "1")
    code, out, err = run_cli(capsys, "plugins", "--json")
    assert code == 0
    json.loads(out)  # the trace does not pollute stdout
    assert "sglang_fl_register_ops [hook]" in err
    assert "finish sglang_fl_register_ops" in err


# -- real processes -------------------------------------------------------------------------------


def test_python_dash_m_with_a_failing_plugin(plugin_site):
    plugin_site.plugin("acme", GOOD)
    plugin_site.plugin("broken", "import sglang_fl_missing_sdk\n")
    result = run_process(
        "plugins", "--json", env={"SGLANG_FL_PLUGINS": "acme,broken"}, pythonpath=plugin_site.root
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    status = {p["name"]: (p["status"], p["distribution"]) for p in data["plugins"]}
    assert status["acme"] == ("loaded", "sglang-fl-acme")
    assert status["broken"] == ("failed", "sglang-fl-broken")
    broken = next(p for p in data["plugins"] if p["name"] == "broken")
    assert "No module named 'sglang_fl_missing_sdk'" in broken["error"]
    assert "sglang_fl_missing_sdk" in result.stderr  # logged as a warning too


def test_process_ops_text_and_trace(plugin_site):
    plugin_site.plugin("acme", GOOD)
    result = run_process(
        "ops",
        env={"SGLANG_FL_PLUGINS": "acme", "SGLANG_FL_TRACE": "1"},
        pythonpath=plugin_site.root,
    )
    assert result.returncode == 0, result.stderr
    assert "*reference.rms_norm" in result.stdout
    assert "vendor.acme" in result.stdout
    # pluggy's own tracing, one call per plugin that implements the hook
    assert result.stderr.count("sglang_fl_register_ops [hook]") == 2
    assert re.search(r"registry: <\S*OpRegistry", result.stderr)
    assert "[hook]" not in result.stdout


def test_process_bad_config_exits_2():
    result = run_process("doctor", "--json", env={"SGLANG_FL_PER_OP": "rms_nrom=reference"})
    assert result.returncode == 2
    assert result.stdout == ""
    assert "sglang-fl: error: SGLANG_FL_PER_OP: unknown op 'rms_nrom'" in result.stderr
    assert "did you mean 'rms_norm'?" in result.stderr
    assert "Traceback" not in result.stderr


def test_console_script_and_version():
    script = Path(sys.executable).with_name("sglang-fl")
    assert script.exists(), f"console script missing next to {sys.executable}"
    result = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0
    assert result.stdout.strip() == f"sglang-fl {__version__}"
