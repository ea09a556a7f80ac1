"""``sglang-fl new-vendor NAME``: a complete vendor project, rendered from the core wheel.

The template ships inside the core wheel (``sglang_fl/scaffold_template``, files ending in
``.tmpl`` so that neither setuptools, pytest nor ruff treats them as code), so a chip maker needs
nothing but ``pip install sglang-fl``. ``{{key}}`` placeholders in contents and paths are the
only substitution: no word of prose is ever rewritten by accident. ``vendors/template`` in the
repository is this template rendered with the name ``template`` (a core test keeps them equal),
so the template vendor that CI builds and tests is exactly what a chip maker gets.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

from packaging.version import Version

from ._version import __version__
from .errors import SglangFlError
from .loader import ENTRY_POINT_GROUP
from .reference import PLUGIN_NAME as REFERENCE_PLUGIN

__all__ = [
    "TEMPLATE_DIR",
    "ScaffoldError",
    "VendorNames",
    "add_cli",
    "installed_conflicts",
    "new_vendor",
    "render",
]

TEMPLATE_DIR = Path(__file__).with_name("scaffold_template")
TEMPLATE_SUFFIX = ".tmpl"
DOT_PREFIX = "dot-"  # ``dot-gitignore.tmpl`` -> ``.gitignore`` (package data skips dotfiles)
_NAME = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")
_PLACEHOLDER = re.compile(r"\{\{[a-z_]+\}\}")
MAX_NAME_LENGTH = 40


class ScaffoldError(SglangFlError, ValueError):
    """A vendor name or target directory ``new-vendor`` cannot use; the message says why."""


@dataclass(frozen=True)
class VendorNames:
    """Every name derived from the vendor id, as the template's placeholders use them."""

    name: str

    @classmethod
    def parse(cls, name: str) -> VendorNames:
        """Validate ``name`` (the entry-point name): lowercase identifier words joined by ``_``."""
        if not _NAME.fullmatch(name) or len(name) > MAX_NAME_LENGTH:
            suggestion = re.sub(r"[^a-z0-9]+", "_", name.strip().lower()).strip("_")
            hint = (
                f" (e.g. {suggestion!r})"
                if _NAME.fullmatch(suggestion) and suggestion != name
                else ""
            )
            raise ScaffoldError(
                f"invalid vendor name {name!r}: use lowercase letters and digits, words joined by "
                f"single underscores, starting with a letter, at most {MAX_NAME_LENGTH} "
                f"characters{hint}; it becomes the entry-point name, the package sglang_fl_<name> "
                "and the distribution sglang-fl-<name>"
            )
        if name == REFERENCE_PLUGIN:
            raise ScaffoldError(
                f"invalid vendor name {name!r}: it is the plugin name of sglang-fl's built-in "
                "reference backend"
            )
        return cls(name)

    @property
    def distribution(self) -> str:
        return f"sglang-fl-{self.name.replace('_', '-')}"

    @property
    def package(self) -> str:
        return f"sglang_fl_{self.name}"

    @property
    def backend_class(self) -> str:
        return "".join(word.capitalize() for word in self.name.split("_")) + "Backend"

    @property
    def core_requirement(self) -> str:
        """``sglang-fl>=0.1,<0.2``: the core minor series this template was written for."""
        core = Version(__version__)
        major, minor = core.major, core.minor
        upper = f"{major + 1}" if major else f"{major}.{minor + 1}"
        return f"sglang-fl>={major}.{minor},<{upper}"

    def substitutions(self) -> dict[str, str]:
        return {
            "{{name}}": self.name,
            "{{distribution}}": self.distribution,
            "{{package}}": self.package,
            "{{backend_class}}": self.backend_class,
            "{{core_requirement}}": self.core_requirement,
        }


def installed_conflicts(names: VendorNames) -> list[str]:
    """What already installed would clash with a vendor of this name (empty when none)."""
    conflicts = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == names.name:
            dist = getattr(ep, "dist", None)
            owner = f"{dist.metadata['Name']} {dist.version}" if dist is not None else ep.value
            conflicts.append(f"a {ENTRY_POINT_GROUP} plugin named {names.name!r} ({owner})")
    try:
        dist = metadata.distribution(names.distribution)
    except metadata.PackageNotFoundError:
        pass
    else:
        conflicts.append(f"the distribution {dist.metadata['Name']} {dist.version}")
    if find_spec(names.package) is not None:
        conflicts.append(f"an importable package {names.package!r}")
    return conflicts


