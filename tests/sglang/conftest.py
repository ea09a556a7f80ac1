"""Shared fixtures of the SGLang tests: SGLang's own plugin loading, tiny models, dispatch logs.

These tests run in a venv holding SGLang 0.5.23 and the installed sglang-fl wheel (nox session
``sglang``). The in-process layer tests load plugins the way SGLang does
(``sglang.srt.plugins.load_plugins()``); the engine tests start SGLang in subprocesses. Most
tests use tiny random models (fast, and exact comparisons have clear margins); the real-model
tests use SmolLM2-135M-Instruct, prepared once into the model cache (``real_model.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "support"))  # installed_dists: throwaway plugins

from engines import (  # noqa: E402
    Engine,
    EnginePool,
    by_engine,
    companions_of,
    model_path,
    scheduling_groups,
    spec_of,
)
from real_model import prepare  # noqa: E402
from sglang_processes import ENGINE_STARTS, EngineStart, cache_lock  # noqa: E402
from tiny_models import hf_greedy  # noqa: E402

# Importing SGLang's layers already resolves SGLang's platform, which asks sglang-fl's platform
# entry point and so loads the sglang-fl runtime: the log must be configured before any test
# module imports SGLang, hence at conftest import time.
_IN_PROCESS_LOG = Path(tempfile.mkdtemp(prefix="sglang-fl-tests-")) / "in-process.jsonl"
os.environ["SGLANG_FL_DISPATCH_LOG"] = str(_IN_PROCESS_LOG)
# Where xdist workers tell the controller each test's engine configuration (a JSON file).
_GROUPS_ENV = "SGLANG_FL_TEST_ENGINE_GROUPS"


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        # The xdist controller, before its workers start: where they write each test's engine
        # configuration for its scheduler (pytest_xdist_make_scheduler).
        os.environ[_GROUPS_ENV] = str(_IN_PROCESS_LOG.parent / "engine-groups.json")
    config.addinivalue_line(
        "markers",
        "engine(spec, also=()): the test runs against the shared SGLang engine of this "
        "EngineSpec (tests/sglang/engines.py); tests of one spec run together, on one "
        "pytest-xdist worker with those of the specs in also (engines the test consults)",
    )
    config.addinivalue_line(
        "markers",
        "xdist_group(name): tests without an engine that share a module-scoped process (a "
        "server) run on one pytest-xdist worker (this conftest's scheduler honours it)",
    )
    config.addinivalue_line(
        "markers",
        "matrix: the matrix tier (nox -s sglang_matrix): TP/PP ranks and the engines of models "
        "other than the default tiny Llama; given automatically to tests of such an EngineSpec",
    )


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the markers added here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each engine configuration's tests together, so that each engine starts once; tests of a
    matrix-tier configuration marked ``matrix``. In a pytest-xdist worker, also write which
    configuration each test needs, for the controller's scheduler
    (``pytest_xdist_make_scheduler``)."""
    for item in items:
        spec = spec_of(item)
        if spec is not None and spec.matrix:
            item.add_marker(pytest.mark.matrix)
    groups = scheduling_groups(items)
    items[:] = list(by_engine(items))
    groups_file = os.environ.get(_GROUPS_ENV)
    if groups_file and os.environ.get("PYTEST_XDIST_WORKER"):
        scratch = f"{groups_file}.{os.environ['PYTEST_XDIST_WORKER']}"
        Path(scratch).write_text(json.dumps(groups))
        os.replace(scratch, groups_file)  # every worker collects the same tests: same content


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # an xdist hook; before xdist's own
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (``-n 2``, as the nox sessions run): every test of one engine
    configuration goes to one worker, which starts that engine once, while the other worker
    runs another configuration or the in-process tests. (xdist's own ``loadgroup`` cannot do
    this on pytest 9: the group suffix it writes into ``item._nodeid`` is no longer read.)

    xdist's scope scheduling, with one scope per engine configuration and per ``xdist_group``
    (what the workers wrote to the groups file while collecting, ``engines.scheduling_groups``)
    and every other test a scope of its own.
    """
    from xdist.scheduler import LoadScopeScheduling

    groups_file = Path(os.environ[_GROUPS_ENV])  # set by pytest_configure

    class EngineGroups(LoadScopeScheduling):  # type: ignore[misc]
        @functools.cached_property
        def _groups(self) -> dict[str, str]:
            # First asked once every worker has collected (and written the file): read once.
            groups: dict[str, str] = json.loads(groups_file.read_text())
            return groups

        def _split_scope(self, nodeid: str) -> str:
            return self._groups.get(nodeid, nodeid)

    return EngineGroups(config, log)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In an xdist worker: hand this worker's engine starts to the controller's summary."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["engine_starts"] = [dataclasses.asdict(s) for s in ENGINE_STARTS]


@pytest.hookimpl(optionalhook=True)  # an xdist hook: only called where xdist runs
def pytest_testnodedown(node: Any, error: Any) -> None:
    """In the xdist controller: gather the engine starts of a worker that finished."""
    for start in getattr(node, "workeroutput", {}).get("engine_starts", []):
        ENGINE_STARTS.append(EngineStart(**start))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """How many SGLang engines this session started, and which: the suite's main cost."""
    if not ENGINE_STARTS:
        return
    write = terminalreporter.write_line
    terminalreporter.section("SGLang engine starts")
    pooled = [s for s in ENGINE_STARTS if not s.what.startswith("launch_server")]
    ready = [s.seconds for s in ENGINE_STARTS if s.seconds is not None]
    write(
        f"{len(ENGINE_STARTS)} engine starts ({len(pooled)} shared configurations), "
        f"{sum(ready):.0f} s to ready in all"
    )
    for start in ENGINE_STARTS:
        took = "did not start" if start.seconds is None else f"{start.seconds:.0f} s to ready"
        write(f"  {start.what}: {took}")


