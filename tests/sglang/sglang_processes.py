"""SGLang in processes of its own, for the end-to-end tests: environments, servers, their logs.

Every SGLang run gets a clean environment (no inherited ``SGLANG_FL_*`` or SGLang switches) and
a hard timeout; servers run in their own process group so that stopping one stops its
scheduler and detokenizer too.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from installed_dists import install_project

HERE = Path(__file__).parent
# Start-up of an engine or server on 2 busy cores, the model loaded included.
ENGINE_TIMEOUT_S = 600
# Where built test models live between runs: outside the clone, so a fresh clone on the same
# machine reuses them (each builder stamps what it built and rebuilds on a mismatch).
TEST_CACHE_ENV = "SGLANG_FL_TEST_CACHE"


@dataclass
class EngineStart:
    """One SGLang engine or server this pytest process started, for the session's summary."""

    what: str
    began: float = field(default_factory=time.monotonic)
    seconds: float | None = None  # to ready; None if it never became ready

    def ready(self) -> None:
        self.seconds = time.monotonic() - self.began


# Every start, in order: engine starts are the end-to-end suite's main cost.
ENGINE_STARTS: list[EngineStart] = []


def count_engine_start(what: str) -> EngineStart:
    """Record one engine start (an ``sglang.Engine``, a server); call ``.ready()`` on it once the
    engine serves, so the summary gives its start-up time."""
    start = EngineStart(what)
    ENGINE_STARTS.append(start)
    return start


def persistent_cache(*parts: str) -> Path:
    """A directory under the tests' persistent cache: ``$SGLANG_FL_TEST_CACHE``, else
    ``$XDG_CACHE_HOME/sglang-fl/tests`` (``~/.cache/sglang-fl/tests``)."""
    configured = os.environ.get(TEST_CACHE_ENV, "").strip()
    if configured:
        root = Path(configured).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
        root = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "sglang-fl" / "tests"
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Hold the test cache's lock ``name`` (an exclusive ``flock``): pytest-xdist workers (and
    concurrent runs) building the same cached model take turns, the second finds it built."""
    with open(persistent_cache("locks") / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


STANDARD_LAYERS = {
    "silu_and_mul": "sglang.srt.layers.activation.SiluAndMul",
    "rms_norm": "sglang.srt.layers.layernorm.RMSNorm",
    "rotary_embedding": "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding",
}


def clean_env(**overrides: str) -> dict[str, str]:
    """This process's environment without SGLang/sglang-fl switches, plus ``overrides``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SGLANG_FL_", "SGLANG_FORCE", "SGLANG_PLUGINS", "SGLANG_PLATFORM"))
    }
    env.update(overrides)
    return env


def scheduler_layers(rows: list[dict[str, Any]], main_pid: int) -> dict[str, dict[str, Any]]:
    """Layer class -> its ``layer`` record, from the scheduler process(es) only."""
    schedulers = {
        r["pid"]
        for r in rows
        if r["pid"] != main_pid and str(r.get("proctitle") or "").startswith("sglang::scheduler")
    }
    assert schedulers, f"no record from an SGLang scheduler process in {rows}"
    return {r["layer"]: r for r in rows if r["event"] == "layer" and r["pid"] in schedulers}


def install_source(source: Path, root: Path) -> Path:
    """Install the project in ``source`` (a ``pyproject.toml`` beside its packages) as an
    installed distribution in a directory of its own under ``root``, returned: put it on
    ``PYTHONPATH`` beside SGLang (``tests/support/installed_dists.py``)."""
    return install_project(source, root / "site")


def post_json(url: str, body: dict[str, Any], timeout_s: float = 300) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen[bytes], deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"the server did not become healthy within {deadline_s:.0f}s")


class Server:
    """A running ``sglang.launch_server``: its base URL, process and combined output file."""

    def __init__(self, base_url: str, proc: subprocess.Popen[bytes], output: Path) -> None:
        self.base_url = base_url
        self.proc = proc
        self.output = output

    def tail(self, chars: int = 6000) -> str:
        return self.output.read_text(errors="replace")[-chars:]


@contextmanager
def launch_server(
    model: Path, workdir: Path, env: dict[str, str], dtype: str = "float32"
) -> Iterator[Server]:
    """SGLang's own server on the CPU (``python -m sglang.launch_server``), healthy, then stopped.

    ``env`` is the server's whole environment (see :func:`clean_env`); its output goes to
    ``workdir/server.log``.
    """
    port = free_port()
    output = workdir / "server.log"
    command = [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", str(model),
        "--device", "cpu",
        "--dtype", dtype,
        "--max-total-tokens", "4096",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--log-level", "warning",
        "--sleep-on-idle",  # an idle scheduler polls in a busy loop otherwise (engine_run)
    ]  # fmt: skip
    start = count_engine_start(f"launch_server {model.name}")
    with output.open("wb") as out:
        proc = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        server = Server(f"http://127.0.0.1:{port}", proc, output)
        try:
            try:
                wait_healthy(f"{server.base_url}/health", proc, deadline_s=ENGINE_TIMEOUT_S)
                start.ready()
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{server.tail()}") from None
            yield server
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
