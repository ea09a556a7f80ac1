"""``sglang-fl new-vendor``: names, refusals, the rendered project, the one template source."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest

from sglang_fl import SglangFlError, scaffold
from sglang_fl.scaffold import ScaffoldError, VendorNames, new_vendor, render

REPO = Path(__file__).resolve().parents[2]
TEMPLATE_VENDOR = REPO / "vendors" / "template"
EXPECTED_FILES = [
    ".gitignore",
    "README.md",
    "pyproject.toml",
    "src/sglang_fl_acme_npu/__init__.py",
    "src/sglang_fl_acme_npu/backend.py",
    "src/sglang_fl_acme_npu/communicator.py",
    "src/sglang_fl_acme_npu/impl/__init__.py",
    "src/sglang_fl_acme_npu/impl/activation.py",
    "src/sglang_fl_acme_npu/impl/attention.py",
    "src/sglang_fl_acme_npu/impl/collectives.py",
    "src/sglang_fl_acme_npu/impl/linear_attention.py",
    "src/sglang_fl_acme_npu/impl/moe.py",
    "src/sglang_fl_acme_npu/impl/normalization.py",
    "src/sglang_fl_acme_npu/impl/quantization.py",
    "src/sglang_fl_acme_npu/impl/rotary.py",
    "src/sglang_fl_acme_npu/plugin.py",
    "src/sglang_fl_acme_npu/py.typed",
    "tests/test_acme_npu_conformance.py",
    "tests/test_acme_npu_plugin.py",
]


def test_derived_names() -> None:
    names = VendorNames.parse("acme_npu")
    assert names.distribution == "sglang-fl-acme-npu"
    assert names.package == "sglang_fl_acme_npu"
    assert names.backend_class == "AcmeNpuBackend"
    assert names.core_requirement == "sglang-fl>=0.1,<0.2"


@pytest.mark.parametrize("name", ["acme", "my_chip", "npu2", "a1_b2_c3"])
def test_valid_names(name: str) -> None:
    assert VendorNames.parse(name).name == name


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("My-Chip", "(e.g. 'my_chip')"),
        ("my.chip", "(e.g. 'my_chip')"),
        ("2chip", "starting with a letter"),
        ("my__chip", "single underscores"),
        ("_chip", "(e.g. 'chip')"),
        ("chip_", "(e.g. 'chip')"),
        ("", "invalid vendor name ''"),
        ("x" * 41, "at most 40 characters"),
        ("reference", "built-in reference backend"),
    ],
)
def test_invalid_names_say_why(name: str, hint: str) -> None:
    with pytest.raises(ScaffoldError, match="invalid vendor name") as info:
        VendorNames.parse(name)
    assert hint in str(info.value)
    assert isinstance(info.value, SglangFlError)


def test_render_substitutes_everywhere(tmp_path: Path) -> None:
    files = render(VendorNames.parse("acme_npu"), tmp_path)
    assert [p.as_posix() for p in files] == EXPECTED_FILES
    for path in files:
        text = (tmp_path / path).read_text()
        assert "{{" not in text
        assert "template" not in text.lower(), path
        if path.suffix == ".py":
            ast.parse(text, filename=str(path))
    pyproject = (tmp_path / "pyproject.toml").read_text()
    assert 'name = "sglang-fl-acme-npu"' in pyproject
    assert 'acme_npu = "sglang_fl_acme_npu.plugin"' in pyproject
    assert 'dependencies = ["sglang-fl>=0.1,<0.2"]' in pyproject
    backend = (tmp_path / "src/sglang_fl_acme_npu/backend.py").read_text()
    assert "class AcmeNpuBackend(Backend):" in backend
    assert 'return "acme_npu"' in backend
    conformance = (tmp_path / "tests/test_acme_npu_conformance.py").read_text()
    assert 'conformance_tests(vendor="acme_npu")' in conformance
    readme = (tmp_path / "README.md").read_text()
    assert readme.startswith("# sglang-fl-acme-npu\n")
    assert "pip install sglang-fl-acme-npu" in readme


def test_stubs_raise_unsupported(tmp_path: Path) -> None:
    render(VendorNames.parse("acme_npu"), tmp_path)
    modules = ("activation", "attention", "normalization", "rotary", "moe", "linear_attention")
    for module in modules:
        source = (tmp_path / f"src/sglang_fl_acme_npu/impl/{module}.py").read_text()
        assert "raise Unsupported(" in source


def test_new_vendor_defaults_to_a_directory_named_after_the_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    target, files = new_vendor("acme_npu")
    assert target == tmp_path / "sglang-fl-acme-npu"
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()) == [
        f.as_posix() for f in files
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["sglang-fl-acme-npu"]  # no staging left


def test_new_vendor_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(ScaffoldError, match="already exists and is not empty"):
        new_vendor("acme_npu", target)
    assert [p.name for p in target.iterdir()] == ["keep.txt"]


def test_new_vendor_accepts_an_empty_directory(tmp_path: Path) -> None:
    target = tmp_path / "empty"
    target.mkdir()
    new_vendor("acme_npu", target)
    assert (target / "pyproject.toml").is_file()


def test_new_vendor_refuses_a_missing_parent(tmp_path: Path) -> None:
    with pytest.raises(ScaffoldError, match=r"parent directory .* does not exist"):
        new_vendor("acme_npu", tmp_path / "no" / "project")


def test_new_vendor_reports_an_unwritable_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def denied(**kwargs: object) -> str:
        raise PermissionError(13, "Permission denied", str(kwargs["dir"]))

    monkeypatch.setattr(scaffold.tempfile, "mkdtemp", denied)
    with pytest.raises(ScaffoldError, match=r"cannot create .*/p: .*Permission denied"):
        new_vendor("acme_npu", tmp_path / "p")


def test_new_vendor_refuses_a_name_an_installed_vendor_uses(plugin_site, tmp_path: Path) -> None:
    plugin_site.plugin("acme", "def register_builtins(registry):\n    pass\n", version="2.0")
    with pytest.raises(ScaffoldError) as info:
        new_vendor("acme", tmp_path / "p")
    message = str(info.value)
    assert "vendor name 'acme' is already taken" in message
    assert "a sglang_fl.backends plugin named 'acme' (sglang-fl-acme 2.0)" in message
    assert "the distribution sglang-fl-acme 2.0" in message
    assert not (tmp_path / "p").exists()


def test_new_vendor_leaves_nothing_when_rendering_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(names: VendorNames, target: Path) -> list[Path]:
        (target / "half.txt").write_text("written")
        raise OSError("disk full")

    monkeypatch.setattr(scaffold, "render", broken)
    with pytest.raises(OSError, match="disk full"):
        new_vendor("acme_npu", tmp_path / "p")
    assert list(tmp_path.iterdir()) == []


def test_cli_sub_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="sglang-fl")
    scaffold.add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["new-vendor", "acme_npu", "--dir", str(tmp_path / "proj")])
    assert args.handler(args) == 0
    out = capsys.readouterr().out
    files = len(EXPECTED_FILES)
    assert out.startswith(f"created sglang-fl-acme-npu in {tmp_path / 'proj'}/ ({files} files):")
    assert "  src/sglang_fl_acme_npu/backend.py\n" in out
    assert 'pip install -e ".[test]"' in out
    assert (tmp_path / "proj" / "tests" / "test_acme_npu_plugin.py").is_file()


def test_cli_errors_are_sglang_fl_errors(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="sglang-fl")
    scaffold.add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["new-vendor", "Acme", "--dir", str(tmp_path / "proj")])
    with pytest.raises(SglangFlError, match=r"invalid vendor name 'Acme'.*e\.g\. 'acme'"):
        args.handler(args)


def _ignored(path: Path) -> bool:
    return any(
        part in {"__pycache__", ".pytest_cache", "build", "dist"} or part.endswith(".egg-info")
        for part in path.parts
    )


@pytest.mark.skipif(not TEMPLATE_VENDOR.is_dir(), reason="needs the repository's vendors/")
def test_vendors_template_is_the_rendered_template(tmp_path: Path) -> None:
    """One source: vendors/template is exactly ``new-vendor template`` output."""
    rendered = {p.as_posix() for p in render(VendorNames.parse("template"), tmp_path)}
    checked_in = {
        p.relative_to(TEMPLATE_VENDOR).as_posix()
        for p in TEMPLATE_VENDOR.rglob("*")
        if p.is_file() and not _ignored(p.relative_to(TEMPLATE_VENDOR))
    }
    fix = "edit core/src/sglang_fl/scaffold_template, then run python tests/kit/sync_template.py"
    assert checked_in == rendered, fix
    drifted = [
        path
        for path in sorted(rendered)
        if (TEMPLATE_VENDOR / path).read_bytes() != (tmp_path / path).read_bytes()
    ]
    assert drifted == [], fix


# -- new-vendor --ops: only the chosen ops' stubs ----------------------------------------------


def _registered(project: Path, package: str) -> dict[str, str]:
    """plugin.py's table, op -> the name it registers (read, not imported)."""
    tree = ast.parse((project / "src" / package / "plugin.py").read_text())
    (table,) = [
        node.args[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "attr", "") == "implementations"
        and node.args
    ]
    assert isinstance(table, ast.Dict)
    return {k.value: v.id for k, v in zip(table.keys, table.values, strict=True)}  # type: ignore[union-attr]


