"""Multi-process conformance for collectives: the kit starts the ranks itself (gloo on the CPU).

:func:`run_collective_checks` starts ``world_size`` fresh interpreters (subprocesses running
a function of this module: the caller's script is never imported again, so it needs no
``if __name__ == "__main__":`` guard), joins them in one gloo process group, sets up the
vendor's communicator for it (``sglang_fl_communicator``, the same lifecycle SGLang's groups
get), and runs every case and dtype of the selected collective contracts on every rank; each
rank compares its own output with what the contract says that rank must hold (computed from
every rank's inputs, without communication) and checks that preserved inputs stayed untouched.
Then each rank tears down as an engine does (the communicator's ``close()``, bounded by
``SGLANG_FL_PLUGIN_TIMEOUT``, then the process group) and says it finished. The whole run has
a hard timeout: a hang (a collective one rank never joins) kills the ranks and fails every case
not yet reported; a rank that does not finish (its teardown failed or hung, it died) fails
every case of the run, naming the rank and why.

Implementations are named by ``impl_id`` and looked up in each rank's own registry (the
installed plugins), so they need not be picklable; ``None`` checks the references.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..errors import Unsupported

__all__ = ["CollectiveResult", "collective_ops", "run_collective_checks"]

DEFAULT_TIMEOUT = 180.0


@dataclass(frozen=True)
class CollectiveResult:
    """One case, dtype and world size of one op, as all ranks saw it."""

    op: str
    world_size: int
    case: str
    dtype: str
    passed: bool
    message: str = ""
    # Every rank declined it with ``Unsupported`` before sending (``message`` says why): a
    # skip, as for a single-process op; the engine serves such a call with the next candidate.
    declined: bool = False

    @property
    def case_id(self) -> str:
        return f"{self.op}/world={self.world_size}/{self.dtype}/{self.case}"


def collective_ops() -> tuple[str, ...]:
    """The names of the standard ops that are collectives, in registry order."""
    from ..ops import STANDARD_OPS

    return tuple(name for name, contract in STANDARD_OPS.items() if contract.collective)


def run_collective_checks(
    world_size: int,
    impls: Mapping[str, str] | None = None,
    *,
    ops: Sequence[str] | None = None,
    dtypes: Sequence[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    plugin: str | None = None,
    env: Mapping[str, str] | None = None,
    prepare: str | None = None,
) -> list[CollectiveResult]:
    """Run the selected collectives' cases on ``world_size`` spawned ranks; one result each.

    ``impls`` maps op names to the ``impl_id`` under test (ops missing from it, and a
    ``None`` mapping, run their reference); a peer op (``recv`` for ``send``) is taken from
    ``impls`` too. ``plugin`` names the plugin whose communicator the group gets (``None``:
    none). ``env`` is added to each rank's environment. ``prepare`` (``"module:function"``,
    importable in the ranks) is called first in each rank, before the group is joined: a
    vendor's tests put their double of the collective library in place there, since the
    ranks are fresh interpreters. A rank that hangs, dies or does not
    finish within ``timeout`` seconds fails every case it did not report.
    """
    from ..ops import get_contract

    selected = tuple(ops or collective_ops())
    for op in selected:
        if get_contract(op).collective is None:
            raise ValueError(f"op {op!r} is not a collective; collectives: {collective_ops()}")
    with tempfile.TemporaryDirectory(prefix="sglang-fl-collectives-") as tmp:
        root = Path(tmp)
        job = {
            "world_size": world_size,
            "impls": dict(impls or {}),
            "ops": list(selected),
            "dtypes": list(dtypes) if dtypes else None,
            "plugin": plugin,
            "store": str(root / "store"),
            "results": str(root),
            "timeout": timeout,
            "prepare": prepare,
        }
        job_file = root / "job.json"
        job_file.write_text(json.dumps(job))
        environment = {**os.environ, **dict(env or {})}
        # The ranks see what this process sees (a test's plugin site on sys.path, too), after
        # what ``env`` puts on the path.
        given = (env or {}).get("PYTHONPATH", "")
        environment["PYTHONPATH"] = os.pathsep.join(p for p in (given, *sys.path) if p)
        ranks = []
        for rank in range(world_size):
            with (root / f"rank{rank}.log").open("wb") as log:
                ranks.append(
                    subprocess.Popen(
                        [sys.executable, "-c", _RANK_ENTRY, str(job_file), str(rank)],
                        env=environment,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        deadline = time.monotonic() + timeout
        hung = []
        for rank, process in enumerate(ranks):
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung.append(rank)
        for process in ranks:
            if process.poll() is None:
                process.kill()
                process.wait(10)
        exits = {rank: process.returncode for rank, process in enumerate(ranks)}
        return list(_collect(root, job, hung, exits))


# What each rank runs: a function of this module, never the caller's ``__main__``.
_RANK_ENTRY = (
    "import sys; from sglang_fl.testing.collectives import _rank_main; "
    "_rank_main(sys.argv[1], int(sys.argv[2]))"
)


def _planned(job: Mapping[str, Any]) -> Iterator[tuple[str, Any, Any]]:
    """Every (op, case, dtype) the job runs, in the same order on every rank."""
    import torch

    from ..ops import get_contract

    for op in job["ops"]:
        contract = get_contract(op)
        for dtype in contract.dtypes:
            name = str(dtype).removeprefix("torch.")
            if job["dtypes"] and name not in job["dtypes"]:
                continue
            for case in contract.cases:
                yield op, case, getattr(torch, name)


def _collect(
    root: Path, job: Mapping[str, Any], hung: list[int], exits: Mapping[int, int | None]
) -> Iterator[CollectiveResult]:
    n = job["world_size"]
    per_rank: list[dict[str, dict[str, Any]]] = []
    setup: list[str] = []
    silent: dict[int, str] = {}  # why a rank reported no more
    unfinished: list[str] = []  # a rank that did not finish fails every case of the run
    for rank in range(n):
        path = root / f"rank{rank}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        records = [json.loads(line) for line in lines if line.strip()]
        failed_setup = [f"rank {rank}: {r['message']}" for r in records if r.get("setup")]
        setup += failed_setup
        per_rank.append({r["id"]: r for r in records if "id" in r})
        finished = [r for r in records if r.get("finished")]
        if rank in hung:
            silent[rank] = "hung (killed at the kit's timeout)"
        else:
            silent[rank] = f"exited with code {exits[rank]} before reporting it"
            if not records:  # not even a set-up record: its own output is all there is
                silent[rank] += _output_tail(root / f"rank{rank}.log")
        if finished and finished[0]["teardown"]:
            unfinished.append(f"rank {rank}: teardown: {finished[0]['teardown']}")
        elif not finished and not failed_setup:
            unfinished.append(f"rank {rank} did not finish: {silent[rank]}")
    for op, case, dtype in _planned(job):
        name = str(dtype).removeprefix("torch.")
        case_id = f"{op}/world={n}/{name}/{case.name}"
        problems = []
        records = [per_rank[rank].get(case_id) for rank in range(n)]
        declines = [r.get("declined") for r in records if r is not None]
        if any(declines) and not all(declines) and len(declines) == n:
            # One rank in the library while another is not: a real engine would hang.
            problems.append(f"declined on some ranks only: {[bool(d) for d in declines]}")
        for rank in range(n):
            record = records[rank]
            if record is None:
                problems.append(f"rank {rank}: {silent[rank]}")
            elif not record["passed"]:
                problems.append(f"rank {rank}: {record['message']}")
        if problems and setup:
            problems += setup
        problems += unfinished
        declined = bool(declines) and all(declines) and not problems
        message = str(declines[0]) if declined else "\n".join(problems)
        yield CollectiveResult(op, n, case.name, name, not problems, message, declined)


def _output_tail(log: Path) -> str:
    tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
    return f"; its output ends:\n{tail}" if tail.strip() else ""


# -- one rank ------------------------------------------------------------------------------------


def _rank_main(job_file: str, rank: int) -> None:
    """The body of one rank: join the group, run the plan, write one line per case, tear
    down, write that it finished (with the teardown's problem, if any)."""
    job = json.loads(Path(job_file).read_text())
    out = Path(job["results"]) / f"rank{rank}.jsonl"

    def write(record: Mapping[str, Any]) -> None:
        with out.open("a") as f:
            f.write(json.dumps(record) + "\n")

    try:
        if job["prepare"]:
            module, _, function = job["prepare"].partition(":")
            getattr(importlib.import_module(module), function)()
        group, fns = _setup(job, rank)
    except BaseException as exc:
        write({"setup": True, "message": f"set-up failed: {exc!r}\n{traceback.format_exc()}"})
        raise
    for op, case, dtype in _planned(job):
        case_id = f"{op}/world={job['world_size']}/{str(dtype).removeprefix('torch.')}/{case.name}"
        try:
            message = _check(op, case, dtype, group, fns, rank, job["world_size"])
        except Unsupported as exc:  # declined before sending: a skip, if every rank agrees
            write({"id": case_id, "passed": True, "declined": str(exc), "message": ""})
            continue
        except Exception as exc:
            message = f"raised {type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        write({"id": case_id, "passed": message is None, "message": message or ""})
    write({"finished": True, "teardown": _teardown(job, group)})


def _teardown(job: Mapping[str, Any], group: Any) -> str | None:
    """The communicator's teardown (bounded), then the process group's, as an engine's
    shutdown does; what went wrong, or ``None``."""
    import torch.distributed as dist

    from ..communicators import close_communicator

    problem = None
    if job["plugin"] and group.communicator is not None:
        problem = close_communicator(job["plugin"], group, group.communicator).problem
    dist.destroy_process_group()
    return problem


def _setup(job: Mapping[str, Any], rank: int) -> tuple[Any, dict[str, dict[str, Any]]]:
    import torch
    import torch.distributed as dist

    from ..communicators import open_communicator
    from ..ops import get_contract
    from ..ops.collectives import CollectiveGroup
    from ..runtime import get_runtime

    n = job["world_size"]
    dist.init_process_group(
        "gloo",
        init_method=f"file://{job['store']}",
        rank=rank,
        world_size=n,
        timeout=timedelta(seconds=job["timeout"]),
    )
    group = CollectiveGroup(
        name=f"kit:{n}",
        ranks=tuple(range(n)),
        rank_in_group=rank,
        device=torch.device("cpu"),
        device_group=dist.group.WORLD,
        cpu_group=dist.new_group(list(range(n)), backend="gloo"),
    )
    runtime = get_runtime()
    if job["plugin"]:
        outcome = open_communicator(runtime, job["plugin"], group)
        if not outcome.ok:
            raise RuntimeError(f"the communicator could not be set up: {outcome.problem}")
        group = dataclasses.replace(group, communicator=outcome.communicator)
    wanted = dict(job["impls"])
    fns: dict[str, dict[str, Any]] = {}
    for op in job["ops"]:
        contract = get_contract(op)
        assert contract.collective is not None
        table = {}
        for name in (op, *contract.collective.peers):
            impl_id = wanted.get(name)
            if impl_id is None:
                table[name] = get_contract(name).reference
                continue
            found = [i for i in runtime.registry.implementations(name) if i.impl_id == impl_id]
            if not found:
                raise LookupError(f"no implementation {impl_id!r} of op {name!r} is registered")
            table[name] = found[0].fn
        fns[op] = table
    return group, fns


def _check(
    op: str, case: Any, dtype: Any, group: Any, fns: Mapping[str, Any], rank: int, n: int
) -> str | None:
    """This rank's verdict on one case: ``None`` when it passed, else what was wrong."""
    import torch

    from ..comparison import compare
    from ..ops import get_contract

    contract = get_contract(op)
    spec = contract.collective
    assert spec is not None
    device = torch.device("cpu")
    everyone = [spec.rank_inputs(case, dtype, device, r, n) for r in range(n)]
    mine = spec.rank_inputs(case, dtype, device, rank, n)
    # A pair's inputs are written for one half's signature (``send``'s for ``recv`` too).
    signature = next(
        get_contract(name).signature
        for name in (op, *spec.peers)
        if set(mine.preserved) <= set(get_contract(name).parameter_names)
    )
    preserved = {name: mine.argument(name, signature).clone() for name in mine.preserved}
    got = spec.run(fns[op], group, case, mine)
    want = spec.expected(case, everyone, rank)
    tolerance = contract.tolerance(dtype)
    problems = []
    if want is None:
        if got is not None:
            problems.append(f"this rank should get no output, got {type(got).__name__}")
    elif isinstance(want, list):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            problems.append(f"returned {type(got).__name__}, expected a list of {len(want)}")
        else:
            for index, (g, w) in enumerate(zip(got, want, strict=True)):
                problem = compare(g, w, tolerance, f"output[{index}]")
                if problem:
                    problems.append(problem)
    else:
        problem = compare(got, want, tolerance, "output")
        if problem:
            problems.append(problem)
    for name, before in preserved.items():
        if not torch.equal(mine.argument(name, signature), before):
            problems.append(f"input {name!r} was modified; it must stay untouched")
    return "; ".join(problems) if problems else None
