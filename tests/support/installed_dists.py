"""Throwaway plugin distributions for the tests, written as installed distributions.

Entry-point discovery (``importlib.metadata``, which sglang-fl's loader, SGLang's plugin loader
and vLLM's all use) reads only what an installer leaves in a site directory: the packages'
files and a ``NAME-VERSION.dist-info`` directory holding ``METADATA``, ``entry_points.txt`` and
``RECORD`` (the `recording installed projects`_ specification). :func:`install_dist` writes
exactly that, so a test plugin is discovered, loaded and reported like a wheel that ``pip``
installed, in milliseconds instead of a ``build`` + ``pip install`` each. The packaging path
itself (a real ``python -m build`` and ``pip install``) keeps its own tests:
``tests/cross/test_readme_install.py``, ``tests/kit/test_walkthrough.py`` and one real-wheel
case in ``tests/cross/test_vendor_wheels.py``.

.. _recording installed projects:
   https://packaging.python.org/en/latest/specifications/recording-installed-packages/
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import sys
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["ENTRY_POINT_GROUP", "install_dist", "install_project", "pythonpath_with"]

ENTRY_POINT_GROUP = "sglang_fl.backends"
INSTALLER = "sglang-fl-tests"


def _normalized(name: str) -> str:
    """The distribution name as a ``.dist-info`` directory spells it (PEP 427, PEP 503)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _record_line(site: Path, path: Path) -> str:
    data = path.read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path.relative_to(site).as_posix()},sha256={digest},{len(data)}"


def install_dist(
    site: Path,
    name: str,
    version: str,
    *,
    files: Mapping[str, str],
    entry_points: Mapping[str, Mapping[str, str]] | None = None,
    requires: Iterable[str] = ("sglang-fl",),
    dedent: bool = True,
) -> Path:
    """Install distribution ``name`` ``version`` into ``site`` (created if needed); return ``site``.

    ``files`` maps paths relative to ``site`` (``"sglang_fl_probe/__init__.py"``) to their text
    (dedented unless ``dedent=False``); ``entry_points`` maps a group to ``{name: value}``
    (default: none; a test plugin passes ``{ENTRY_POINT_GROUP: {"probe": "sglang_fl_probe"}}``).
    A second call for the same ``site`` adds another distribution beside the first.
    """
    site.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for relative, text in files.items():
        path = site / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text) if dedent else text)
        written.append(path)
    info = site / f"{_normalized(name)}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=False)
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    metadata += [f"Requires-Dist: {requirement}" for requirement in requires]
    (info / "METADATA").write_text("\n".join(metadata) + "\n")
    (info / "INSTALLER").write_text(INSTALLER + "\n")
    written += [info / "METADATA", info / "INSTALLER"]
    if entry_points:
        sections = [
            f"[{group}]\n" + "".join(f"{key} = {value}\n" for key, value in points.items())
            for group, points in entry_points.items()
        ]
        (info / "entry_points.txt").write_text("\n".join(sections))
        written.append(info / "entry_points.txt")
    top_level = sorted({Path(relative).parts[0].removesuffix(".py") for relative in files})
    (info / "top_level.txt").write_text("".join(f"{name}\n" for name in top_level))
    written.append(info / "top_level.txt")
    record = [_record_line(site, path) for path in written]
    record.append(f"{(info / 'RECORD').relative_to(site).as_posix()},,")
    (info / "RECORD").write_text("\n".join(record) + "\n")
    return site


def pythonpath_with(*sites: Path, env: Mapping[str, str] | None = None) -> str:
    """``PYTHONPATH`` with ``sites`` first, then what ``env`` (default: this process) had."""
    inherited = (os.environ if env is None else env).get("PYTHONPATH", "")
    return os.pathsep.join([*(str(site) for site in sites), *filter(None, [inherited])])


def install_project(project: Path, site: Path) -> Path:
    """Install a project (``pyproject.toml`` with a PEP 621 ``[project]`` table) into ``site``
    as its wheel would install: its packages, metadata and entry points; returns ``site``.

    The packages are the top-level packages (directories with an ``__init__.py``) and modules
    of ``project/src``, or of ``project`` itself when it has no ``src``. What a setuptools build
    adds beyond that (package data outside the packages, generated files) is not reproduced, so
    only projects without such things are installed this way.
    """
    pyproject = tomllib.loads((project / "pyproject.toml").read_text())
    meta = pyproject["project"]
    sources = project / "src" if (project / "src").is_dir() else project
    version = meta.get("version") or _attr_version(pyproject, sources)
    tops = [p for p in sources.iterdir() if (p / "__init__.py").is_file() or p.suffix == ".py"]
    if not tops:
        raise ValueError(f"{project}: no package or module to install in {sources}")
    files = {
        path.relative_to(sources).as_posix(): path.read_text()
        for top in tops
        for path in sorted([top, *top.rglob("*")] if top.is_dir() else [top])
        if path.is_file() and "__pycache__" not in path.parts
    }
    return install_dist(
        site,
        meta["name"],
        version,
        files=files,
        entry_points=meta.get("entry-points"),
        requires=meta.get("dependencies", ()),
        dedent=False,
    )


_VERSION = re.compile(r"^__version__\s*=\s*[\"']([^\"']+)[\"']", re.MULTILINE)


def _attr_version(pyproject: Mapping[str, object], sources: Path) -> str:
    """A ``dynamic`` version read from ``tool.setuptools.dynamic.version.attr``
    (``package.__version__``), as setuptools does for a literal assignment."""
    try:
        attr = pyproject["tool"]["setuptools"]["dynamic"]["version"]["attr"]  # type: ignore
    except (KeyError, TypeError):
        raise ValueError(
            "a project without a version needs tool.setuptools.dynamic.version"
        ) from None
    module, _, name = str(attr).rpartition(".")
    if name != "__version__":
        raise ValueError(f"only package.__version__ attributes are read, not {attr!r}")
    found = _VERSION.search((sources / module.replace(".", "/") / "__init__.py").read_text())
    if found is None:
        raise ValueError(f"{module}/__init__.py assigns no literal __version__")
    return found.group(1)