def _registered_ops_of_the_test(project: Path, name: str) -> set[str]:
    tree = ast.parse((project / "tests" / f"test_{name}_plugin.py").read_text())
    (value,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "REGISTERED_OPS"
    ]
    return set(ast.literal_eval(value))


def _functions(path: Path) -> set[str]:
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}


def test_the_template_has_a_stub_for_every_standard_op_but_the_listed_ones() -> None:
    from sglang_fl.ops import STANDARD_OPS

    ops = scaffold.template_ops()
    assert len(ops) == len(set(ops))
    assert set(STANDARD_OPS) - set(ops) == {"fused_gate_sigmoid_mul"}
    rendered = _registered(TEMPLATE_VENDOR, "sglang_fl_template")
    assert tuple(rendered) == ops


CHOSEN = ("silu_and_mul", "decode_attention", "all_reduce", "chunk_gated_delta_rule")


def test_ops_keeps_only_those_stubs_their_imports_and_the_tests_list(tmp_path: Path) -> None:
    target, files = new_vendor("acme_npu", tmp_path / "p", ops=CHOSEN)
    package = target / "src" / "sglang_fl_acme_npu"
    table = _registered(target, "sglang_fl_acme_npu")
    assert list(table) == [op for op in scaffold.template_ops() if op in CHOSEN]
    assert _registered_ops_of_the_test(target, "acme_npu") == set(CHOSEN)
    # Families without a chosen op are gone; the chosen stubs are all that is left of the rest.
    impl = sorted(p.name for p in (package / "impl").iterdir())
    assert impl == [
        "__init__.py",
        "activation.py",
        "attention.py",
        "collectives.py",
        "linear_attention.py",
    ]
    assert _functions(package / "impl" / "activation.py") == {"silu_and_mul"}
    assert _functions(package / "impl" / "attention.py") == {"decode_attention"}
    assert _functions(package / "impl" / "collectives.py") == {"all_reduce"}
    assert _functions(package / "impl" / "linear_attention.py") == {"chunk_gated_delta_rule"}
    assert sorted(p.as_posix() for p in files) == sorted(
        p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()
    )
    plugin = (package / "plugin.py").read_text()
    assert "normalization" not in plugin
    assert "from .impl.activation import silu_and_mul\n" in plugin