def pytest_unconfigure(config: pytest.Config) -> None:
    """The in-process log lives outside tmp_path (it is set before pytest's own); remove it."""
    shutil.rmtree(_IN_PROCESS_LOG.parent)


@pytest.fixture(scope="session")
def dispatch_log() -> Path:
    """This pytest process's dispatch log (engine subprocesses get their own)."""
    return _IN_PROCESS_LOG


@pytest.fixture(scope="session")
def router(dispatch_log: Path) -> Any:
    """sglang-fl's router, registered by SGLang's own plugin loader in this process."""
    for name in ("SGLANG_FORCE_FUSED_OP_BACKEND", "SGLANG_PLUGINS", "SGLANG_PLATFORM"):
        if os.environ.get(name):
            pytest.fail(f"{name} is set in the test environment; unset it for these tests")
    from sglang.srt.plugins import load_plugins

    from sglang_fl.integrations.sglang.plugin import get_router

    load_plugins()
    found = get_router()
    assert found is not None, "SGLang did not run the sglang_fl plugin entry point"
    return found


@pytest.fixture(scope="session")
def models() -> dict[str, Path]:
    """Tiny Llama and Qwen2 checkpoints, built offline (once, into the tests' cache)."""
    return {arch: model_path(arch) for arch in ("llama", "qwen2")}


@pytest.fixture(scope="session")
def real_model() -> Path:
    """SmolLM2-135M-Instruct as a float32 checkpoint: fetched and converted on first use."""
    with cache_lock("model-smollm2"):
        return prepare()


@pytest.fixture(scope="session")
def engine_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnginePool]:
    """The session's shared engines (``engines.py``): one alive at a time, stopped at the end."""
    pool = EnginePool(tmp_path_factory.mktemp("engines"))
    yield pool
    pool.stop()


@pytest.fixture(autouse=True)
def _engine_only_while_its_tests_run(
    request: pytest.FixtureRequest, engine_pool: EnginePool
) -> None:
    """Stop the running engine before a test that neither runs against it nor consults it:
    its tests are over (each configuration's tests run together), and an engine kept up holds
    memory and, on TP ranks, CPU while the worker runs other tests."""
    running = engine_pool.current
    if running is not None and running.spec not in (
        spec_of(request.node),
        *companions_of(request.node),
    ):
        engine_pool.stop()


@pytest.fixture
def engine(request: pytest.FixtureRequest, engine_pool: EnginePool) -> Engine:
    """The running engine of the test's spec (``@pytest.mark.engine(spec)`` or an indirect
    ``engine`` parameter)."""
    spec = spec_of(request.node)
    if spec is None:
        raise pytest.UsageError(
            f"{request.node.nodeid} uses the engine fixture without an EngineSpec: mark it "
            "@pytest.mark.engine(spec) or parametrize engine indirectly"
        )
    return engine_pool.get(spec)


_ORACLE: dict[tuple[str, tuple[str, ...], int, bool], list[list[int]]] = {}


@pytest.fixture(scope="session")
def oracle() -> Callable[..., list[list[int]]]:
    """``oracle(model, prompts, max_new_tokens, stop_at_eos=False)``: transformers' greedy token
    ids for a named model (``engines.model_path``), computed once per session."""

    def greedy(
        model: str, prompts: list[str], max_new_tokens: int, stop_at_eos: bool = False
    ) -> list[list[int]]:
        key = (model, tuple(prompts), max_new_tokens, stop_at_eos)
        if key not in _ORACLE:
            _ORACLE[key] = hf_greedy(
                model_path(model), prompts, max_new_tokens, stop_at_eos=stop_at_eos
            )
        return _ORACLE[key]

    return greedy
