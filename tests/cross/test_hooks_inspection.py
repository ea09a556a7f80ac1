"""``sglang-fl hooks`` over real plugin wheels, built and installed as users get them.

Throwaway vendor projects are built into wheels and installed into a target directory (the
helpers of ``test_vendor_wheels``), then inspected with ``python -m sglang_fl`` in fresh
interpreters. Entry points load sorted by name and pluggy calls the plugin registered last
first, so ``firstchip``'s ``tryfirst`` is what puts it ahead of ``secondchip``:

- ``firstchip``: ``sglang_fl_platform`` with ``tryfirst``, answers a platform;
- ``secondchip``: ``sglang_fl_platform``, answers another platform (they disagree);
- ``wrapchip``: a new-style ``wrapper=True`` ``sglang_fl_platform``;
- ``renamechip``: implements ``sglang_fl_register_ops`` as ``add_kernels`` (``specname``);
- ``futurechip``: a ``trylast`` ``sglang_fl_register_ops`` and an ``optionalhook``
  implementation of a hook this sglang-fl does not specify;
- ``brokenchip``: its module imports an SDK that is not installed: it never registers.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from test_vendor_wheels import install_projects, sglang_fl, sglang_fl_json, write_project

FIRST_PLATFORM = "sglang_fl_firstchip.platform:FirstPlatform"
SECOND_PLATFORM = "sglang_fl_secondchip.platform:SecondPlatform"

PLUGINS = {
    "firstchip": (
        "1.1.0",
        f"""
        from sglang_fl import hookimpl


        @hookimpl(tryfirst=True)
        def sglang_fl_platform():
            return {FIRST_PLATFORM!r}
        """,
    ),
    "secondchip": (
        "2.2.0",
        f"""
        from sglang_fl import hookimpl


        @hookimpl
        def sglang_fl_platform():
            return {SECOND_PLATFORM!r}
        """,
    ),
    "wrapchip": (
        "3.3.0",
        """
        from sglang_fl import hookimpl


        @hookimpl(wrapper=True)
        def sglang_fl_platform():
            answer = yield
            return answer
        """,
    ),
    "renamechip": (
        "4.4.0",
        """
        from sglang_fl import hookimpl


        @hookimpl(specname="sglang_fl_register_ops")
        def add_kernels(registry):
            pass
        """,
    ),
    "futurechip": (
        "5.5.0",
        """
        from sglang_fl import hookimpl


        @hookimpl(trylast=True)
        def sglang_fl_register_ops(registry):
            pass


        @hookimpl(optionalhook=True)
        def sglang_fl_teardown(reason):
            pass
        """,
    ),
    "brokenchip": (
        "0.0.1",
        """
        import sglang_fl_brokenchip_sdk  # not installed

        from sglang_fl import hookimpl


        @hookimpl
        def sglang_fl_platform():
            return "never asked"
        """,
    ),
}
IMPL_KEYS = {
    "plugin",
    "distribution",
    "version",
    "function",
    "file",
    "line",
    "tryfirst",
    "trylast",
    "wrapper",
    "hookwrapper",
    "optionalhook",
    "specname",
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hook-wheels")
    projects = [
        write_project(root / "src", name, version, textwrap.dedent(source))
        for name, (version, source) in PLUGINS.items()
    ]
    site = install_projects(projects, root / "site")
    assert len(list(site.glob("*.dist-info"))) == len(PLUGINS)
    return site


@pytest.fixture(scope="module")
def report(site: Path) -> dict:
    return sglang_fl_json(site, "hooks")


def hook(report: dict, name: str) -> dict:
    (found,) = [h for h in report["hooks"] if h["name"] == name]
    return found


def decorator_line(site: Path, plugin: str, function: str) -> tuple[str, int]:
    """Where an installed plugin's hook implementation starts: its file and decorator line."""
    path = site / f"sglang_fl_{plugin}" / "__init__.py"
    lines = path.read_text().splitlines()
    index = next(n for n, line in enumerate(lines) if line.startswith(f"def {function}("))
    return str(path), index  # the decorator is the line above: 1-based index == 0-based def


def test_specifications_are_described(report: dict) -> None:
    assert report["schema_version"] == 1
    assert report["project"] == "sglang_fl"
    assert [h["name"] for h in report["hooks"]] == [
        "sglang_fl_attention_backend",
        "sglang_fl_communicator",
        "sglang_fl_graph_runner",
        "sglang_fl_platform",
        "sglang_fl_register_ops",
    ]
    platform = hook(report, "sglang_fl_platform")
    assert platform["arguments"] == []
    assert platform["firstresult"] is True
    assert platform["historic"] is False
    assert platform["doc"].startswith("The dotted path of the SGLang platform class")
    register = hook(report, "sglang_fl_register_ops")
    assert register["arguments"] == ["registry"]
    assert register["firstresult"] is False
    assert register["doc"] == "Add this plugin's operator implementations to ``registry``."
    assert (register["answers"], register["winner"]) == (None, None)


