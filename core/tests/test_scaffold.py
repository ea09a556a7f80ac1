"""``sglang-fl new-vendor``: names, refusals, the rendered project, the one template source."""

from __future__ import annotations

import argparse
import ast
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
