"""Planned ops (the attention ops) as vendors register them and as the conformance kit checks
them: planners, pre-plan signatures, and per-layer calls that read a device value on the host."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from sglang_fl.dispatch.backends import Backend
from sglang_fl.dispatch.registry import OpRegistry
from sglang_fl.dispatch.types import BackendImplKind, OpImpl
from sglang_fl.errors import RegistrationError
from sglang_fl.ops import STANDARD_OPS
from sglang_fl.ops.attention.legacy import LEGACY_PLANNER
from sglang_fl.ops.attention.plan import (
    DEFAULT_PLANNER,
    AttentionBatch,
    AttentionPlan,
    DefaultPlanner,
    GraphMode,
    PlanCapacity,
)
from sglang_fl.testing.checks import FAILED, PASSED, check_case, check_plan

DECODE = STANDARD_OPS["decode_attention"]
EXTEND = STANDARD_OPS["extend_attention"]
REFERENCE = DECODE.reference


def vendor(fn: Any, op: str = "decode_attention", planner: Any = None) -> OpImpl:
    return OpImpl(op, "vendor.acme", BackendImplKind.VENDOR, fn, vendor="acme", planner=planner)


def registered(impl: OpImpl) -> OpImpl:
    registry = OpRegistry()
    registry.register(impl)
    (kept,) = registry.implementations(impl.op_name)
    return kept


# --- registration ----------------------------------------------------------------------------


def test_an_implementation_without_a_planner_gets_the_default_one() -> None:
    assert registered(vendor(REFERENCE)).planner is DEFAULT_PLANNER


def test_a_planner_is_kept() -> None:
    mine = DefaultPlanner({})
    assert registered(vendor(REFERENCE, planner=mine)).planner is mine


def test_a_planner_that_is_not_one_is_refused() -> None:
    with pytest.raises(RegistrationError, match="expected an AttentionPlanner"):
        registered(vendor(REFERENCE, planner=object()))


def test_an_op_without_a_plan_stage_takes_no_planner() -> None:
    impl = OpImpl(
        "silu_and_mul",
        "vendor.acme",
        BackendImplKind.VENDOR,
        STANDARD_OPS["silu_and_mul"].reference,
        vendor="acme",
        planner=DEFAULT_PLANNER,
    )
    with pytest.raises(RegistrationError, match="only planned ops take one"):
        registered(impl)


def old_decode(obj, q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, page_size=1):
    """A kernel written before plans: lengths read on the host in every call."""
    from sglang_fl.ops.attention.common import attend

    out = q.new_empty((q.shape[0], q.shape[1], v_cache.shape[-1]))
    for i, (row, length) in enumerate(
        zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)
    ):
        slots = req_to_token[row, :length].long()
        keys, values = k_cache[slots].movedim(0, 1), v_cache[slots].movedim(0, 1)
        out[i] = attend(
            q[i : i + 1].movedim(0, 1),
            keys.to(q.dtype),
            values.to(q.dtype),
            mask=None,
            causal=False,
            scale=obj.scaling,
            logit_cap=0.0,
        ).movedim(1, 0)[0]
    return out


def test_a_kernel_written_before_plans_still_registers_and_computes() -> None:
    kept = registered(vendor(old_decode))
    assert kept.planner is LEGACY_PLANNER
    assert "before plans" in str(kept.planner.graph_problem(GraphMode.CAPTURED))
    case = next(c for c in DECODE.cases if c.params["option"] == "plain")
    outcome = check_case(kept, case, torch.float32)
    # Its values are right; the kit says it reads lengths on the host per layer.
    assert outcome.status is FAILED
    assert "reads a device value on the host" in outcome.message
    assert "max abs error" not in outcome.message


def test_a_planner_for_a_pre_plan_signature_is_refused() -> None:
    with pytest.raises(RegistrationError, match="signature from before plans"):
        registered(vendor(old_decode, planner=DEFAULT_PLANNER))


def test_a_backend_hands_its_planner_to_the_planned_ops_only() -> None:
    class Acme(Backend):
        name = "acme"

        def is_available(self) -> bool:
            return True

    mine = DefaultPlanner({})
    impls = Acme().implementations(
        {"decode_attention": REFERENCE, "silu_and_mul": STANDARD_OPS["silu_and_mul"].reference},
        planner=mine,
    )
    assert [i.planner for i in impls] == [mine, None]


# --- the kit: per-layer calls ----------------------------------------------------------------


def _planted(read: str) -> Any:
    def decode(obj: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Any) -> Any:
        if read == "item":
            int(plan.seq_lens.max().item())
        elif read == "tolist":
            plan.cache_seqlens.tolist()
        elif read == "nonzero":
            plan.seq_lens.nonzero()
        elif read == "numpy":
            plan.page_table.numpy()
        return REFERENCE(obj, q, k, v, plan)

    decode.__name__ = f"decode_with_{read}"
    return decode


@pytest.mark.parametrize("read", ["item", "tolist", "nonzero", "numpy"])
def test_the_kit_fails_a_per_layer_host_read(read: str) -> None:
    case = DECODE.cases[0]
    outcome = check_case(vendor(_planted(read)), case, torch.float32)
    assert outcome.status is FAILED, outcome.message
    assert "reads a device value on the host" in outcome.message
    assert "test_planned_ops.py" in outcome.message  # where it happened


def test_host_fields_of_the_plan_may_be_read() -> None:
    def decode(obj: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Any) -> Any:
        assert plan.seq_lens_host.tolist() == plan.seq_lens_host.tolist()
        return REFERENCE(obj, q, k, v, plan)

    for dtype in DECODE.dtypes:
        for case in DECODE.cases:
            assert check_case(vendor(decode), case, dtype).status is PASSED


class CExtensionLike:
    """A kernel fake tensors cannot run (it insists on real storage), which also reads a
    device value: the kit runs it for real and still catches the read."""

    def __init__(self, read: bool) -> None:
        self.read = read

    def __call__(self, obj: Any, q: torch.Tensor, k: Any, v: Any, plan: Any) -> Any:
        from torch._subclasses.fake_tensor import FakeTensor

        if isinstance(q, FakeTensor):
            raise RuntimeError("no fake implementation for this kernel")
        if self.read:
            plan.cache_seqlens.max().item()
        return REFERENCE(obj, q, k, v, plan)


@pytest.mark.parametrize(("read", "status"), [(True, FAILED), (False, PASSED)])
def test_a_kernel_fake_tensors_cannot_run_is_watched_for_real(read: bool, status: Any) -> None:
    outcome = check_case(vendor(CExtensionLike(read)), DECODE.cases[0], torch.float32)
    assert outcome.status is status, outcome.message


def test_the_extend_call_is_checked_too() -> None:
    def extend(obj: Any, q: torch.Tensor, k: Any, v: Any, plan: Any) -> Any:
        plan.extend_seq_lens.tolist()
        return EXTEND.reference(obj, q, k, v, plan)

    outcome = check_case(vendor(extend, "extend_attention"), EXTEND.cases[0], torch.float32)
    assert outcome.status is FAILED
    assert "reads a device value on the host" in outcome.message


# --- the kit: planners -----------------------------------------------------------------------


@pytest.mark.parametrize("op", [DECODE, EXTEND], ids=lambda c: c.name)
def test_the_default_planner_passes_its_plan_checks(op: Any) -> None:
    for case in op.cases:
        outcome = check_plan(vendor(op.reference, op.name), case)
        assert outcome.status is PASSED, outcome.message


class FreshBuffers(DefaultPlanner):
    """Claims graph modes but makes new tensors at every update: a captured step would keep
    reading the first batch's."""

    def __init__(self) -> None:
        super().__init__({})

    def update(self, plan: AttentionPlan, batch: AttentionBatch) -> AttentionPlan:
        return self.plan(batch)

    def record(self, plan: AttentionPlan, batch: AttentionBatch) -> None:
        pass


