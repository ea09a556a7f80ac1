"""SGLang's GroupCoordinator collectives through sglang-fl, on real ranks (gloo on the CPU).

``group_run.py`` drives SGLang's own ``GroupCoordinator`` in 2 processes (no engine: cheap),
so every routed collective is called on every rank, including ``send``/``recv`` (pipeline
parallelism's path, tested directly; see the note on PP below). The shared multi-rank engines
(``configurations.py``: TP=2 Llama and Qwen3-MoE, PP=2 Llama) with a third-party collective
library (``collective_vendor.py``) check the whole path: transformers' greedy tokens, and every
scheduler rank served by the vendor.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from collective_vendor import on_path
from configurations import LLAMA_PP2, LLAMA_TP2, QWEN3_MOE_TP2
from engines import Engine, EnginePool
from sglang_processes import HERE, clean_env

from sglang_fl.dispatch_report import read_log
from sglang_fl.integrations.sglang.collectives import METHODS, TENSOR_DICTS

pytest.importorskip("sglang")

GROUP_TIMEOUT_S = 300
COLLECTIVES = sorted(METHODS)


def run_group(tmp_path: Path, **env: str) -> tuple[list[subprocess.CompletedProcess[str]], Path]:
    """``group_run.py`` on 2 ranks with a hard timeout; (finished processes, dispatch log)."""
    log = tmp_path / "dispatch.jsonl"
    store = tmp_path / "store"
    environment = clean_env(SGLANG_FL_DISPATCH_LOG=str(log), **env)
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "group_run.py"), str(rank), "2", str(store)],
            env=environment,
            cwd=HERE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    done = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=GROUP_TIMEOUT_S)
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:
        for proc in procs:
            proc.kill()
    return done, log


def results(done: list[subprocess.CompletedProcess[str]]) -> list[dict[str, Any]]:
    for proc in done:
        assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return [json.loads(proc.stdout.strip().splitlines()[-1]) for proc in done]


def collective_records(log: Path) -> dict[int, dict[str, dict[str, Any]]]:
    """pid -> op -> its ``collective`` record for the multi-rank group ``pp``."""
    found: dict[int, dict[str, dict[str, Any]]] = {}
    for row in read_log(log):
        if row["event"] == "collective":
            assert row["group"].startswith("pp"), f"a one-rank group was reported: {row}"
            assert row["op"] not in found.get(row["pid"], {}), f"reported twice: {row}"
            found.setdefault(row["pid"], {})[row["op"]] = row
    return found


def test_the_reference_serves_every_collective_on_every_rank(tmp_path: Path) -> None:
    done, log = run_group(tmp_path)
    ranks = results(done)
    records = collective_records(log)
    assert sorted(records) == sorted(r["pid"] for r in ranks)
    for rank in ranks:
        assert set(rank["results"].values()) == {"ok"}, rank
        assert rank["routed_methods"] == sorted([*COLLECTIVES, *TENSOR_DICTS])
        assert rank["solo_untouched"], "a one-rank group keeps SGLang's own methods"
        mine = records[rank["pid"]]
        assert sorted(mine) == COLLECTIVES
        for op, row in mine.items():
            assert (row["runner"], row["impl_id"], row["kind"]) == (
                "sglang-fl",
                f"reference.{op}",
                "reference",
            )
            assert (row["ranks"], row["rank_in_group"]) == ([0, 1], rank["rank"])
            assert row["sglang_method"] == f"GroupCoordinator.{op}"
            dicts = [f"GroupCoordinator.{m}" for m, p2p in TENSOR_DICTS.items() if p2p == op]
            assert row["also_serves"] == dicts


@pytest.fixture(scope="module")
def vendor_site(engine_pool: EnginePool) -> Path:
    return engine_pool.site("cvendor")


def vendor_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_vendor_communicator_serves_every_collective_on_every_rank(
    vendor_site: Path, tmp_path: Path
) -> None:
    out = tmp_path / "vendor.jsonl"
    done, log = run_group(tmp_path, PYTHONPATH=on_path(vendor_site), COLLECTIVE_VENDOR_OUT=str(out))
    ranks = results(done)
    closed = {r["rank"]: r for r in vendor_lines(out) if "calls" in r}
    assert sorted(closed) == [0, 1], "each rank's communicator is closed by group.destroy()"
    assert len({r["unique_id"] for r in closed.values()}) == 1, "one id, exchanged"
    # Every collective on every rank; send only where it sends, recv only where it receives.
    assert set(closed[0]["calls"]) == set(COLLECTIVES) - {"recv"}
    assert set(closed[1]["calls"]) == set(COLLECTIVES) - {"send"}
    # The tensor dicts' tensors through the vendor: one direct send plus one per dict (its one
    # non-empty tensor; the empty one moves no bytes), and the metadata (pickled by SGLang's
    # send_object on the CPU group) not at all.
    assert (closed[0]["calls"]["send"], closed[1]["calls"]["recv"]) == (3, 3)
    records = collective_records(log)
    for rank in ranks:
        assert set(rank["results"].values()) == {"ok"}, rank
        for op, row in records[rank["pid"]].items():
            assert (row["impl_id"], row["distribution"]) == (
                f"vendor.cvendor.{op}",
                "sglang-fl-cvendor",
            )
            assert "fallback_from" not in row


@pytest.mark.parametrize("how", ["raise", "hang"])
def test_a_communicator_that_fails_to_initialise_leaves_the_reference_serving(
    vendor_site: Path, tmp_path: Path, how: str
) -> None:
    out = tmp_path / "vendor.jsonl"
    done, log = run_group(
        tmp_path,
        PYTHONPATH=on_path(vendor_site),
        COLLECTIVE_VENDOR_OUT=str(out),
        COLLECTIVE_VENDOR_INIT=how,
        SGLANG_FL_PLUGIN_TIMEOUT="3",
    )
    ranks = results(done)
    assert vendor_lines(out) == [], "no rank used the vendor's library"
    records = collective_records(log)
    reasons = {}
    for rank in ranks:
        assert set(rank["results"].values()) == {"ok"}, rank
        mine = records[rank["pid"]]
        assert sorted(mine) == COLLECTIVES
        for op, row in mine.items():
            assert (row["runner"], row["impl_id"]) == ("sglang-fl", f"reference.{op}")
            assert row["fallback_from"] == f"vendor.cvendor.{op}"
        reasons[rank["rank"]] = mine["all_reduce"]["fallback_reason"]
    if how == "raise":
        assert (
            reasons[1] == "sglang_fl_communicator raised RuntimeError: cvendor: no link to rank 1"
        )
        # Rank 0 waited in its unique-id broadcast for rank 1: its own set-up failed too.
        assert reasons[0].startswith("sglang_fl_communicator "), reasons[0]
    else:
        assert set(reasons.values()) == {
            "sglang_fl_communicator did not return within 3 s (SGLANG_FL_PLUGIN_TIMEOUT)"
        }


def test_under_strict_a_failing_communicator_is_an_error_naming_vendor_and_group(
    vendor_site: Path, tmp_path: Path
) -> None:
    done, _ = run_group(
        tmp_path,
        PYTHONPATH=on_path(vendor_site),
        COLLECTIVE_VENDOR_OUT=str(tmp_path / "vendor.jsonl"),
        COLLECTIVE_VENDOR_INIT="raise",
        SGLANG_FL_STRICT="1",
        # Rank 0 waits in its unique-id broadcast for rank 1, whose set-up raised: bounded by
        # the plugin timeout (60 s by default), as in the lenient test above.
        SGLANG_FL_PLUGIN_TIMEOUT="3",
    )
    for rank, proc in enumerate(done):
        assert proc.returncode != 0
        assert (
            "StrictModeError: SGLANG_FL_STRICT=1: plugin 'cvendor': communicator for group "
            f"'pp:0' (ranks 0, 1; this is rank {rank}):"
        ) in proc.stderr, proc.stderr[-3000:]


PROMPTS = ["def main():", "class Config:"]
MAX_NEW_TOKENS = 8


def ranks_run(engine: Engine) -> dict[str, Any]:
    """Greedy ``PROMPTS`` on a multi-rank engine: its ``output_ids``, the scheduler ranks
    (``schedulers``: pid -> title), the dispatch log's ``rows`` and the vendor's first-call
    records on the ``tp`` group as ``called`` (pid, op) pairs."""
    outputs = engine.generate(PROMPTS, max_new_tokens=MAX_NEW_TOKENS)
    rows = engine.records()
    vendor = vendor_lines(engine.workdir / "vendor.jsonl")
    return {
        "output_ids": [out["output_ids"] for out in outputs],
        "rows": rows,
        "schedulers": {
            r["pid"]: r["proctitle"]
            for r in rows
            if str(r.get("proctitle") or "").startswith("sglang::scheduler")
        },
        "called": {
            (r["pid"], r["op"]) for r in vendor if "op" in r and r["group"].startswith("tp")
        },
        "vendor": vendor,
    }


def assert_both_ranks_served(result: dict[str, Any], ops: set[str]) -> None:
    """Both scheduler ranks bound ``ops`` of the ``tp`` group to the vendor and called them."""
    schedulers = result["schedulers"]
    assert len(schedulers) == 2, f"two scheduler ranks: {schedulers}"
    tp = [r for r in result["rows"] if r["event"] == "collective" and r["group"].startswith("tp")]
    for op in ops:
        served = {r["pid"]: r for r in tp if r["op"] == op}
        assert set(served) == set(schedulers), (op, served)
        for row in served.values():
            assert (row["runner"], row["impl_id"]) == ("sglang-fl", f"vendor.cvendor.{op}")
    assert {(pid, op) for pid in schedulers for op in ops} <= result["called"], result["called"]


@pytest.mark.engine(LLAMA_TP2)
def test_tp2_engine_keeps_transformers_tokens_with_a_vendor_serving_both_ranks(
    engine: Engine, oracle
) -> None:
    """TP=2 tiny Llama: the tensor-parallel all-reduces run through the vendor on both."""
    result = ranks_run(engine)
    assert result["output_ids"] == oracle("llama", PROMPTS, MAX_NEW_TOKENS)
    assert_both_ranks_served(result, {"all_reduce"})


@pytest.mark.engine(QWEN3_MOE_TP2)
def test_tp2_moe_engine_keeps_transformers_tokens_with_a_vendor_serving_both_ranks(
    engine: Engine, oracle
) -> None:
    """TP=2 tiny Qwen3-MoE: each rank holds half of every expert's MLP; the attention and
    expert outputs are all-reduced through the vendor on both ranks."""
    result = ranks_run(engine)
    want = oracle("qwen3_moe", PROMPTS, MAX_NEW_TOKENS, stop_at_eos=True)
    assert result["output_ids"] == want
    assert_both_ranks_served(result, {"all_reduce"})


@pytest.mark.engine(LLAMA_PP2)
def test_pp2_engine_keeps_transformers_tokens_and_reports_its_collectives(
    engine: Engine, oracle
) -> None:
    """PP=2 runs on the CPU in SGLang 0.5.23: two stages, tokens as transformers'. The
    pipeline moves activations with ``send_tensor_dict``/``recv_tensor_dict``; routed, their
    tensors travel through the vendor's ``send`` on the first stage and its ``recv`` on the
    last, on both ranks' ``pp`` group."""
    result = ranks_run(engine)
    assert result["output_ids"] == oracle("llama", PROMPTS, MAX_NEW_TOKENS)
    rows = result["rows"]
    stages = {
        r["pid"] for r in rows if str(r.get("proctitle") or "").startswith("sglang::scheduler_PP")
    }
    assert len(stages) == 2, stages
    pp = [r for r in rows if r["event"] == "collective" and r["group"].startswith("pp")]
    assert {(r["pid"], r["op"]) for r in pp} == {(pid, op) for pid in stages for op in COLLECTIVES}
    for row in (r for r in pp if r["op"] in ("send", "recv")):
        assert (row["runner"], row["impl_id"]) == ("sglang-fl", f"vendor.cvendor.{row['op']}")
        assert row["also_serves"] == [f"GroupCoordinator.{row['op']}_tensor_dict"]
    # The vendor's own record of its first calls: the activations went through its library.
    called = {(r["pid"], r["rank"], r["op"]) for r in result["vendor"] if "op" in r}
    pp_calls = {(rank, op) for pid, rank, op in called if pid in stages}
    assert {(0, "send"), (1, "recv")} <= pp_calls, called
    assert {pid for pid, _, op in called if op in ("send", "recv")} == stages, called


