"""The dispatch report's common fields: every record says which process wrote it and its role."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from sglang_fl.config import Settings
from sglang_fl.dispatch.availability import AvailabilityCache
from sglang_fl.dispatch.policy import SelectionPolicy
from sglang_fl.dispatch.registry import OpRegistry
from sglang_fl.dispatch.resolve import CandidateOutcome, Decision, resolve
from sglang_fl.dispatch_report import DispatchReport, ReportEvent, process_role, read_log
from sglang_fl.ops import get_contract
from sglang_fl.types import Availability, BackendImplKind, OpImpl


@pytest.mark.parametrize(
    ("title", "role"),
    [
        ("sglang::scheduler_TP0", "scheduler"),
        ("sglang::scheduler_DP1_TP0_EP0", "scheduler"),
        ("sglang::detokenizer", "detokenizer"),
        ("sglang::data_parallel_controller", "data_parallel_controller"),
        ("VLLM::EngineCore", "engine_core"),
    ],
)
def test_an_engine_title_names_the_role(title: str, role: str) -> None:
    assert process_role(title) == role


def test_the_process_that_started_the_others_is_main(tmp_path: Path) -> None:
    assert process_role("python -m pytest") == "main"
    DispatchReport(tmp_path / "log.jsonl").emit(ReportEvent.PLUGIN)
    (record,) = read_log(tmp_path / "log.jsonl")
    assert record["role"] == "main"


def run_scheduler_process(log: str) -> None:
    """Named as SGLang's scheduler entry: its records come before SGLang sets the title."""
    DispatchReport(Path(log)).emit(ReportEvent.PLUGIN)


def run_detokenizer_process(log: str) -> None:
    DispatchReport(Path(log)).emit(ReportEvent.PLUGIN)


def helper(log: str) -> None:
    DispatchReport(Path(log)).emit(ReportEvent.PLUGIN)


@pytest.mark.timeout(120)
def test_a_spawned_process_without_a_title_gets_the_role_of_its_entry_function(
    tmp_path: Path,
) -> None:
    """SGLang calls load_plugins() (and sglang-fl writes its ``plugin`` record) before it names
    its scheduler process: the role then comes from the function the process was spawned to
    run."""
    context = multiprocessing.get_context("spawn")
    log = tmp_path / "log.jsonl"
    for target in (run_scheduler_process, run_detokenizer_process, helper):
        process = context.Process(target=target, args=(str(log),), name=f"Spawn-{target.__name__}")
        process.start()
        process.join(100)
        assert process.exitcode == 0
    roles = [(r["process"], r["role"]) for r in read_log(log)]
    assert roles == [
        ("Spawn-run_scheduler_process", "scheduler"),
        ("Spawn-run_detokenizer_process", "detokenizer"),
        ("Spawn-helper", "Spawn-helper"),
    ]


def _decision(op: str, *, denied: bool = False) -> Decision:
    """``op`` decided among the reference, a vendor whose probe says no and (with ``denied``)
    a vendor the deny list excludes."""
    registry = OpRegistry()
    contract = get_contract(op)
    offline = Availability(False, "chip: no device (driver not loaded)")
    registry.register_many(
        [
            OpImpl(op, f"reference.{op}", BackendImplKind.REFERENCE, contract.reference),
            OpImpl(op, f"vendor.chip.{op}", BackendImplKind.VENDOR, contract.reference,
                   vendor="chip", available=lambda: offline),
            OpImpl(op, f"vendor.other.{op}", BackendImplKind.VENDOR, contract.reference,
                   vendor="other"),
        ]
    )  # fmt: skip
    settings = Settings.from_environment({"SGLANG_FL_DENY_VENDORS": "other"} if denied else {})
    return resolve(op, registry, SelectionPolicy(settings), AvailabilityCache(timeout=10)).decision


def test_the_first_record_of_an_op_names_every_rejected_candidate_and_why() -> None:
    report = DispatchReport(None)
    decision = _decision("rms_norm", denied=True)
    fields = report.decision_fields(decision)
    assert fields["impl_id"] == "reference.rms_norm"
    assert fields["fallbacks"] == []
    reasons = {c["impl_id"]: (c["reason"], c["availability_reason"]) for c in fields["rejected"]}
    assert reasons["vendor.chip.rms_norm"] == (
        "unavailable: chip: no device (driver not loaded)",
        "chip: no device (driver not loaded)",
    )
    assert "deny" in reasons["vendor.other.rms_norm"][0].lower()
    assert fields["rejected"] == [
        c.to_dict() for c in decision.candidates if c.outcome is CandidateOutcome.REJECTED
    ]
    # Once per op and process: later records of the op (other layer classes) carry none.
    assert "rejected" not in report.decision_fields(decision)
    assert report.rejected_once(decision) == {}
    assert "rejected" in report.decision_fields(_decision("silu_and_mul"))
    assert report.rejected_once(None) == {}
