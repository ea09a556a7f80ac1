"""``sglang-fl hooks`` in process, ``SGLANG_FL_TRACE`` to a file, and the rules around them.

The acceptance tests over real wheels are in ``tests/cross/test_hooks_inspection.py``; these
cover what needs no wheel: trace destinations, per-process pids, answers after the winner,
``optionalhook`` implementations, and bad input.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
from pathlib import Path

import pytest

from sglang_fl import cli
from sglang_fl.config import Settings
from sglang_fl.errors import ConfigError
from sglang_fl.runtime import PlatformAnswer, Runtime

PID_LINE = re.compile(r"^\[pid (\d+)\] ")

PLATFORM_PLUGIN = """
from sglang_fl import hookimpl

@hookimpl
def sglang_fl_platform():
    {body}
"""

OPTIONAL_HOOK_PLUGIN = """
from sglang_fl import hookimpl

@hookimpl(optionalhook=True)
def sglang_fl_from_the_future(when):
    pass
"""


def load(**env: str) -> Runtime:
    return Runtime(Settings.from_environment({f"SGLANG_FL_{k.upper()}": v for k, v in env.items()}))


def trace_lines(path: Path) -> list[tuple[int, str]]:
    """``(pid, text)`` per line; every line must carry its pid."""
    lines = path.read_text().splitlines()
    assert lines, f"{path} is empty"
    parsed = []
    for line in lines:
        match = PID_LINE.match(line)
        assert match, f"no pid on trace line {line!r}"
        parsed.append((int(match.group(1)), line[match.end() :]))
    return parsed


# -- SGLANG_FL_TRACE ------------------------------------------------------------------------------


def test_trace_to_a_file_tags_every_line_with_the_pid(tmp_path, capsys, monkeypatch):
    trace = tmp_path / "trace.log"
    monkeypatch.setenv("SGLANG_FL_PLUGINS", "")
    monkeypatch.setenv("SGLANG_FL_TRACE", str(trace))
    assert cli.main(["plugins", "--json"]) == 0
    out, err = capsys.readouterr()
    json.loads(out)
    assert "[hook]" not in err  # the file, not stderr
    lines = trace_lines(trace)
    assert {pid for pid, _ in lines} == {os.getpid()}
    texts = [text for _, text in lines]
    assert "  sglang_fl_register_ops [hook]" in texts
    assert any(re.fullmatch(r"\s+registry: <\S*OpRegistry.*", t) for t in texts)
    assert any(t.strip().startswith("finish sglang_fl_register_ops -->") for t in texts)


def test_trace_file_is_appended_to_by_each_process(tmp_path, plugin_site):
    """A forked child (as SGLang's workers are, each with the variable) appends its own pid."""
    plugin_site.plugin("p_chip", PLATFORM_PLUGIN.format(body="return 'chip.platform:P'"))
    trace = tmp_path / "trace.log"
    trace.write_text("")  # appended to, never truncated
    runtime = load(plugins="p_chip", trace=str(trace))
    child = multiprocessing.get_context("fork").Process(target=runtime.platform)
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    by_pid: dict[int, list[str]] = {}
    for pid, text in trace_lines(trace):
        by_pid.setdefault(pid, []).append(text.strip())
    assert set(by_pid) == {os.getpid(), child.pid}
    assert "sglang_fl_register_ops [hook]" in by_pid[os.getpid()]
    assert by_pid[child.pid] == [
        "sglang_fl_platform [hook]",
        "finish sglang_fl_platform --> chip.platform:P [hook]",
    ]


def test_trace_to_stderr_tags_lines_with_the_pid(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_FL_PLUGINS", "")
    monkeypatch.setenv("SGLANG_FL_TRACE", "1")
    assert cli.main(["plugins", "--json"]) == 0
    err = capsys.readouterr().err
    assert f"[pid {os.getpid()}]   sglang_fl_register_ops [hook]\n" in err


def test_trace_file_that_cannot_be_written_is_bad_input(tmp_path, capsys, monkeypatch):
    target = tmp_path / "no-such-dir" / "trace.log"
    monkeypatch.setenv("SGLANG_FL_TRACE", str(target))
    assert cli.main(["hooks"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"sglang-fl: error: cannot append the hook trace (SGLANG_FL_TRACE) to {str(target)!r}: "
        "No such file or directory\n"
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("1", True), ("off", False), ("./trace.log", Path("trace.log")), ("/t/x", Path("/t/x"))],
)
def test_trace_values(raw, expected):
    assert Settings.from_environment({"SGLANG_FL_TRACE": raw}).trace == expected


@pytest.mark.parametrize("raw", ["ture", "trace.log"])
def test_trace_value_neither_boolean_nor_path(raw):
    with pytest.raises(ConfigError) as info:
        Settings.from_environment({"SGLANG_FL_TRACE": raw})
    assert str(info.value) == (
        f"SGLANG_FL_TRACE={raw!r} is neither a boolean nor a file path; allowed: 1, 0, true, "
        "false, yes, no, or a path containing '/' (e.g. ./trace.log)"
    )


# -- answers and unmatched implementations --------------------------------------------------------


def test_platform_answers_continue_past_the_winner(plugin_site):
    # Loaded sorted by name; pluggy calls the last registered first: p_b, then p_a.
    plugin_site.plugin("p_a", PLATFORM_PLUGIN.format(body="raise RuntimeError('no driver')"))
    plugin_site.plugin("p_b", PLATFORM_PLUGIN.format(body="return 'b.platform:B'"))
    runtime = load(plugins="p_a,p_b")
    assert runtime.platform() == "b.platform:B"
    assert list(runtime.platform_answers()) == [
        PlatformAnswer("p_b", "b.platform:B"),
        PlatformAnswer("p_a", None, "sglang_fl_platform raised RuntimeError: no driver"),
    ]


def test_optional_implementation_of_an_unknown_hook_loads_and_is_listed(
    plugin_site, capsys, monkeypatch
):
    module = plugin_site.plugin("p_future", OPTIONAL_HOOK_PLUGIN)
    monkeypatch.setenv("SGLANG_FL_PLUGINS", "p_future")
    assert cli.main(["hooks", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (unmatched,) = data["unmatched"]
    assert unmatched["hook"] == "sglang_fl_from_the_future"
    assert unmatched["plugin"] == "p_future"
    assert unmatched["function"] == f"{module}:sglang_fl_from_the_future"
    assert unmatched["file"] == str(plugin_site.root / f"{module}.py")
    assert unmatched["line"] == 4  # the decorator's line
    assert data["unregistered_plugins"] == []


def test_seed_layout_plugin_is_located_at_its_own_register_builtins(
    plugin_site, capsys, monkeypatch
):
    """Not at the loader's adapter that presents it to pluggy."""
    module = plugin_site.plugin("p_seed", "\ndef register_builtins(registry):\n    pass\n")
    monkeypatch.setenv("SGLANG_FL_PLUGINS", "p_seed")
    assert cli.main(["hooks", "sglang_fl_register_ops", "--json"]) == 0
    (register_ops,) = json.loads(capsys.readouterr().out)["hooks"]
    seed = next(i for i in register_ops["implementations"] if i["plugin"] == "p_seed")
    assert seed["function"] == f"{module}:register_builtins"
    assert (seed["file"], seed["line"]) == (str(plugin_site.root / f"{module}.py"), 2)
    assert seed["distribution"] == "sglang-fl-p_seed"
