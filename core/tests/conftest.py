"""Shared fixtures: an environment without ``SGLANG_FL_*``, a fresh runtime, real plugin dists.

``plugin_site`` writes real distributions (``.dist-info/METADATA`` + ``entry_points.txt`` and
their modules) into a temporary directory put on ``sys.path``, so the loader discovers them
through ``importlib.metadata.entry_points`` exactly as it discovers an installed wheel.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from sglang_fl import runtime as runtime_module


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch):
    """No ``SGLANG_FL_*`` variable leaks in, and every test starts and ends without a runtime."""
    for name in list(os.environ):
        if name.startswith("SGLANG_FL_"):
            monkeypatch.delenv(name)
    runtime_module.reset_runtime()
    yield
    runtime_module.reset_runtime()


class PluginSite:
    """A directory on ``sys.path`` holding throwaway distributions with entry points."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.token = uuid.uuid4().hex[:8]

    def module_name(self, stem: str) -> str:
        """A module name unique to this test, so ``sys.modules`` never serves a stale one."""
        return f"fltest_{stem}_{self.token}"

    def add(
        self,
        distribution: str,
        entry_points: dict[str, str],
        modules: dict[str, str],
        *,
        version: str = "1.0",
        group: str = "sglang_fl.backends",
    ) -> None:
        """Write ``modules`` (name -> source) and a dist-info advertising ``entry_points``."""
        for name, source in modules.items():
            (self.root / f"{name}.py").write_text(textwrap.dedent(source))
        normalized = re.sub(r"[-_.]+", "_", distribution)
        info = self.root / f"{normalized}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n"
        )
        lines = [f"[{group}]", *(f"{name} = {value}" for name, value in entry_points.items())]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        (info / "RECORD").write_text("")
        importlib.invalidate_caches()

    def plugin(
        self, name: str, source: str, *, distribution: str | None = None, version: str = "1.0"
    ) -> str:
        """One distribution with one entry point ``name`` whose module has ``source``.

        Returns the module name. The distribution defaults to ``sglang-fl-<name>``.
        """
        module = self.module_name(name)
        self.add(
            distribution or f"sglang-fl-{name}",
            {name: module},
            {module: source},
            version=version,
        )
        return module

    def cleanup(self) -> None:
        for name in [m for m in sys.modules if m.endswith(self.token)]:
            del sys.modules[name]


@pytest.fixture
def plugin_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    site = PluginSite(root)
    yield site
    site.cleanup()