@pytest.mark.engine(LLAMA_TP2)
def test_tp2_engine_shutdown_closes_every_communicator_it_opened(
    engine: Engine, engine_pool: EnginePool
) -> None:
    """Issue 32: ``Engine.shutdown()`` SIGKILLs SGLang's schedulers, so no communicator opened
    at TP=2 was ever closed. Now it first asks them to exit gracefully, and each closes what it
    opened (bounded) before SGLang aborts its process groups. This test stops the shared engine:
    it stays the last ``LLAMA_TP2`` test (``conftest`` runs a spec's tests in file order)."""
    engine.generate(PROMPTS, max_new_tokens=2)  # the engine serves (and is started if need be)
    opened = {
        (r["pid"], r["group"])
        for r in engine.records()
        if r["event"] == "communicator" and r["state"] == "open"
    }
    schedulers = {pid for pid, _ in opened}
    assert len(schedulers) == 2, opened
    engine_pool.stop()  # engine.shutdown() in the engine's process, then its process group goes
    closed = {
        (r["pid"], r["group"])
        for r in engine.records()
        if r["event"] == "communicator" and r["state"] == "closed"
    }
    assert closed == opened, f"opened {sorted(opened)}, closed {sorted(closed)}"
    # The vendor's own teardown ran once per link, in the process that opened it.
    teardowns = [r for r in vendor_lines(engine.workdir / "vendor.jsonl") if "calls" in r]
    assert sorted((r["pid"], r["group"]) for r in teardowns) == sorted(opened)