def test_platform_call_order_answers_and_winner(report: dict, site: Path) -> None:
    platform = hook(report, "sglang_fl_platform")
    impls = platform["implementations"]
    assert all(set(i) == IMPL_KEYS for i in impls)
    # The wrapper wraps the others, so it is entered first; tryfirst puts firstchip ahead of
    # secondchip, which pluggy would otherwise call first (registered later).
    assert [i["plugin"] for i in impls] == ["wrapchip", "firstchip", "secondchip"]
    wrap, first, second = impls
    assert (wrap["wrapper"], wrap["hookwrapper"], wrap["tryfirst"]) == (True, False, False)
    assert (first["tryfirst"], first["wrapper"], first["trylast"]) == (True, False, False)
    assert not any(second[flag] for flag in ("tryfirst", "trylast", "wrapper", "hookwrapper"))
    assert (first["distribution"], first["version"]) == ("sglang-fl-firstchip", "1.1.0")
    assert first["function"] == "sglang_fl_firstchip:sglang_fl_platform"
    assert (first["file"], first["line"]) == decorator_line(site, "firstchip", "sglang_fl_platform")
    assert platform["answers"] == [
        {"plugin": "wrapchip", "answer": None, "problem": None},
        {"plugin": "firstchip", "answer": FIRST_PLATFORM, "problem": None},
        {"plugin": "secondchip", "answer": SECOND_PLATFORM, "problem": None},
    ]
    assert platform["winner"] == "firstchip"


def test_register_ops_order_specname_and_trylast(report: dict, site: Path) -> None:
    impls = hook(report, "sglang_fl_register_ops")["implementations"]
    # reference registered first, renamechip after it (called before it); trylast goes last.
    assert [i["plugin"] for i in impls] == ["renamechip", "reference", "futurechip"]
    rename, reference, future = impls
    assert rename["specname"] == "sglang_fl_register_ops"
    assert rename["function"] == "sglang_fl_renamechip:add_kernels"
    assert (rename["file"], rename["line"]) == decorator_line(site, "renamechip", "add_kernels")
    assert (reference["distribution"], reference["specname"]) == ("sglang-fl", None)
    assert reference["function"].startswith("sglang_fl.reference:")
    assert (future["trylast"], future["specname"]) == (True, None)


def test_unmatched_implementation_and_unregistered_plugin(report: dict, site: Path) -> None:
    (unmatched,) = report["unmatched"]
    assert unmatched["hook"] == "sglang_fl_teardown"
    assert (unmatched["plugin"], unmatched["version"]) == ("futurechip", "5.5.0")
    assert unmatched["optionalhook"] is True
    assert (unmatched["file"], unmatched["line"]) == decorator_line(
        site, "futurechip", "sglang_fl_teardown"
    )
    (broken,) = report["unregistered_plugins"]
    assert broken == {
        "name": "brokenchip",
        "distribution": "sglang-fl-brokenchip",
        "version": "0.0.1",
        "status": "failed",
        "error": "import of 'sglang_fl_brokenchip' failed: ModuleNotFoundError: "
        "No module named 'sglang_fl_brokenchip_sdk'",
    }


def test_one_hook_as_text(site: Path) -> None:
    result = sglang_fl(site, "hooks", "sglang_fl_platform")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("sglang_fl_platform()  [firstresult]\n  The dotted path")
    rows = [
        line.split() for line in out.splitlines() if line.startswith("  ") and line[2:3].isdigit()
    ]
    assert [(row[0], row[1]) for row in rows] == [
        ("1", "wrapchip"),
        ("2", "firstchip"),
        ("3", "secondchip"),
    ]
    assert rows[0][-2:] == ["wrapper", "None"]
    assert rows[1][-3:] == ["tryfirst", repr(FIRST_PLATFORM), "(wins)"]
    assert rows[2][-1] == repr(SECOND_PLATFORM)
    assert "sglang_fl_register_ops" not in out
    assert "brokenchip  sglang-fl-brokenchip 0.0.1  failed  import of" in out


def test_unmatched_hook_can_be_asked_by_name(site: Path) -> None:
    data = sglang_fl_json(site, "hooks", "sglang_fl_teardown")
    assert data["hooks"] == []
    assert [u["plugin"] for u in data["unmatched"]] == ["futurechip"]


def test_unknown_hook_is_bad_input(site: Path) -> None:
    result = sglang_fl(site, "hooks", "sglang_fl_platfrom")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines()[-1] == (  # after the warning about brokenchip
        "sglang-fl: error: unknown hook 'sglang_fl_platfrom' (did you mean "
        "'sglang_fl_platform'?); known hooks: sglang_fl_attention_backend, sglang_fl_communicator, "
        "sglang_fl_graph_runner, sglang_fl_platform, "
        "sglang_fl_register_ops, sglang_fl_teardown"
    )


def test_doctor_points_at_hooks_when_plugins_disagree(site: Path) -> None:
    data = sglang_fl_json(site, "doctor", expect_rc=1)
    (line,) = [p for p in data["problems"] if "disagree" in p]
    assert line == (
        f"plugins disagree on sglang_fl_platform ('firstchip' -> {FIRST_PLATFORM!r}, "
        f"'secondchip' -> {SECOND_PLATFORM!r}); 'firstchip' wins as pluggy calls it first: "
        "see `sglang-fl hooks sglang_fl_platform`"
    )


def test_doctor_is_quiet_when_only_one_plugin_answers(site: Path) -> None:
    data = sglang_fl_json(site, "doctor", plugins="firstchip,wrapchip")
    assert data["problems"] == []