class WrongTable(DefaultPlanner):
    """Plans a page table off by one page."""

    def plan(self, batch: AttentionBatch) -> AttentionPlan:
        plan = super().plan(batch)
        return dataclasses.replace(plan, page_table=plan.page_table + 1)


class NotAPlan(DefaultPlanner):
    def plan(self, batch: AttentionBatch) -> Any:
        return {"page_table": None}


@pytest.mark.parametrize(
    ("planner", "problem"),
    [
        (FreshBuffers(), "update() moved"),
        (WrongTable(), "page_table row 0 does not list"),
        (NotAPlan(), "not an AttentionPlan"),
    ],
    ids=["fresh-buffers", "wrong-table", "not-a-plan"],
)
def test_the_kit_fails_a_wrong_planner(planner: Any, problem: str) -> None:
    case = next(c for c in DECODE.cases if len(c.params["seq_lens"]) > 1)
    outcome = check_plan(vendor(REFERENCE, planner=planner), case)
    assert outcome.status is FAILED
    assert problem in outcome.message


def test_the_plan_checks_are_planned_for_each_case() -> None:
    from sglang_fl.testing.checks import _impl_checks

    ids = [check.id for check in _impl_checks(vendor(REFERENCE), "acme/decode_attention", "cpu")]
    assert sum("/plan/" in i for i in ids) == len(DECODE.cases)


def test_capacity_pages_cover_the_context() -> None:
    capacity = PlanCapacity(
        DECODE.plan_stage.kind, 4, 4, max_context=17, page_size=4, device=torch.device("cpu")
    )
    assert capacity.max_pages == 5
