"""The attention ops' plan stage (``sglang_fl.ops.attention.plan``): what the default planner
computes, how graph-mode plans are updated in place, and how a plan crosses a custom op."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
import torch

from sglang_fl import graph
from sglang_fl.ops import STANDARD_OPS
from sglang_fl.ops.attention.common import build_pool
from sglang_fl.ops.attention.plan import (
    DEFAULT_PLANNER,
    HOST,
    REFERENCE_PLANNER,
    AttentionBatch,
    AttentionPlan,
    DefaultPlanner,
    ForwardKind,
    GraphMode,
    PlanCapacity,
    plan_fields,
)

CPU = torch.device("cpu")


def _pool(lens: tuple[int, ...], page_size: int, seed: int = 0) -> Any:
    return build_pool(
        lens,
        kv_heads=2,
        head_dim=8,
        v_head_dim=8,
        page_size=page_size,
        dtype=torch.float32,
        device=CPU,
        generator=torch.Generator().manual_seed(seed),
        spare_tokens=8,
    )


def _decode_batch(lens: tuple[int, ...], page_size: int) -> tuple[Any, AttentionBatch]:
    pool = _pool(lens, page_size)
    batch = AttentionBatch.decode(
        pool.req_to_token, pool.req_pool_indices, pool.seq_lens, page_size
    )
    return pool, batch


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_the_default_plan_addresses_each_requests_slots(page_size: int) -> None:
    pool, batch = _decode_batch((5, 17, 1), page_size)
    plan = DEFAULT_PLANNER.plan(batch)
    assert plan.page_table.dtype == torch.int32
    assert plan.page_table.is_contiguous()
    assert plan.page_table.shape == (3, -(-17 // page_size))
    assert plan.max_seqlen_k == plan.page_table.shape[1] * page_size
    assert plan.cache_seqlens.dtype == torch.int32
    assert plan.cache_seqlens.tolist() == [5, 17, 1]
    assert plan.seq_lens_host.tolist() == [5, 17, 1]
    assert plan.cu_seqlens_q.tolist() == [0, 1, 2, 3]
    assert plan.max_seqlen_q == 1
    paged = pool.k_cache.view(-1, page_size, 2, 8)
    for b, (row, length) in enumerate(zip(pool.req_pool_indices, pool.seq_lens, strict=True)):
        slots = pool.req_to_token[row, :length].long()
        pages = plan.page_table[b, : -(-int(length) // page_size)].long()
        assert torch.equal(paged[pages].reshape(-1, 2, 8)[:length], pool.k_cache[slots])


def test_an_extend_plan_has_cumulative_query_starts_and_its_longest_chunk() -> None:
    pool = _pool((9, 4), 1)
    prefix = torch.tensor([6, 0], dtype=torch.int32)
    extend = torch.tensor([3, 4], dtype=torch.int32)
    batch = AttentionBatch.extend(
        pool.req_to_token, pool.req_pool_indices, pool.seq_lens, prefix, extend
    )
    plan = DEFAULT_PLANNER.plan(batch)
    assert batch.num_tokens == 7
    assert plan.cu_seqlens_q.tolist() == [0, 3, 7]
    assert plan.max_seqlen_q == 4
    assert plan.extend_prefix_lens_host.tolist() == [6, 0]


def test_an_empty_batch_has_an_empty_plan() -> None:
    empty = torch.zeros(0, dtype=torch.int64)
    batch = AttentionBatch.decode(torch.zeros(2, 8, dtype=torch.int32), empty, empty, 4)
    plan = DEFAULT_PLANNER.plan(batch)
    assert plan.page_table.shape == (0, 0)
    assert plan.cu_seqlens_q.tolist() == [0]


def test_host_fields_are_marked_and_on_the_host() -> None:
    _, batch = _decode_batch((3, 2), 1)
    plan = DEFAULT_PLANNER.plan(batch)
    host = {name for name, _, on_host in plan_fields(plan) if on_host}
    assert host == {"seq_lens_host", "extend_prefix_lens_host", "extend_seq_lens_host"}
    assert plan.seq_lens_host.device.type == "cpu"
    assert dict(HOST) == {"sglang_fl_host": True}


def test_a_batch_refuses_device_host_lengths_and_a_bad_page_size() -> None:
    pool = _pool((3,), 1)
    with pytest.raises(ValueError, match="page_size must be at least 1"):
        AttentionBatch.decode(pool.req_to_token, pool.req_pool_indices, pool.seq_lens, 0)
    with pytest.raises(ValueError, match="an extend batch needs"):
        AttentionBatch(
            ForwardKind.EXTEND,
            pool.req_to_token,
            pool.req_pool_indices,
            pool.seq_lens,
            pool.seq_lens.cpu(),
        )


def _capacity(batch: AttentionBatch, max_batch: int) -> PlanCapacity:
    return PlanCapacity(
        ForwardKind.DECODE,
        max_batch,
        max_batch,
        batch.req_to_token.shape[1],
        batch.page_size,
        CPU,
    )


def test_a_graph_plan_is_updated_in_place_for_the_next_batch() -> None:
    """Allocated once; every update writes the same storages; the values are the batch's."""
    _, first = _decode_batch((5, 17, 1), 4)
    _, second = _decode_batch((9, 2, 12), 4)
    second = dataclasses.replace(second, req_to_token=first.req_to_token)
    buffers = DEFAULT_PLANNER.allocate(_capacity(first, 8))
    pointers = {
        name: value.untyped_storage().data_ptr()
        for name, value, _ in plan_fields(buffers)
        if isinstance(value, torch.Tensor) and value.numel()
    }
    for batch in (first, second):
        plan = DEFAULT_PLANNER.update(buffers, batch)
        DEFAULT_PLANNER.record(plan, batch)
        for name, value, _ in plan_fields(plan):
            if name in pointers:
                assert value.untyped_storage().data_ptr() == pointers[name], name
        eager = DEFAULT_PLANNER.plan(batch)
        assert torch.equal(plan.cache_seqlens, eager.cache_seqlens)
        assert torch.equal(plan.seq_lens_host, eager.seq_lens_host)
        assert plan.page_table.shape[1] >= eager.page_table.shape[1]
        width = eager.page_table.shape[1]
        for row, length in enumerate(batch.seq_lens_host.tolist()):
            pages = -(-length // 4)
            assert torch.equal(plan.page_table[row, :pages], eager.page_table[row, :pages])
        assert plan.page_table.shape[1] - width >= 0


def test_a_graph_plan_refuses_what_its_capacity_cannot_hold() -> None:
    _, batch = _decode_batch((5, 17, 1), 4)
    buffers = DEFAULT_PLANNER.allocate(_capacity(batch, 2))
    with pytest.raises(ValueError, match="exceeds the plan's capacity of 2"):
        DEFAULT_PLANNER.update(buffers, batch)
    with pytest.raises(ValueError, match="graph-mode plans are made for decode"):
        DEFAULT_PLANNER.allocate(dataclasses.replace(_capacity(batch, 4), kind=ForwardKind.EXTEND))


def test_graph_modes_each_planner_declares() -> None:
    assert DEFAULT_PLANNER.graph_problem(GraphMode.COMPILED) is None
    assert "declares nothing about device graphs" in str(
        DEFAULT_PLANNER.graph_problem(GraphMode.CAPTURED)
    )
    assert "loops over the requests" in str(REFERENCE_PLANNER.graph_problem(GraphMode.CAPTURED))
    assert DefaultPlanner({}).graph_problem(GraphMode.CAPTURED) is None


# --- a plan across a custom op --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class VendorPlan(AttentionPlan):
    """A vendor's plan: the default fields and its own (a tensor and a plain value)."""

    workspace: torch.Tensor | None = None
    splits: int = 1


def test_a_plan_type_splits_into_tensors_and_plain_values() -> None:
    layout = graph.plan_layout(VendorPlan)
    assert "workspace" in layout.tensor_fields
    assert "page_table" in layout.tensor_fields
    assert layout.value_fields == ("page_size", "max_seqlen_q", "max_seqlen_k", "splits")


def test_a_plan_field_of_another_type_cannot_cross() -> None:
    @dataclasses.dataclass(frozen=True)
    class Opaque(AttentionPlan):
        wrapper: object = None

    with pytest.raises(TypeError, match="field 'wrapper'"):
        graph.plan_layout(Opaque)


def test_the_schema_takes_a_plan_as_three_arguments() -> None:
    schema = graph.graph_op("decode_attention").schema()
    assert schema.endswith(
        "Tensor q, Tensor k_cache, Tensor v_cache, str plan_type, Tensor?[] plan_tensors, "
        "Scalar[] plan_values) -> Tensor"
    )


def _decode_inputs() -> Any:
    contract = STANDARD_OPS["decode_attention"]
    case = next(c for c in contract.cases if c.params["page_size"] == 4)
    return contract.make_inputs(case, torch.float32, CPU, torch.Generator().manual_seed(3))


def test_a_compiled_decode_call_gets_the_vendor_plan_rebuilt_and_recompiles_on_nothing_else() -> (
    None
):
    """fullgraph: one custom op; the kernel receives its own plan type with every field; the
    next batch's plan (same shapes, other values) reuses the compiled graph."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    seen: list[Any] = []
    reference = STANDARD_OPS["decode_attention"].reference

    def kernel(obj: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Any) -> Any:
        seen.append(plan)
        return reference(obj, q, k, v, plan)

    routed = graph.graph_safe("decode_attention", kernel, "test.vendor_plan")
    inputs = _decode_inputs()
    q, k_cache, v_cache, plan = inputs.args
    vendor = VendorPlan(**{f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)})
    vendor = dataclasses.replace(vendor, workspace=torch.zeros(3), splits=2)

    def step(q: torch.Tensor, plan: Any) -> torch.Tensor:
        return routed(inputs.obj, q * 1.0, k_cache, v_cache, plan) + 0.0

    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    want = step(q, vendor)
    graphs = counters["stats"]["unique_graphs"]
    got = compiled(q, vendor)
    assert torch.equal(got, want)
    rebuilt = seen[-1]
    assert type(rebuilt) is VendorPlan
    assert rebuilt.splits == 2
    assert torch.equal(rebuilt.workspace, vendor.workspace)
    assert torch.equal(rebuilt.page_table, vendor.page_table)
    # The next step: new tensor values (lengths on the host too), the same shapes.
    shifted = dataclasses.replace(
        vendor,
        seq_lens_host=vendor.seq_lens_host.flip(0).clone(),
        cache_seqlens=vendor.cache_seqlens.flip(0).clone(),
        req_pool_indices=vendor.req_pool_indices.flip(0).clone(),
        seq_lens=vendor.seq_lens.flip(0).clone(),
    )
    assert torch.equal(compiled(q, shifted), step(q, shifted))
    assert counters["stats"]["unique_graphs"] == graphs + 1


# --- pre-plan signatures ---------------------------------------------------------------------


def test_a_pre_plan_kernel_is_adapted_and_reads_the_default_plan() -> None:
    calls: list[tuple[Any, ...]] = []

    def old_decode(obj, q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, page_size=1):
        calls.append((req_to_token, req_pool_indices, seq_lens, page_size))
        return q.new_zeros(q.shape)

    stage = STANDARD_OPS["decode_attention"].plan_stage
    adapted = stage.adapt_legacy(old_decode)
    assert adapted is not None
    assert list(inspect.signature(adapted).parameters) == ["obj", "q", "k_cache", "v_cache", "plan"]
    inputs = _decode_inputs()
    adapted(inputs.obj, *inputs.args)
    plan = inputs.args[-1]
    assert calls == [(plan.req_to_token, plan.req_pool_indices, plan.seq_lens, plan.page_size)]
    assert stage.adapt_legacy(lambda obj, x: x) is None