def render(names: VendorNames, target: Path) -> list[Path]:
    """Write the template for ``names`` into the existing directory ``target``; return paths.

    Paths are relative to ``target``, sorted. A placeholder left after substitution is a bug of
    the template and raises ``RuntimeError``.
    """
    substitutions = names.substitutions()
    written = []
    for source in sorted(TEMPLATE_DIR.rglob(f"*{TEMPLATE_SUFFIX}")):
        relative = _substitute(source.relative_to(TEMPLATE_DIR).as_posix(), substitutions)
        relative = relative.removesuffix(TEMPLATE_SUFFIX)
        folder, _, filename = relative.rpartition("/")
        if filename.startswith(DOT_PREFIX):
            filename = "." + filename.removeprefix(DOT_PREFIX)
        path = Path(folder, filename) if folder else Path(filename)
        text = _substitute(source.read_text(encoding="utf-8"), substitutions)
        leftover = _PLACEHOLDER.search(text) or _PLACEHOLDER.search(path.as_posix())
        if leftover:
            raise RuntimeError(f"template {source} has unknown placeholder {leftover.group()}")
        (target / path).parent.mkdir(parents=True, exist_ok=True)
        (target / path).write_text(text, encoding="utf-8")
        written.append(path)
    return sorted(written)


def new_vendor(name: str, directory: Path | None = None) -> tuple[Path, list[Path]]:
    """Create the project for vendor ``name`` in ``directory`` (default ``./sglang-fl-<name>``).

    Refuses an invalid name, a name an installed vendor already uses, and a directory that
    exists and is not empty. The project appears whole or not at all: it is rendered next to
    the target and moved into place.
    """
    names = VendorNames.parse(name)
    conflicts = installed_conflicts(names)
    if conflicts:
        raise ScaffoldError(
            f"vendor name {name!r} is already taken in this environment by "
            f"{', '.join(conflicts)}; pick another name (or uninstall it)"
        )
    target = (directory or Path(names.distribution)).absolute()
    if target.exists() and not (target.is_dir() and not any(target.iterdir())):
        raise ScaffoldError(
            f"target directory {target} already exists and is not empty; pass --dir with a new path"
        )
    if not target.parent.is_dir():
        raise ScaffoldError(f"parent directory {target.parent} does not exist")
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    except OSError as exc:
        raise ScaffoldError(f"cannot create {target}: {exc}") from exc
    try:
        files = render(names, staging)
        if target.exists():
            target.rmdir()
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target, files


def add_cli(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Add ``new-vendor`` to the ``sglang-fl`` command line (called by :mod:`sglang_fl.cli`)."""
    help_text = "generate a vendor wheel project for a new chip"
    parser = subparsers.add_parser(
        "new-vendor",
        help=help_text,
        description=(
            f"{help_text}: pyproject with the sglang_fl.backends entry point, Backend subclass, "
            "kernel stubs that raise sglang_fl.Unsupported, tests using the conformance kit, "
            "README. It builds and its tests pass as generated."
        ),
    )
    parser.add_argument(
        "name",
        metavar="NAME",
        help="vendor id, e.g. my_chip: entry-point name; package sglang_fl_NAME; "
        "distribution sglang-fl-NAME",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        metavar="PATH",
        help="project directory to create (default: ./sglang-fl-NAME); must not exist or be empty",
    )
    parser.set_defaults(handler=_run)
    return parser


def _run(args: argparse.Namespace) -> int:
    target, files = new_vendor(args.name, args.dir)
    names = VendorNames(args.name)
    shown = os.path.relpath(target) if not os.path.relpath(target).startswith("..") else target
    print(f"created {names.distribution} in {shown}/ ({len(files)} files):")
    print("\n".join(f"  {path.as_posix()}" for path in files))
    print(
        "\nnext:\n"
        f"  cd {shown}\n"
        '  pip install -e ".[test]"\n'
        "  pytest          # discovery passes; conformance is skipped until the chip is available\n"
        f"then write src/{names.package}/backend.py (availability) and the kernels in "
        f"src/{names.package}/impl/; README.md has the rest."
    )
    return 0


def _substitute(text: str, substitutions: dict[str, str]) -> str:
    for placeholder, value in substitutions.items():
        text = text.replace(placeholder, value)
    return text
