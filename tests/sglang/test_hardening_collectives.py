"""Hardening III (issue 33): the collectives on real ranks, when a vendor misbehaves.

Two ranks of SGLang's own ``GroupCoordinator`` on a gloo world (``group_run.py``, no engine),
with the collective vendor wheel (``collective_vendor.py``, installed for real) whose library
runs on a communicator of its own and whose failure paths are switched per run. Each run has a
hard timeout (a hang fails the test). What each test guards against, as on 4ee63c2:

- the ranks chose each collective alone: a probe true on rank 0 and false on rank 1 sent rank
  0 alone into the communicator set-up (both ranks crashed at the process group's timeout,
  rank 0 wrote no record);
- a call one rank declined ran the reference there while the other ran the vendor's library
  (a hang with a library of its own; the report still named the vendor);
- a ``close()`` that never returned kept a finished rank from exiting;
- two groups given one handle closed it with the first (the second group then ran on a closed
  link), a second group whose set-up failed on another rank closed the handle the first still
  ran on, and a forked child closed its parent's handles at its exit.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from collective_vendor import on_path
from engines import EnginePool
from test_collectives import COLLECTIVES, results, run_group, vendor_lines

from sglang_fl.dispatch_report import read_log

pytest.importorskip("sglang")

TIMEOUT_S = "3"  # SGLANG_FL_PLUGIN_TIMEOUT of every run


@pytest.fixture(scope="module")
def vendor_site(engine_pool: EnginePool) -> Path:
    return engine_pool.site("cvendor")


def run(vendor_site: Path, tmp_path: Path, **env: str) -> tuple[list[Any], Path, Path]:
    out = tmp_path / "vendor.jsonl"
    done, log = run_group(
        tmp_path,
        PYTHONPATH=on_path(vendor_site),
        COLLECTIVE_VENDOR_OUT=str(out),
        SGLANG_FL_PLUGIN_TIMEOUT=TIMEOUT_S,
        **env,
    )
    return done, log, out


def records(log: Path, event: str) -> dict[int, list[dict[str, Any]]]:
    """pid -> the records of ``event``, in order."""
    found: dict[int, list[dict[str, Any]]] = {}
    for row in read_log(log):
        if row["event"] == event:
            found.setdefault(row["pid"], []).append(row)
    return found


def by_rank(ranks: list[dict[str, Any]], log: Path) -> dict[int, dict[str, dict[str, Any]]]:
    """rank -> op -> its ``collective`` record for group ``pp``."""
    pids = {r["pid"]: r["rank"] for r in ranks}
    table: dict[int, dict[str, dict[str, Any]]] = {}
    for pid, rows in records(log, "collective").items():
        table[pids[pid]] = {r["op"]: r for r in rows if r["group"].startswith("pp")}
    return table


# -- 3. every decision that changes which code talks to the other ranks is the group's --------


def test_a_probe_true_on_one_rank_only_leaves_the_reference_on_both_reported_per_rank(
    vendor_site: Path, tmp_path: Path
) -> None:
    done, log, out = run(vendor_site, tmp_path, COLLECTIVE_VENDOR_AVAILABLE_RANKS="0")
    ranks = results(done)
    assert vendor_lines(out) == [], "no rank set up or called the vendor's library"
    table = by_rank(ranks, log)
    for rank in ranks:
        assert set(rank["results"].values()) == {"ok"}, rank
    assert sorted(table[0]) == sorted(table[1]) == COLLECTIVES
    for op in COLLECTIVES:
        mine, other = table[0][op], table[1][op]
        assert (mine["impl_id"], other["impl_id"]) == (f"reference.{op}",) * 2
        # Rank 0 would have run the vendor alone: its record says so, and why the group won't.
        assert mine["fallback_from"] == f"vendor.cvendor.{op}"
        assert f"rank 0 chose vendor.cvendor.{op}" in mine["fallback_reason"]
        assert (
            f"rank 1 chose reference.{op} (vendor.cvendor.{op}: unavailable"
            in (mine["fallback_reason"])
        )
        assert "fallback_from" not in other  # rank 1 runs what it chose
    assert not records(log, "communicator")


def test_under_strict_ranks_that_disagree_fail_together_naming_the_ranks(
    vendor_site: Path, tmp_path: Path
) -> None:
    done, _, out = run(
        vendor_site, tmp_path, COLLECTIVE_VENDOR_AVAILABLE_RANKS="0", SGLANG_FL_STRICT="1"
    )
    for proc in done:
        assert proc.returncode != 0
        assert "StrictModeError: SGLANG_FL_STRICT=1: the ranks of group 'pp:0'" in proc.stderr
        assert "rank 0 chose vendor.cvendor.all_reduce" in proc.stderr, proc.stderr[-3000:]
    assert vendor_lines(out) == []


def test_a_call_declined_on_one_rank_only_stops_that_rank_naming_it_not_a_hang(
    vendor_site: Path, tmp_path: Path
) -> None:
    """Rank 1 declines all_reduce while rank 0 is in the vendor's own collective: rank 1
    stops with CollectiveDivergenceError within the plugin timeout, rank 0's collective ends
    with it (its peer left), and neither computes a result from two libraries."""
    started = time.monotonic()
    done, _, _ = run(vendor_site, tmp_path, COLLECTIVE_VENDOR_DECLINE="all_reduce:1")
    assert time.monotonic() - started < 240
    rank0, rank1 = done
    assert rank1.returncode != 0
    assert "CollectiveDivergenceError: all_reduce on group 'pp:0'" in rank1.stderr
    assert (
        "vendor.cvendor.all_reduce declined a call here (Unsupported: cvendor: all_reduce "
        "declined on rank 1), but not on every rank of the group within 3 s"
    ) in rank1.stderr, rank1.stderr[-3000:]
    assert rank0.returncode != 0, "rank 0 cannot finish an all_reduce its peer left"
    assert not any("all_reduce" in line and '"ok"' in line for line in rank0.stdout.splitlines())


def test_a_call_every_rank_declines_falls_back_on_every_rank(
    vendor_site: Path, tmp_path: Path
) -> None:
    done, log, out = run(vendor_site, tmp_path, COLLECTIVE_VENDOR_DECLINE="all_reduce:0,1")
    ranks = results(done)
    for rank in ranks:
        assert set(rank["results"].values()) == {"ok"}, rank
    fallbacks = {pid: rows for pid, rows in records(log, "fallback").items()}
    assert sorted(fallbacks) == sorted(r["pid"] for r in ranks)
    for rows in fallbacks.values():
        assert [(r["op"], r["impl_id"], r["next_impl_id"]) for r in rows] == [
            ("all_reduce", "vendor.cvendor.all_reduce", "reference.all_reduce")
        ]
    closed = [r for r in vendor_lines(out) if "calls" in r]
    assert all("all_reduce" not in r["calls"] for r in closed), closed


# -- 4. close() bounded, reported; the rank still exits ----------------------------------------


HUNG = "close() did not return within 3 s (SGLANG_FL_PLUGIN_TIMEOUT)"


@pytest.mark.parametrize(
    ("how", "keep", "problem"),
    [
        ("hang", "0", HUNG),
        ("raise", "0", "close() raised RuntimeError: cvendor: the link is already gone"),
        ("hang", "1", HUNG),  # the group left open: interpreter exit closes it, reported too
    ],
    ids=["hang-at-destroy", "raise-at-destroy", "hang-at-exit"],
)
def test_a_close_that_hangs_or_raises_is_reported_and_the_rank_exits(
    vendor_site: Path, tmp_path: Path, how: str, keep: str, problem: str
) -> None:
    started = time.monotonic()
    done, log, _ = run(vendor_site, tmp_path, COLLECTIVE_VENDOR_CLOSE=how, GROUP_RUN_KEEP=keep)
    ranks = results(done)  # both ranks finished, exit status 0
    assert time.monotonic() - started < 200
    states = records(log, "communicator")
    assert sorted(states) == sorted(r["pid"] for r in ranks)
    for rows in states.values():
        assert [(r["group"], r["state"], r["problem"]) for r in rows] == [
            ("pp:0", "open", None),
            ("pp:0", "close_failed", problem),
        ]


# -- not yet attacked: one handle for two groups, fork with open communicators -----------------


def test_one_handle_for_two_groups_is_closed_once_after_the_last_group(
    vendor_site: Path, tmp_path: Path
) -> None:
    done, log, out = run(vendor_site, tmp_path, COLLECTIVE_VENDOR_SHARED="1", GROUP_RUN_SECOND="1")
    ranks = results(done)
    for rank in ranks:
        assert rank["results"]["all_reduce_on_second_group"] == "ok", rank
    closes = [r for r in vendor_lines(out) if "calls" in r]
    assert sorted(r["pid"] for r in closes) == sorted(r["pid"] for r in ranks), closes
    for row in closes:  # closed once, after the second group's all_reduce
        assert row["calls"]["all_reduce"] == 2, row
    for rows in records(log, "communicator").values():
        assert [(r["group"], r["state"]) for r in rows] == [
            ("pp:0", "open"),
            ("ep:0", "open"),
            ("pp:0", "released"),
            ("ep:0", "closed"),
        ]


def test_a_group_whose_set_up_fails_leaves_a_shared_handle_to_the_group_holding_it(
    vendor_site: Path, tmp_path: Path
) -> None:
    """Before: ``ep``'s set-up failed on rank 1, so rank 0 closed what its hook returned, the
    handle ``pp`` still ran on (closed twice, the first time before ``pp``'s collectives)."""
    done, log, out = run(
        vendor_site,
        tmp_path,
        COLLECTIVE_VENDOR_SHARED="1",
        GROUP_RUN_SECOND="1",
        COLLECTIVE_VENDOR_INIT="raise",
        COLLECTIVE_VENDOR_INIT_GROUP="ep",
    )
    ranks = results(done)
    for rank in ranks:
        assert rank["results"]["all_reduce_on_second_group"] == "ok", rank  # the reference
    closes = [r for r in vendor_lines(out) if "calls" in r]
    assert sorted(r["pid"] for r in closes) == sorted(r["pid"] for r in ranks), closes
    for row in closes:  # once, at pp's teardown, after pp's collectives
        assert row["calls"].get("all_reduce") == 1, row
    for rows in records(log, "communicator").values():
        assert [(r["group"], r["state"]) for r in rows] == [("pp:0", "open"), ("pp:0", "closed")]


def test_a_forked_child_closes_none_of_its_parents_communicators(
    vendor_site: Path, tmp_path: Path
) -> None:
    done, _, out = run(vendor_site, tmp_path, GROUP_RUN_FORK="1")
    ranks = results(done)
    for rank in ranks:
        assert rank["fork_child_exit"] == 0, rank
    closes = [r for r in vendor_lines(out) if "calls" in r]
    assert sorted(r["pid"] for r in closes) == sorted(r["pid"] for r in ranks), (
        "each parent closed its own handle once; no child closed one"
    )
    assert all(json.dumps(r) for r in closes)