def test_every_template_op_alone_gives_a_project_that_compiles(tmp_path: Path) -> None:
    """Each op alone (aliased imports, multi-line signatures, a family's last stub): every file
    left parses, names only what it imports, and registers exactly that op."""
    names = VendorNames.parse("acme_npu")
    for op in scaffold.template_ops():
        root = tmp_path / op
        root.mkdir()
        render(names, root)
        scaffold.keep_only(root, names, [op])
        assert list(_registered(root, names.package)) == [op]
        assert _registered_ops_of_the_test(root, names.name) == {op}
        for path in root.rglob("*.py"):
            tree = ast.parse(path.read_text(), filename=str(path))
            imported = {
                alias.asname or alias.name.split(".")[0]
                for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names
            }
            used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
            unused = imported - used - {"annotations"}
            assert not unused, f"--ops {op}: {path.relative_to(root)} imports {unused} unused"


def test_ops_output_passes_ruff(tmp_path: Path) -> None:
    """Formatted as ruff formats it, and no unused import or undefined name (pyflakes).
    ruff is installed with the tests (nox session ``tests``): a missing one fails here."""
    import subprocess
    import sys

    target, _ = new_vendor("acme_npu", tmp_path / "p", ops=CHOSEN)
    for args in (
        ["format", "--check", "--line-length", "100"],
        ["check", "--select", "E,F,W", "--line-length", "100"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "ruff", *args, str(target)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_ops_output_registers_those_kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The pruned plugin imports and its hook registers exactly the chosen ops."""
    import importlib
    import sys

    from sglang_fl.types import OpRegistry

    target, _ = new_vendor("prune_chip", tmp_path / "p", ops=CHOSEN)
    monkeypatch.syspath_prepend(str(target / "src"))
    try:
        module = importlib.import_module("sglang_fl_prune_chip.plugin")
        registry = OpRegistry()
        module.sglang_fl_register_ops(registry)
        registered = {op for op in registry.ops() if registry.implementations(op)}
        assert registered == set(CHOSEN)
    finally:
        for name in [m for m in sys.modules if m.startswith("sglang_fl_prune_chip")]:
            del sys.modules[name]


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        ("rms_nrom", "unknown op 'rms_nrom' (did you mean 'rms_norm'?)"),
        ("fused_gate_sigmoid_mul", "the template has no stub for 'fused_gate_sigmoid_mul'"),
        (" , ", "--ops names no op"),
    ],
)
def test_ops_the_template_cannot_give_are_refused(tmp_path: Path, ops: str, message: str) -> None:
    parser = argparse.ArgumentParser(prog="sglang-fl")
    scaffold.add_cli(parser.add_subparsers(dest="command"))
    with pytest.raises(ScaffoldError, match=re.escape(message)):
        new_vendor("acme_npu", tmp_path / "p", ops=scaffold.parse_ops(ops))
    assert not (tmp_path / "p").exists()


def test_cli_ops(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="sglang-fl")
    scaffold.add_cli(parser.add_subparsers(dest="command"))
    argv = [
        "new-vendor",
        "acme_npu",
        "--ops",
        "rms_norm,silu_and_mul",
        "--dir",
        str(tmp_path / "p"),
    ]
    args = parser.parse_args(argv)
    assert args.ops == ("rms_norm", "silu_and_mul")
    assert args.handler(args) == 0
    out = capsys.readouterr().out
    assert "  src/sglang_fl_acme_npu/impl/normalization.py\n" in out
    assert "impl/rotary.py" not in out
    assert _registered_ops_of_the_test(tmp_path / "p", "acme_npu") == {"rms_norm", "silu_and_mul"}


def test_the_template_imports_only_the_public_api(tmp_path: Path) -> None:
    """A plugin imports ``sglang_fl`` and ``sglang_fl.types`` (and the kit and the op contracts
    in its tests and helpers); the seed paths ``sglang_fl.dispatch.*`` keep working but the
    template neither imports nor names them."""
    render(VendorNames.parse("acme_npu"), tmp_path)
    allowed = {"sglang_fl", "sglang_fl.types", "sglang_fl.testing"}
    for path in tmp_path.rglob("*"):
        if not path.is_file():
            continue
        text = path.read_text()
        assert "sglang_fl.dispatch" not in text, path
        if path.suffix == ".py":
            modules = {
                node.module
                for node in ast.walk(ast.parse(text))
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
            }
            ours = {m for m in modules if m.split(".")[0] == "sglang_fl"}
            assert ours <= allowed, f"{path}: imports {ours - allowed}"


DOCS = REPO / "docs"


@pytest.mark.skipif(not DOCS.is_dir(), reason="needs the repository's docs/")
def test_the_pages_listing_the_templates_stubs_follow_the_template() -> None:
    """Operators' template column says ``stub`` exactly for the ops the template has a stub
    for; the Vendors table states their number and the op left out."""
    from sglang_fl.ops import STANDARD_OPS

    ops = set(scaffold.template_ops())
    column = {}
    for line in (DOCS / "reference" / "operators.md").read_text().splitlines():
        match = re.match(r"^\| `(\w+)` \|.*\| (\w+) \|$", line)
        if match and match[1] in STANDARD_OPS:
            column[match[1]] = match[2]
    assert set(column) == set(STANDARD_OPS)
    assert {op for op, cell in column.items() if cell == "stub"} == ops
    (row,) = [
        line for line in (DOCS / "running.md").read_text().splitlines() if "| Template |" in line
    ]
    missing = sorted(set(STANDARD_OPS) - ops)
    assert f"every standard op but {', '.join(f'`{op}`' for op in missing)} ({len(ops)}:" in row
