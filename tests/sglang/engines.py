"""Shared SGLang engines for the end-to-end tests: one engine per configuration, one at a time.

An engine start (spawned scheduler and detokenizer, model load) costs 15-60 s on the 2-core CI
machine, so engine tests do not start their own engines. A test names the configuration it
needs as an :class:`EngineSpec` (model, dtype, server arguments, environment, throwaway vendor
distributions on the path) and receives a running :class:`Engine` for it:

.. code-block:: python

    LLAMA = EngineSpec.of("llama")

    @pytest.mark.engine(LLAMA)
    def test_tokens(engine: Engine, oracle) -> None:
        outputs = engine.generate(["def main():"], max_new_tokens=8)
        assert [o["output_ids"] for o in outputs] == oracle("llama", ["def main():"], 8)
        assert any(r["event"] == "layer" for r in engine.records())

or, for one test per configuration, ``@pytest.mark.parametrize("engine", [A, B],
indirect=True, ids=...)``. The session's :class:`EnginePool` starts an engine the first time
its spec is asked for and keeps it for every later test with an equal spec; asking for
another spec stops the running engine first, so at most one engine is alive. ``conftest.py``
orders the tests so that each spec's tests run one after another (tests without an engine
first), so each configuration starts once per run; the terminal summary lists every engine
start. A test that compares with another spec's answers names it,
``@pytest.mark.engine(SPEC, also=(OTHER,))``: ``OTHER``'s tests come first (and, under
pytest-xdist, on the same worker), so the answers they leave are reused and neither engine
starts twice. A spec whose engine failed to start fails its later tests at once, with the same
error.

Observers ride on a shared engine: its dispatch log (``SGLANG_FL_DISPATCH_LOG``, one per
engine) holds the records of every test that used it, so a test reads what it needs
(:meth:`Engine.records`, optionally ``since`` a :meth:`Engine.log_mark` taken before its own
requests) and never assumes it ran first. Environment values may contain ``{workdir}``, the
engine's own directory, for files a vendor writes (calls it recorded).

Models are named: every ``tiny_models.ARCHITECTURES`` entry, ``"smollm2"`` (the real model,
``real_model.prepare``), and whatever a test module adds with :func:`register_model`. Vendor
distributions are named too (:func:`register_site`): a function writing the distribution into a
site directory, run once per session.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_processes import (
    ENGINE_TIMEOUT_S,
    HERE,
    cache_lock,
    clean_env,
    count_engine_start,
    persistent_cache,
)

__all__ = [
    "Engine",
    "EnginePool",
    "EngineSpec",
    "EngineStartError",
    "model_path",
    "register_model",
    "register_site",
]

# The fast tier's engines run this model; every other model, and any TP/PP run, is the matrix
# tier (noxfile.py, SGLANG_TIERS).
FAST_TIER_MODELS = frozenset({"llama"})

# A request (generate, tokenize) on a tiny model takes seconds; a long one on the real model
# under load a few minutes. A request that takes longer is a hang: the engine is killed.
REQUEST_TIMEOUT_S = 600
STOP_TIMEOUT_S = 120


@dataclass(frozen=True)
class EngineSpec:
    """One engine configuration: everything that makes two engines behave differently.

    Build it with :meth:`of`; equal specs share one engine. ``env`` and ``server_args`` are
    sorted tuples so that the spec hashes; ``sites`` names registered vendor distributions put
    on ``PYTHONPATH`` (in that order).
    """

    model: str
    dtype: str = "float32"
    server_args: tuple[tuple[str, Any], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    sites: tuple[str, ...] = ()
    label: str = ""

    @classmethod
    def of(
        cls,
        model: str,
        *,
        dtype: str = "float32",
        env: Mapping[str, str] | None = None,
        sites: tuple[str, ...] = (),
        label: str = "",
        **server_args: Any,
    ) -> EngineSpec:
        """``EngineSpec.of("llama", env={"SGLANG_FL_TRACE": "..."}, chunked_prefill_size=16)``."""
        return cls(
            model=model,
            dtype=dtype,
            server_args=tuple(sorted(server_args.items())),
            env=tuple(sorted((env or {}).items())),
            sites=sites,
            label=label,
        )

    @property
    def matrix(self) -> bool:
        """Whether this engine belongs to the matrix tier (other models, several ranks)."""
        args = dict(self.server_args)
        ranks = int(args.get("tp_size", 1)) * int(args.get("pp_size", 1))
        return self.model not in FAST_TIER_MODELS or ranks > 1

    @property
    def id(self) -> str:
        """A short readable name for test ids and the engine-start list."""
        if self.label:
            return self.label
        parts = [self.model]
        if self.dtype != "float32":
            parts.append(self.dtype)
        parts += [f"{k}={v}" for k, v in self.server_args]
        parts += list(self.sites)
        parts += [f"{k}={v}" for k, v in self.env]
        return ",".join(parts)


class EngineStartError(AssertionError):
    """The engine of a spec did not come up; later tests of that spec fail with it too."""


_MODELS: dict[str, Callable[[Path], Path]] = {}
_SITES: dict[str, Callable[[Path], Path]] = {}


def register_model(name: str, build: Callable[[Path], Path]) -> None:
    """Make ``name`` a model an :class:`EngineSpec` may name: ``build(cache_dir)`` returns the
    checkpoint directory (it may reuse what an earlier run left in ``cache_dir``)."""
    if _MODELS.get(name, build) is not build:
        raise ValueError(f"model {name!r} is already registered")
    _MODELS[name] = build


def register_site(name: str, build: Callable[[Path], Path]) -> None:
    """Make ``name`` a vendor distribution an :class:`EngineSpec` may put on the path:
    ``build(root)`` installs it under ``root`` and returns the site directory."""
    if _SITES.get(name, build) is not build:
        raise ValueError(f"site {name!r} is already registered")
    _SITES[name] = build


def _default_models() -> None:
    from real_model import prepare
    from tiny_models import ARCHITECTURES, build_tiny_model

    for arch in ARCHITECTURES:
        if arch not in _MODELS:
            _MODELS[arch] = lambda cache, arch=arch: build_tiny_model(cache / arch, arch)
    _MODELS.setdefault("smollm2", lambda cache: prepare())


def _default_sites() -> None:
    from backend_vendor import backend_vendor_site
    from collective_vendor import collective_vendor_site
    from decline_vendor import decline_vendor_site, gdn_decline_vendor_site
    from hostile_vendor import hostile_vendor_site
    from offline_vendor import offline_vendor_site
    from probe_vendor import probe_vendor_site
    from skewed_vendor import skewed_vendor_site

    defaults = {
        "probe": probe_vendor_site,
        "wholebackend": backend_vendor_site,
        "cvendor": collective_vendor_site,
        "decline": decline_vendor_site,
        "gdndecline": gdn_decline_vendor_site,
        "skewed": skewed_vendor_site,
        "hostile": hostile_vendor_site,
        "offline_chip": offline_vendor_site,
    }
    for name, build in defaults.items():
        _SITES.setdefault(name, build)


_built_models: dict[str, Path] = {}


def model_path(name: str) -> Path:
    """The checkpoint of model ``name``, built (or found in the test cache) once per session."""
    _default_models()
    if name not in _built_models:
        try:
            build = _MODELS[name]
        except KeyError:
            known = ", ".join(sorted(_MODELS))
            raise ValueError(f"unknown model {name!r}; registered: {known}") from None
        with cache_lock(f"model-{name}"):
            _built_models[name] = build(persistent_cache("models"))
    return _built_models[name]


@dataclass
class Engine:
    """A running engine of one spec (see the module doc); tests use its methods only."""

    spec: EngineSpec
    workdir: Path
    log: Path
    proc: subprocess.Popen[bytes]
    output: Path
    _replies: Any
    pid: int = 0
    _buffer: bytes = field(default=b"", repr=False)

    # --- what tests call --------------------------------------------------------------------

    def generate(
        self,
        prompts: list[str] | str | None = None,
        *,
        input_ids: list[list[int]] | None = None,
        max_new_tokens: int,
        return_logprob: bool = False,
        **sampling: Any,
    ) -> list[dict[str, Any]]:
        """Greedy (unless ``sampling`` says otherwise) outputs, one dict per prompt."""
        params = {"temperature": 0, "max_new_tokens": max_new_tokens, **sampling}
        kwargs: dict[str, Any] = {"sampling_params": params}
        if input_ids is not None:
            kwargs["input_ids"] = input_ids
        else:
            kwargs["prompt"] = prompts
        if return_logprob:
            kwargs["return_logprob"] = True
        result: list[dict[str, Any]] = self._request({"op": "generate", "kwargs": kwargs})
        return result

    def tokenize(self, text: str) -> list[int]:
        """``text``'s token ids, by the engine's own tokenizer."""
        ids: list[int] = self._request({"op": "tokenize", "text": text})
        return ids

    def flush_cache(self) -> None:
        """Empty the engine's radix cache: the next request reuses nothing an earlier test left."""
        self._request({"op": "flush_cache"})

    def log_mark(self) -> int:
        """How many dispatch records exist now: pass it to :meth:`records` as ``since``."""
        return len(self.records())

    def records(self, since: int = 0) -> list[dict[str, Any]]:
        """The engine's dispatch records (every process of it), optionally only the newer ones."""
        from sglang_fl.dispatch_report import read_log

        return read_log(self.log)[since:] if self.log.exists() else []

    def tail(self, chars: int = 6000) -> str:
        """The end of the engine's combined output, for failure messages."""
        return self.output.read_text(errors="replace")[-chars:] if self.output.exists() else ""

    # --- the pool's side ----------------------------------------------------------------------

    def _read_reply(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise AssertionError(
                    f"engine {self.spec.id} gave no reply within {timeout_s:.0f} s (killed)\n"
                    f"{self.tail()}"
                )
            ready, _, _ = select.select([self._replies], [], [], min(left, 5.0))
            if not ready:
                if self.proc.poll() is not None:
                    raise AssertionError(
                        f"engine {self.spec.id} exited with {self.proc.returncode}\n{self.tail()}"
                    )
                continue
            chunk = os.read(self._replies.fileno(), 1 << 20)
            if not chunk:
                self.proc.wait(timeout=30)
                raise AssertionError(
                    f"engine {self.spec.id} closed its replies (exit {self.proc.returncode})\n"
                    f"{self.tail()}"
                )
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        reply: dict[str, Any] = json.loads(line)
        return reply

    def _request(self, request: dict[str, Any], timeout_s: float = REQUEST_TIMEOUT_S) -> Any:
        if self.proc.poll() is not None:
            raise AssertionError(f"engine {self.spec.id} is not running\n{self.tail()}")
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        reply = self._read_reply(timeout_s)
        if "error" in reply:
            raise AssertionError(
                f"engine {self.spec.id}: {request['op']} failed:\n{reply['error']}"
            )
        return reply["result"]

    def stop(self) -> None:
        """``engine.shutdown()`` in the worker, then its whole process group is gone."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(b'{"op": "shutdown"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def kill(self) -> None:
        """Kill whatever is left of the engine's process group (schedulers, detokenizer)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        self._replies.close()


class EnginePool:
    """The session's engines: at most one alive, each spec started at most once (see module doc)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.current: Engine | None = None
        self._started = 0  # engines started so far: each gets a workdir of its own
        self._failed: dict[EngineSpec, str] = {}
        self._sites: dict[str, Path] = {}
        self._seen: set[EngineSpec] = set()

    def get(self, spec: EngineSpec) -> Engine:
        """The running engine of ``spec``, started (after stopping another) if need be."""
        if spec in self._failed:
            raise EngineStartError(self._failed[spec])
        current = self.current
        if current is not None and current.spec == spec and current.proc.poll() is None:
            return current
        self.stop()
        if spec in self._seen:
            # conftest orders tests by spec; a second start means a test escaped that order.
            print(f"\nnote: engine {spec.id} starts a second time", file=sys.stderr)
        self._seen.add(spec)
        try:
            self.current = self._start(spec)
        except AssertionError as exc:
            self._failed[spec] = str(exc)
            raise EngineStartError(str(exc)) from None
        return self.current

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None

    def site(self, name: str) -> Path:
        """The site directory of vendor distribution ``name``, installed once per session."""
        _default_sites()
        if name not in self._sites:
            try:
                build = _SITES[name]
            except KeyError:
                known = ", ".join(sorted(_SITES))
                raise ValueError(f"unknown site {name!r}; registered: {known}") from None
            self._sites[name] = build(self.root / "sites" / name)
        return self._sites[name]

    def environment(self, spec: EngineSpec, workdir: Path) -> dict[str, str]:
        """The engine's whole environment: clean, its log, the spec's variables and sites."""
        env = clean_env(SGLANG_FL_DISPATCH_LOG=str(workdir / "dispatch.jsonl"))
        for key, value in spec.env:
            env[key] = value.replace("{workdir}", str(workdir))
        if spec.sites:
            paths = [str(self.site(name)) for name in spec.sites]
            env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
        return env

    def _start(self, spec: EngineSpec) -> Engine:
        workdir = self.root / f"engine-{self._started:02d}"
        self._started += 1
        workdir.mkdir(parents=True)
        env = self.environment(spec, workdir)
        config = {
            "model_dir": str(model_path(spec.model)),
            "dtype": spec.dtype,
            "server_args": dict(spec.server_args),
        }
        output = workdir / "engine.log"
        read_end, write_end = os.pipe()
        start = count_engine_start(spec.id)
        with output.open("wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    str(HERE / "engine_worker.py"),
                    json.dumps(config),
                    str(write_end),
                ],
                env=env,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(write_end,),
                start_new_session=True,
                cwd=workdir,
            )
        os.close(write_end)
        engine = Engine(
            spec, workdir, workdir / "dispatch.jsonl", proc, output, os.fdopen(read_end, "rb")
        )
        first = engine._read_reply(ENGINE_TIMEOUT_S)
        if "error" in first:
            engine.kill()
            raise AssertionError(f"engine {spec.id} did not start:\n{first['error']}")
        engine.pid = int(first["pid"])
        start.ready()
        return engine


def spec_of(node: Any) -> EngineSpec | None:
    """The spec a collected test item asks for (``engine`` marker or indirect parameter)."""
    callspec = getattr(node, "callspec", None)
    if callspec is not None and isinstance(callspec.params.get("engine"), EngineSpec):
        spec: EngineSpec = callspec.params["engine"]
        return spec
    marker = node.get_closest_marker("engine")
    if marker is not None:
        found = marker.args[0] if marker.args else marker.kwargs.get("spec")
        if not isinstance(found, EngineSpec):
            raise TypeError(
                f"{node.nodeid}: @pytest.mark.engine takes an EngineSpec, got {found!r}"
            )
        return found
    return None


def companions_of(node: Any) -> tuple[EngineSpec, ...]:
    """The other specs a test consults through ``engine_pool`` when an earlier test did not
    leave their answers (``@pytest.mark.engine(SPEC, also=(OTHER, ...))``)."""
    marker = node.get_closest_marker("engine")
    also = tuple(marker.kwargs.get("also", ())) if marker is not None else ()
    for found in also:
        if not isinstance(found, EngineSpec):
            raise TypeError(f"{node.nodeid}: engine(also=...) takes EngineSpecs, got {found!r}")
    return also


def _consults(items: list[Any]) -> dict[EngineSpec, set[EngineSpec]]:
    """Each spec of ``items``, in first-seen order -> the specs its tests consult (``also=``)."""
    consults: dict[EngineSpec, set[EngineSpec]] = {}
    for item in items:
        spec = spec_of(item)
        if spec is not None:
            consults.setdefault(spec, set()).update(companions_of(item))
    return consults


def by_engine(items: list[Any]) -> Iterator[Any]:
    """``items`` with each spec's tests together, engine-free first, then the specs in
    first-seen order, except that a spec other tests consult (``also=``) comes before them:
    its tests leave the answers those tests reuse, so neither engine starts twice."""
    consults = _consults(items)
    order: dict[EngineSpec | None, int] = {None: -1}
    placing: set[EngineSpec] = set()  # a cycle of consults keeps first-seen order

    def place(spec: EngineSpec) -> None:
        if spec not in order and spec not in placing:
            placing.add(spec)
            for other in sorted(consults.get(spec, ()), key=lambda found: found.id):
                place(other)
            order[spec] = len(order)

    for spec in consults:
        place(spec)
    keyed = [(order[spec_of(item)], index, item) for index, item in enumerate(items)]
    return (item for _, _, item in sorted(keyed, key=lambda entry: entry[:2]))


def scheduling_groups(items: list[Any]) -> dict[str, str]:
    """Each engine test's unit of work for pytest-xdist: ``"engine <id>"`` of its spec, where
    specs a test consults (``also=``) share one unit with that test's spec, so one worker runs
    them all, one start each. A test without a spec but marked ``xdist_group(name)`` (tests
    sharing a module-scoped server) is in unit ``"group <name>"``."""
    parent: dict[EngineSpec, EngineSpec] = {}

    def root(spec: EngineSpec) -> EngineSpec:
        while parent.setdefault(spec, spec) != spec:
            spec = parent[spec]
        return spec

    for spec, consulted in _consults(items).items():
        for other in consulted:
            parent[root(other)] = root(spec)
    groups = {}
    for item in items:
        spec = spec_of(item)
        marker = item.get_closest_marker("xdist_group")
        if spec is not None:
            groups[item.nodeid] = f"engine {root(spec).id}"
        elif marker is not None:
            groups[item.nodeid] = (
                f"group {marker.args[0] if marker.args else marker.kwargs['name']}"
            )
    return groups
