"""``sglang-fl new-vendor NAME``: a complete vendor project, rendered from the core wheel.

The template ships inside the core wheel (``sglang_fl/scaffold_template``, files ending in
``.tmpl`` so that neither setuptools, pytest nor ruff treats them as code), so a chip maker needs
nothing but ``pip install sglang-fl``. ``{{key}}`` placeholders in contents and paths are the
only substitution: no word of prose is ever rewritten by accident. ``vendors/template`` in the
repository is this template rendered with the name ``template`` (a core test keeps them equal),
so the template vendor that CI builds and tests is exactly what a chip maker gets.

``--ops a,b,c`` keeps only those ops' stubs. The template itself says which stub serves which
op (``plugin.py``'s registration table and its ``from .impl.<family> import`` lines), so a stub
added to the template is one function, one table entry and its import, and ``--ops`` follows:
the pruned project drops the other table entries, the imports left unused, the other stub
functions (and a family module with none left) and the other names of the discovery test's
``REGISTERED_OPS``.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

from packaging.version import Version

from ._version import __version__
from .errors import SglangFlError
from .loader import ENTRY_POINT_GROUP
from .ops import STANDARD_OPS, unknown_op_message
from .reference import PLUGIN_NAME as REFERENCE_PLUGIN

__all__ = [
    "TEMPLATE_DIR",
    "ScaffoldError",
    "VendorNames",
    "add_cli",
    "installed_conflicts",
    "keep_only",
    "new_vendor",
    "parse_ops",
    "render",
    "template_ops",
]

TEMPLATE_DIR = Path(__file__).with_name("scaffold_template")
TEMPLATE_SUFFIX = ".tmpl"
DOT_PREFIX = "dot-"  # ``dot-gitignore.tmpl`` -> ``.gitignore`` (package data skips dotfiles)
_NAME = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")
_PLACEHOLDER = re.compile(r"\{\{[a-z_]+\}\}")
MAX_NAME_LENGTH = 40
LINE_LENGTH = 100  # the template's line length (the repository's ruff configuration)


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


def new_vendor(
    name: str, directory: Path | None = None, ops: Sequence[str] | None = None
) -> tuple[Path, list[Path]]:
    """Create the project for vendor ``name`` in ``directory`` (default ``./sglang-fl-<name>``),
    with a stub for every op the template has, or only for ``ops``.

    Refuses an invalid name, a name an installed vendor already uses, an op the template has no
    stub for, and a directory that exists and is not empty. The project appears whole or not at
    all: it is rendered next to the target and moved into place.
    """
    names = VendorNames.parse(name)
    if ops is not None:
        _check_ops(ops)
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
        if ops is not None:
            keep_only(staging, names, ops)
            files = [path for path in files if (staging / path).exists()]
        if target.exists():
            target.rmdir()
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target, files


@dataclass(frozen=True)
class _Stub:
    """One entry of ``plugin.py``'s registration table: the op, the name it registers and the
    impl module (family) and function that name was imported from."""

    op: str
    entry: ast.expr  # the key of the entry (its value follows on the same lines)
    value: ast.expr
    module: str  # ``activation`` for ``from .impl.activation import ...``
    function: str


def _registration_table(tree: ast.Module) -> ast.Dict:
    """The ``{op: adapter}`` dict ``sglang_fl_register_ops`` hands to ``implementations``."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "implementations"
            and node.args
            and isinstance(node.args[0], ast.Dict)
        ):
            return node.args[0]
    raise RuntimeError("the template's plugin.py has no backend.implementations({...}) table")


def _stubs(plugin_source: str) -> dict[str, _Stub]:
    """Op -> its stub, read from a rendered ``plugin.py``."""
    tree = ast.parse(plugin_source)
    origin: dict[str, tuple[str, str]] = {}  # local name -> (impl module, function)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            family = node.module.removeprefix("impl.")
            if family != node.module:
                for alias in node.names:
                    origin[alias.asname or alias.name] = (family, alias.name)
    stubs: dict[str, _Stub] = {}
    table = _registration_table(tree)
    for key, value in zip(table.keys, table.values, strict=True):
        op = key.value if isinstance(key, ast.Constant) else None
        if not (key is not None and isinstance(op, str) and isinstance(value, ast.Name)):
            raise RuntimeError(f'plugin.py line {value.lineno}: not an `"op": adapter` entry')
        module, function = origin[value.id]
        stubs[op] = _Stub(op, key, value, module, function)
    return stubs


def template_ops() -> tuple[str, ...]:
    """The ops the template has a stub for, in the order its ``plugin.py`` registers them."""
    source = TEMPLATE_DIR / "src" / "{{package}}" / f"plugin.py{TEMPLATE_SUFFIX}"
    text = _substitute(source.read_text(encoding="utf-8"), VendorNames("x").substitutions())
    return tuple(_stubs(text))


