"""Shared fixtures of the SGLang tests: SGLang's own plugin loading, tiny models, dispatch logs.

These tests run in a venv holding SGLang 0.5.23 and the installed sglang-fl wheel (nox session
``sglang``). The in-process layer tests load plugins the way SGLang does
(``sglang.srt.plugins.load_plugins()``); the engine tests start SGLang in subprocesses. Most
tests use tiny random models (fast, and exact comparisons have clear margins); the real-model
tests use SmolLM2-135M-Instruct, prepared once into the model cache (``real_model.py``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from real_model import prepare
from tiny_models import build_tiny_model

HERE = Path(__file__).parent


# Importing SGLang's layers already resolves SGLang's platform, which asks sglang-fl's platform
# entry point and so loads the sglang-fl runtime: the log must be configured before any test
# module imports SGLang, hence at conftest import time.
_IN_PROCESS_LOG = Path(tempfile.mkdtemp(prefix="sglang-fl-tests-")) / "in-process.jsonl"
os.environ["SGLANG_FL_DISPATCH_LOG"] = str(_IN_PROCESS_LOG)


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
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny Llama and Qwen2 checkpoints, built offline once per test session."""
    root = tmp_path_factory.mktemp("models")
    return {arch: build_tiny_model(root / arch, arch) for arch in ("llama", "qwen2")}


@pytest.fixture(scope="session")
def real_model() -> Path:
    """SmolLM2-135M-Instruct as a float32 checkpoint: fetched and converted on first use."""
    return prepare()