def parse_ops(text: str) -> tuple[str, ...]:
    """``a,b,c`` -> the ops, each a standard op the template has a stub for (else a
    :class:`ScaffoldError` naming the close match or the ops it has), duplicates dropped."""
    ops = tuple(dict.fromkeys(op.strip() for op in text.split(",") if op.strip()))
    _check_ops(ops)
    return ops


def _check_ops(ops: Sequence[str]) -> None:
    if not ops:
        raise ScaffoldError("--ops names no op; give op names separated by commas")
    available = template_ops()
    for op in ops:
        if op not in STANDARD_OPS:
            raise ScaffoldError(f"--ops: {unknown_op_message(op)}")
        if op not in available:
            raise ScaffoldError(
                f"--ops: the template has no stub for {op!r}; it has stubs for "
                f"{', '.join(available)}"
            )


def _delete_lines(text: str, spans: Sequence[tuple[int, int]]) -> str:
    """``text`` without the 1-based, inclusive line ``spans``; runs of more than two blank
    lines left behind collapse to two, and the file ends with one newline."""
    lines = text.splitlines(keepends=True)
    for start, end in sorted(spans, reverse=True):
        del lines[start - 1 : end]
    joined = re.sub(r"\n{4,}", "\n\n\n", "".join(lines))
    return joined.rstrip("\n") + "\n"


def _import_text(node: ast.ImportFrom, names: list[ast.alias]) -> str:
    """``from X import a, b as c`` on one line when it fits, else one name per line."""
    module = "." * node.level + (node.module or "")
    parts = [a.name if a.asname is None else f"{a.name} as {a.asname}" for a in names]
    one_line = f"from {module} import {', '.join(parts)}"
    if len(one_line) <= LINE_LENGTH:
        return one_line + "\n"
    return f"from {module} import (\n" + "".join(f"    {part},\n" for part in parts) + ")\n"


def _without_unused_imports(text: str) -> str:
    """``text`` whose ``from ... import`` statements keep only the names the module uses
    (``from __future__`` stays); a statement left with none goes."""
    tree = ast.parse(text)
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
            continue
        kept = [a for a in node.names if (a.asname or a.name) in used]
        if len(kept) != len(node.names):
            end = node.end_lineno or node.lineno
            edits.append((node.lineno, end, _import_text(node, kept) if kept else ""))
    for start, end, replacement in sorted(edits, reverse=True):
        lines[start - 1 : end] = [replacement]
    return _delete_lines("".join(lines), ())


def keep_only(target: Path, names: VendorNames, ops: Sequence[str]) -> None:
    """Prune the project rendered in ``target`` to the stubs of ``ops`` (see the module doc)."""
    package = target / "src" / names.package
    plugin = package / "plugin.py"
    stubs = _stubs(plugin.read_text(encoding="utf-8"))
    dropped = [stub for op, stub in stubs.items() if op not in ops]
    entries = [(s.entry.lineno, s.value.end_lineno or s.value.lineno) for s in dropped]
    pruned = _delete_lines(plugin.read_text(encoding="utf-8"), entries)
    plugin.write_text(_without_unused_imports(pruned), encoding="utf-8")
    kept_functions = {(s.module, s.function) for op, s in stubs.items() if op in ops}
    for family in sorted({s.module for s in stubs.values()}):
        path = package / "impl" / f"{family}.py"
        text = path.read_text(encoding="utf-8")
        spans = [
            (node.decorator_list[0].lineno if node.decorator_list else node.lineno, node.end_lineno)
            for node in ast.parse(text).body
            if isinstance(node, ast.FunctionDef)
            and node.end_lineno is not None
            and (family, node.name) not in kept_functions
            and any(s.module == family and s.function == node.name for s in dropped)
        ]
        if not any(module == family for module, _ in kept_functions):
            path.unlink()
            continue
        path.write_text(_without_unused_imports(_delete_lines(text, spans)), encoding="utf-8")
    test = target / "tests" / f"test_{names.name}_plugin.py"
    text = test.read_text(encoding="utf-8")
    for node in ast.parse(text).body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Set)
            and any(isinstance(t, ast.Name) and t.id == "REGISTERED_OPS" for t in node.targets)
        ):
            spans = [
                (element.lineno, element.end_lineno or element.lineno)
                for element in node.value.elts
                if isinstance(element, ast.Constant) and element.value not in ops
            ]
            text = _delete_lines(text, spans)
    test.write_text(text, encoding="utf-8")


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
        "--ops",
        type=parse_ops,
        default=None,
        metavar="OP[,OP...]",
        help="only these ops' stubs (registration entries, imports, stub functions and the "
        "discovery test's list follow); default: every op the template has "
        f"({len(template_ops())})",
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
    target, files = new_vendor(args.name, args.dir, args.ops)
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
