"""The torch_npu attention adapters against the ``torch_npu`` double (no NPU, no torch-npu).

Every case and dtype of ``store_kv_cache``, ``decode_attention`` and ``extend_attention`` runs
through core's conformance check; the contracts' page sizes (1, 4, 16) sit below BSND's prefill
block size (multiples of 128), so extend is also checked against the reference at SGLang's NPU
page size, 128, in TND (head size 128) and per request in BSND (head size 64). Then the calls
themselves (PagedAttention and FIA decode, TND and BSND extend) and every refusal, each before
any operator call.

Both attention ops take the forward's plan (core's default planner, as the backend hands it);
the kit reruns each served call on fake tensors to find host reads of device values, which the
double's kernels (custom ops with fake implementations) let through only where the adapters
read host lengths, so a planted device read still fails.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest
import torch
from attention_calls import decode as fia_decode_call
from attention_calls import extend as fia_extend_call
from attention_calls import t
from sglang_fl_ascend import plugin
from sglang_fl_ascend.backend import TORCH_NPU
from sglang_fl_ascend.impl.attention import decode_attention, extend_attention, store_kv_cache
from torch._subclasses.fake_tensor import FakeTensor
from torch_npu_double import TorchNpuDouble

from sglang_fl import Unsupported
from sglang_fl.ops import STANDARD_OPS, OpCase
from sglang_fl.ops.attention import NO_WINDOW, attention_layer
from sglang_fl.ops.attention.cases import Option
from sglang_fl.ops.attention.common import build_pool
from sglang_fl.ops.attention.plan import ForwardKind, PlanCapacity
from sglang_fl.testing.checks import FAILED, PASSED, SKIPPED, check_case, check_plan
from sglang_fl.testing.doubles import Call, ConstraintViolation, install_double
from sglang_fl.testing.vendor import VendorSuite
from sglang_fl.types import AttentionBatch, AttentionPlan, DefaultPlanner, GraphMode

SUITE = VendorSuite("ascend", plugin.sglang_fl_register_ops)
IMPLS = SUITE.implementations
ATTENTION = ("store_kv_cache", "decode_attention", "extend_attention")
CASES = [param for param in SUITE.contract_cases() if param.values[0] in ATTENTION]
TND = {(128, 128), (192, 128), (192, 192)}
BF16 = {"atol": 1.6e-2, "rtol": 1.6e-2}


def tnd(p: Mapping[str, Any]) -> bool:
    """FIA's TND on A2/A3: those head sizes, blocks in multiples of 16 up to 1024."""
    return (p["head_dim"], p["v_head_dim"]) in TND and p["page_size"] % 16 == 0


def declined(op: str, p: Mapping[str, Any], dtype: torch.dtype) -> bool:
    """float16/bfloat16 only; no soft-cap in either operator. Decode: PagedAttention takes
    16-aligned blocks up to 128 and any head sizes, FIA one head size for key and value and
    16-aligned blocks up to 512. Extend: TND, else per request in BSND (one head size; blocks
    of 128..512 in multiples of 128 when a request has several new tokens, 16-aligned when
    every request has one)."""
    if dtype == torch.float32:
        return True
    if op == "store_kv_cache":
        return False
    if p["option"] is Option.SOFTCAP:
        return True
    one_head_dim = p["v_head_dim"] == p["head_dim"]
    if op == "decode_attention":
        return p["page_size"] % 16 != 0
    if tnd(p):
        return False
    several = any(ext > 1 for _, ext in p["batch"])
    return (
        not one_head_dim
        or (several and p["page_size"] % 128 != 0)
        or (not several and p["page_size"] % 16 != 0)
    )


def operator_calls(op: str, p: Mapping[str, Any]) -> int:
    """Operator calls of a served call: one, or in BSND one per request with new tokens."""
    if op == "store_kv_cache":
        return int(p["tokens"] > 0)
    if op == "decode_attention":
        return int(len(p["seq_lens"]) > 0)
    requests = sum(1 for _, ext in p["batch"] if ext)
    return min(requests, 1) if tnd(p) else requests


def on_fake_tensors(call: Call) -> bool:
    """Whether ``call`` came from the kit's rerun on fake tensors (its host-read check)."""
    values = (*call.args, *call.kwargs.values())
    return any(isinstance(value, FakeTensor) for value in values)


def test_the_attention_cases_are_all_collected() -> None:
    assert {param.values[0] for param in CASES} == set(ATTENTION)


@pytest.mark.parametrize(("op", "case", "dtype"), CASES)
def test_contract_case(
    torch_npu: TorchNpuDouble, op: str, case: OpCase, dtype: torch.dtype
) -> None:
    outcome = check_case(IMPLS[op], case, dtype)
    expected = SKIPPED if declined(op, case.params, dtype) else PASSED
    assert outcome.status == expected, outcome.message
    # None for a declined or an empty call. The planned ops' calls run again on fake tensors
    # (the host-read check), reaching the double's operators as they would an NPU's.
    served = operator_calls(op, case.params) if expected == PASSED else 0
    faked = [call for call in torch_npu.calls if on_fake_tensors(call)]
    assert len(torch_npu.calls) - len(faked) == served
    assert len(faked) == (served if op != "store_kv_cache" else 0)


def decode_plan(
    req_to_token: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor, page_size: int
) -> AttentionPlan:
    """The forward's plan the backend hands the adapters (they supply no planner)."""
    return DefaultPlanner().plan(AttentionBatch.decode(req_to_token, rows, seq_lens, page_size))


def extend_plan(
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    seq_lens: torch.Tensor,
    prefix: torch.Tensor,
    extend: torch.Tensor,
    page_size: int,
) -> AttentionPlan:
    batch = AttentionBatch.extend(req_to_token, rows, seq_lens, prefix, extend, page_size)
    return DefaultPlanner().plan(batch)


def test_the_adapters_take_the_default_plan_and_claim_no_device_graphs() -> None:
    """The operators take their lengths from the host (FIA's lists, PagedAttention's CPU
    context_lens), which a recorded NPU graph would replay unchanged; compiled, each call runs
    afresh."""
    for op in ("decode_attention", "extend_attention"):
        planner = IMPLS[op].planner
        assert type(planner) is DefaultPlanner
        assert planner.graph_problem(GraphMode.COMPILED) is None
        assert planner.graph_problem(GraphMode.CAPTURED)


@pytest.mark.parametrize(("op", "case"), SUITE.plan_cases())
def test_plan(torch_npu: TorchNpuDouble, op: str, case: OpCase) -> None:
    """The default planner's plan (the adapters bring none) and, as it claims torch.compile,
    its graph-mode plan updated in place for the next batch."""
    outcome = check_plan(IMPLS[op], case)
    assert outcome.status == PASSED, outcome.message


def served_case(op: str, operator: str) -> OpCase:
    """The first bfloat16 contract case of ``op`` whose non-empty batch ``operator`` serves."""
    dtype = torch.bfloat16
    for param in CASES:
        name, case, case_dtype = param.values
        p = case.params
        if name != op or case_dtype != dtype or declined(op, p, dtype):
            continue
        if operator_calls(op, p) == 0:
            continue
        if operator == "_npu_paged_attention" and (
            p["page_size"] % 16 or p["option"] is Option.WINDOW
        ):
            continue
        if operator != "_npu_paged_attention" and p["head_dim"] != p["v_head_dim"]:
            continue
        assert isinstance(case, OpCase)
        return case
    raise AssertionError(f"no served case of {op} on {operator}")


def reading(adapter: Any, field: str) -> Any:
    """``adapter`` with a planted host read of the plan's device ``field``."""

    def planted(obj: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Any) -> Any:
        getattr(plan, field).tolist()
        return adapter(obj, q, k, v, plan)

    return planted


@pytest.mark.parametrize(
    ("op", "fia", "field"),
    [
        ("decode_attention", False, "seq_lens"),
        ("decode_attention", False, "page_table"),
        ("decode_attention", True, "seq_lens"),
        ("extend_attention", False, "extend_seq_lens"),
    ],
    ids=["paged-seq_lens", "paged-page_table", "fia-seq_lens", "extend-extend_seq_lens"],
)
def test_the_kit_still_fails_a_planted_host_read(
    monkeypatch: pytest.MonkeyPatch, op: str, fia: bool, field: str
) -> None:
    """The double's kernels hide only the reads an NPU does inside its operators: an adapter
    that reads a device value of the plan itself fails, naming the line."""
    if fia:
        monkeypatch.setenv("ASCEND_USE_FIA", "1")
    torch_npu = install_double(monkeypatch, TorchNpuDouble(), TORCH_NPU)
    on_fia = fia or op == "extend_attention"
    operator = "npu_fused_infer_attention_score" if on_fia else "_npu_paged_attention"
    case = served_case(op, operator)
    honest = check_case(IMPLS[op], case, torch.bfloat16)
    assert honest.status == PASSED, honest.message
    planted = dataclasses.replace(IMPLS[op], fn=reading(IMPLS[op].fn, field))
    outcome = check_case(planted, case, torch.bfloat16)
    assert outcome.status == FAILED, outcome.message
    assert "reads a device value on the host" in outcome.message
    assert "test_attention.py" in outcome.message
    assert set(torch_npu.called) == {operator}


def pool(
    seq_lens: tuple[int, ...],
    *,
    page_size: int,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 64,
    v_head_dim: int = 64,
    tokens: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    kv = build_pool(
        seq_lens,
        kv_heads=kv_heads,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        page_size=page_size,
        dtype=dtype,
        device=torch.device("cpu"),
        generator=g,
    )
    n = len(seq_lens) if tokens is None else tokens
    q = torch.randn(n, heads + 2 * kv_heads, head_dim, generator=g).to(dtype)[:, :heads]
    return q, kv.k_cache, kv.v_cache, kv.req_to_token, kv.req_pool_indices, kv.seq_lens


# -- extend ---------------------------------------------------------------------------------------

EXTEND_LAYERS = {
    "causal": attention_layer(scaling=0.125),
    "window": attention_layer(scaling=0.125, sliding_window_size=40),
    "noncausal": attention_layer(scaling=0.3, is_causal=False),
}
# A prefill, a radix hit over two pages and a one-token extend, in blocks of 128.
NPU_BATCH = ((0, 70), (150, 30), (200, 1))
BAND = {"causal": (3, 2147483647), "window": (4, 40), "noncausal": (0, 2147483647)}


def extend_at_npu_page_size(
    layer: Any, dtype: torch.dtype, head_dim: int, v_head_dim: int | None = None
) -> tuple[torch.Tensor, tuple[Any, ...]]:
    """``extend_attention`` at page size 128 checked against the reference; its arguments."""
    seq_lens = tuple(pre + ext for pre, ext in NPU_BATCH)
    args6 = pool(
        seq_lens,
        page_size=128,
        tokens=101,
        dtype=dtype,
        head_dim=head_dim,
        v_head_dim=v_head_dim or head_dim,
    )
    q, k_cache, v_cache, req_to_token, rows, lens = args6
    prefix = torch.tensor([pre for pre, _ in NPU_BATCH], dtype=torch.int32)
    extend = torch.tensor([ext for _, ext in NPU_BATCH], dtype=torch.int32)
    args = (q, k_cache, v_cache, extend_plan(req_to_token, rows, lens, prefix, extend, 128))
    out = extend_attention(layer, *args)
    expected = STANDARD_OPS["extend_attention"].reference(layer, *args)
    tolerance = STANDARD_OPS["extend_attention"].tolerance(dtype)
    torch.testing.assert_close(out, expected, atol=tolerance.atol, rtol=tolerance.rtol)
    return out, args


@pytest.mark.parametrize("kind", EXTEND_LAYERS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tnd_extend_at_npu_page_size_matches_the_reference(
    torch_npu: TorchNpuDouble, kind: str, dtype: torch.dtype
) -> None:
    """Head size 128: one TND call for the whole batch."""
    _, (q, k_cache, _, plan) = extend_at_npu_page_size(EXTEND_LAYERS[kind], dtype, 128)
    ((name, (query, key, _), kw),) = torch_npu.calls
    assert name == "npu_fused_infer_attention_score"
    assert query.is_contiguous()  # the strided q, packed
    assert torch.equal(query, q)
    assert key.shape == (k_cache.shape[0] // 128, 128, 2 * 128)
    assert key.data_ptr() == k_cache.data_ptr()
    assert kw["input_layout"] == "TND"
    assert kw["actual_seq_lengths"] == [70, 100, 101]
    assert kw["actual_seq_lengths_kv"] == [70, 180, 201]
    assert kw["block_table"] is plan.page_table  # the forward's, not rebuilt per layer
    assert kw["block_table"].dtype == torch.int32
    assert (kw["sparse_mode"], kw["pre_tokens"]) == BAND[kind]
    assert (kw["atten_mask"] is None) is (kind == "noncausal")


@pytest.mark.parametrize("kind", EXTEND_LAYERS)
def test_bsnd_extend_per_request_where_tnd_does_not_hold(
    torch_npu: TorchNpuDouble, kind: str
) -> None:
    """Head size 64 (Llama-3.2-1B): TND needs 128 (or 192) on A2/A3, so each request runs
    alone in BSND, as SGLang's forward_extend does when _can_use_tnd is false."""
    layer = EXTEND_LAYERS[kind]
    _, (q, _, _, plan) = extend_at_npu_page_size(layer, torch.bfloat16, 64)
    calls = torch_npu.calls
    assert [call.kwargs["input_layout"] for call in calls] == ["BSND"] * 3
    assert [call.kwargs["actual_seq_lengths"] for call in calls] == [[70], [30], [1]]
    assert [call.kwargs["actual_seq_lengths_kv"] for call in calls] == [[70], [180], [201]]
    query = calls[1].args[0]
    assert query.shape == (1, 30, 4, 64)
    assert query.is_contiguous()
    assert torch.equal(query[0], q[70:100])
    assert all(call.kwargs["block_table"].shape[0] == 1 for call in calls)
    # Each request's row of the forward's page table (a view, not a copy).
    assert all(
        call.kwargs["block_table"].data_ptr() == plan.page_table[row].data_ptr()
        for row, call in enumerate(calls)
    )
    # Several tokens: the causal/band/non-causal mode; one token: no mode, a window as a mask.
    assert (calls[0].kwargs["sparse_mode"], calls[0].kwargs["pre_tokens"]) == BAND[kind]
    last = calls[2].kwargs
    assert last["sparse_mode"] == 0
    if kind == "window":
        mask = last["atten_mask"]
        assert mask.shape == (1, 256)
        assert mask.dtype == torch.bool
        assert (~mask[0]).nonzero().flatten().tolist() == list(range(160, 201))
    else:
        assert last["atten_mask"] is None


def test_tnd_takes_a_192_key_head_with_a_128_value_head(torch_npu: TorchNpuDouble) -> None:
    out, _ = extend_at_npu_page_size(EXTEND_LAYERS["causal"], torch.bfloat16, 192, 128)
    ((_, (_, key, value), kw),) = torch_npu.calls
    assert kw["input_layout"] == "TND"
    assert key.shape[-1] == 2 * 192
    assert value.shape[-1] == 2 * 128
    assert out.shape == (101, 4, 128)


@pytest.mark.parametrize("version", ["2.7.1", "2.8.0.post1", "2.6.0.post4", "2.5.1"])
def test_before_7_3_0_tnd_is_left_for_one_bsnd_call_per_request(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """The op-plugin 7.1.0/7.2.0 pages' TND takes no PageAttention: a 7.2.0 build (or older)
    extends per request in BSND, where TND holds on a 7.3.0 build; the double refuses TND."""
    torch_npu = install_double(monkeypatch, TorchNpuDouble(version=version), TORCH_NPU)
    extend_at_npu_page_size(EXTEND_LAYERS["causal"], torch.bfloat16, 128)
    assert [call.kwargs["input_layout"] for call in torch_npu.calls] == ["BSND"] * 3
    with pytest.raises(ConstraintViolation, match="TND with PageAttention only from"):
        fia_extend_call()(torch_npu)


@pytest.mark.parametrize("page_size", [16, 1024])
def test_tnd_takes_blocks_in_multiples_of_16_up_to_1024(
    torch_npu: TorchNpuDouble, page_size: int
) -> None:
    q, k_cache, v_cache, req_to_token, rows, lens = pool(
        (40, 9), page_size=page_size, tokens=49, head_dim=128, v_head_dim=128
    )
    plan = extend_plan(
        req_to_token, rows, lens, torch.tensor([0, 0]), torch.tensor([40, 9]), page_size
    )
    args = (q, k_cache, v_cache, plan)
    layer = attention_layer(scaling=0.1)
    out = extend_attention(layer, *args)
    torch.testing.assert_close(
        out, STANDARD_OPS["extend_attention"].reference(layer, *args), **BF16
    )
    ((_, _, kw),) = torch_npu.calls
    assert (kw["input_layout"], kw["block_size"]) == ("TND", page_size)


def test_the_causal_mask_is_built_once_per_device(torch_npu: TorchNpuDouble) -> None:
    q, k_cache, v_cache, req_to_token, rows, lens = pool(
        (3,), page_size=128, tokens=3, head_dim=128, v_head_dim=128
    )
    plan = extend_plan(req_to_token, rows, lens, torch.tensor([0]), torch.tensor([3]), 128)
    layer = attention_layer(scaling=0.1)
    for _ in range(2):
        extend_attention(layer, q, k_cache, v_cache, plan)
    first, second = (call.kwargs["atten_mask"] for call in torch_npu.calls)
    assert first is second
    assert first.shape == (2048, 2048)
    assert bool(first[0, 1])  # True above the diagonal: masked
    assert not bool(first[1, 0])


# -- decode ---------------------------------------------------------------------------------------


def decode(
    layer: Any, page_size: int, *, head_dim: int = 64, v_head_dim: int = 64
) -> tuple[torch.Tensor, tuple[Any, ...]]:
    """``decode_attention`` of 2 requests (5 and 40 tokens), checked against the reference;
    its ``q``, caches, request table, rows and plan."""
    q, k_cache, v_cache, req_to_token, rows, lens = pool(
        (5, 40), page_size=page_size, head_dim=head_dim, v_head_dim=v_head_dim
    )
    plan = decode_plan(req_to_token, rows, lens, page_size)
    out = decode_attention(layer, q, k_cache, v_cache, plan)
    expected = STANDARD_OPS["decode_attention"].reference(layer, q, k_cache, v_cache, plan)
    torch.testing.assert_close(out, expected, **BF16)
    return out, (q, k_cache, v_cache, req_to_token, rows, plan)


def test_decode_is_sglang_s_default_paged_attention(torch_npu: TorchNpuDouble) -> None:
    out, (q, k_cache, _, req_to_token, rows, plan) = decode(attention_layer(scaling=0.2), 16)
    ((name, _, kw),) = torch_npu.calls
    assert name == "_npu_paged_attention"
    assert kw["block_table"] is plan.page_table  # the forward's, not rebuilt per layer
    assert kw["query"].shape == (2, 4, 64)
    assert kw["query"].is_contiguous()
    assert torch.equal(kw["query"], q)
    assert kw["key_cache"].shape == (k_cache.shape[0] // 16, 16, 2, 64)
    assert kw["key_cache"].data_ptr() == k_cache.data_ptr()
    expected_table = (req_to_token[rows, :40][:, ::16] // 16).to(torch.int32)
    assert torch.equal(kw["block_table"], expected_table)
    assert kw["context_lens"].tolist() == [5, 40]
    assert kw["context_lens"].dtype == torch.int32
    assert kw["context_lens"].device.type == "cpu"
    assert (kw["num_heads"], kw["num_kv_heads"], kw["scale_value"]) == (4, 2, 0.2)
    assert kw["out"] is out


def test_paged_attention_takes_a_value_head_of_its_own(torch_npu: TorchNpuDouble) -> None:
    """FIA needs one head size for key and value; ATB PagedAttention does not."""
    out, _ = decode(attention_layer(scaling=0.2), 16, head_dim=96, v_head_dim=64)
    assert torch_npu.called == ["_npu_paged_attention"]
    assert out.shape == (2, 4, 64)


def test_with_ascend_use_fia_decode_calls_the_bsh_page_attention(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ASCEND_USE_FIA", "1")
    torch_npu = install_double(monkeypatch, TorchNpuDouble(), TORCH_NPU)
    out, (_, k_cache, _, req_to_token, rows, plan) = decode(attention_layer(scaling=0.2), 16)
    ((name, (query, key, value), kw),) = torch_npu.calls
    assert name == "npu_fused_infer_attention_score"
    assert kw["block_table"] is plan.page_table
    assert query.shape == (2, 1, 4 * 64)
    assert key.shape == value.shape == (k_cache.shape[0] // 16, 16, 2 * 64)
    expected_table = (req_to_token[rows, :40][:, ::16] // 16).to(torch.int32)
    assert torch.equal(kw["block_table"], expected_table)
    assert kw["actual_seq_lengths_kv"] == [5, 40]
    assert (kw["num_heads"], kw["num_key_value_heads"], kw["block_size"]) == (4, 2, 16)
    assert (kw["input_layout"], kw["scale"]) == ("BSH", 0.2)
    assert kw["atten_mask"] is None
    assert out.shape == (2, 4, 64)


@pytest.mark.parametrize("page_size", [144, 512])
def test_fia_decode_takes_blocks_of_16_up_to_512(torch_npu: TorchNpuDouble, page_size: int) -> None:
    """At one query token FIA takes float16/bfloat16 blocks in multiples of 16 up to 512:
    PagedAttention declines those over 128, FIA serves them."""
    decode(attention_layer(scaling=0.2), page_size)
    assert torch_npu.called == ["npu_fused_infer_attention_score"]
    assert torch_npu.calls[0].kwargs["block_size"] == page_size


@pytest.mark.parametrize("page_size", [1, 8])
def test_decode_declines_blocks_not_16_aligned(torch_npu: TorchNpuDouble, page_size: int) -> None:
    """Neither operator takes them: PagedAttention's '因硬件限制' and FIA's Q_S = 1 rule
    ("the block_size must be a multiple of 16" for float16/bfloat16 K/V)."""
    with pytest.raises(Unsupported, match=r"block_size % 16 == 0.*non-zero multiple of 16"):
        decode(attention_layer(scaling=0.2), page_size)
    assert torch_npu.calls == []
    unaligned = fia_decode_call(  # and the double refuses the call FIA would
        block_size=8,
        key=t(6, 8, 128),
        value=t(6, 8, 128),
        block_table=torch.tensor([[2, 0, 3], [0, 1, 4]], dtype=torch.int32),
    )
    with pytest.raises(ConstraintViolation, match="one query token a non-zero multiple of 16"):
        unaligned(torch_npu)


@pytest.mark.parametrize("page_size", [16, 32])
def test_a_window_decodes_on_fia_with_sglang_s_swa_mask(
    torch_npu: TorchNpuDouble, page_size: int
) -> None:
    """FIA's (B, KV_S) mask at one query token, as SGLang 0.5.23 builds swa_mask: the new
    token at n - 1 sees keys n - 1 - window .. n - 1."""
    decode(attention_layer(scaling=0.2, sliding_window_size=8), page_size)
    ((name, _, kw),) = torch_npu.calls
    assert name == "npu_fused_infer_attention_score"
    mask, table = kw["atten_mask"], kw["block_table"]
    assert mask.dtype == torch.bool
    assert mask.shape == (2, table.shape[1] * page_size)
    assert (~mask[0]).nonzero().flatten().tolist() == list(range(5))
    assert (~mask[1]).nonzero().flatten().tolist() == list(range(31, 40))
    assert kw["sparse_mode"] == 0


def test_off_atlas_a2_a3_paged_attention_leaves_decode_to_fia(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ND paged caches are A2/A3's; on an Atlas 300I/310P PagedAttention declines."""
    torch_npu = install_double(monkeypatch, TorchNpuDouble(soc_version=200), TORCH_NPU)
    decode(attention_layer(scaling=0.2), 16)
    assert torch_npu.called == ["npu_fused_infer_attention_score"]


@pytest.mark.parametrize("window", [NO_WINDOW, 8], ids=["paged", "fia-window"])
def test_decode_reads_a_compiled_step_s_plan_updated_in_place(
    torch_npu: TorchNpuDouble, window: int
) -> None:
    """A compiled step's plan: buffers for a larger batch and a longer context, updated in place
    for one batch and then this one (the kit's graph-mode check runs its contract's first
    dtype, float32, which both operators decline): the operators read views of the buffers
    and give this batch's result; a window's mask spans the wider table."""
    q, k_cache, v_cache, req_to_token, rows, lens = pool((5, 40), page_size=16)
    planner = IMPLS["decode_attention"].planner
    capacity = PlanCapacity(
        kind=ForwardKind.DECODE,
        max_batch=4,
        max_tokens=4,
        max_context=2 * req_to_token.shape[1],
        page_size=16,
        device=q.device,
    )
    buffers = planner.allocate(capacity)
    for batch in (
        AttentionBatch.decode(req_to_token, rows.flip(0), lens.flip(0), 16),
        AttentionBatch.decode(req_to_token, rows, lens, 16),
    ):
        plan = planner.update(buffers, batch)
        planner.record(plan, batch)
    layer = attention_layer(scaling=0.2, sliding_window_size=window)
    out = decode_attention(layer, q, k_cache, v_cache, plan)
    reference = STANDARD_OPS["decode_attention"].reference
    eager = decode_plan(req_to_token, rows, lens, 16)
    torch.testing.assert_close(out, reference(layer, q, k_cache, v_cache, eager), **BF16)
    ((name, _, kw),) = torch_npu.calls
    paged = window == NO_WINDOW
    assert name == ("_npu_paged_attention" if paged else "npu_fused_infer_attention_score")
    assert kw["block_table"].data_ptr() == buffers.page_table.data_ptr()
    assert kw["block_table"].shape == (2, capacity.max_pages)
    if not paged:
        assert kw["atten_mask"].shape == (2, capacity.max_pages * 16)


# -- store ----------------------------------------------------------------------------------------


def test_store_writes_the_slots_through_one_slot_blocks(torch_npu: TorchNpuDouble) -> None:
    _, k_cache, v_cache, *_ = pool((5, 9), page_size=4, v_head_dim=32)
    loc = torch.tensor([13, 14, 15, 16])
    k = torch.randn(4, 6, 64)[:, :2].bfloat16()  # a float32-made strided slice, cast below
    v = torch.randn(4, 2, 32)
    store_kv_cache(None, k_cache, v_cache, loc, k, v)
    ((name, (key, value, key_cache, value_cache, slots), _),) = torch_npu.calls
    assert name == "_npu_reshape_and_cache"
    assert key.is_contiguous()
    assert value.dtype == torch.bfloat16
    assert key_cache.shape == (k_cache.shape[0], 1, 2, 64)
    assert value_cache.shape == (v_cache.shape[0], 1, 2, 32)
    assert slots.dtype == torch.int32
    assert slots.tolist() == [13, 14, 15, 16]
    assert torch.equal(k_cache[loc], k)
    assert torch.equal(v_cache[loc], v.bfloat16())


def test_store_of_differing_head_dims_needs_cann_8_0_rc3(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch_npu 2.3.1 pairs with CANN 8.0.RC2, whose ReshapeAndCache takes a value head size
    other than the key's on Atlas 800I A2 only: declined; one head size still stores."""
    torch_npu = install_double(monkeypatch, TorchNpuDouble(version="2.3.1"), TORCH_NPU)
    _, k_cache, v_cache, *_ = pool((5,), page_size=1, v_head_dim=32)
    k, v = torch.randn(1, 2, 64).bfloat16(), torch.randn(1, 2, 32).bfloat16()
    with pytest.raises(Unsupported, match=r"head sizes 64/32 need CANN 8.0.RC3\+"):
        store_kv_cache(None, k_cache, v_cache, torch.tensor([3]), k, v)
    _, k_cache, v_cache, *_ = pool((5,), page_size=1)
    store_kv_cache(None, k_cache, v_cache, torch.tensor([3]), k, k)
    assert torch_npu.called == ["_npu_reshape_and_cache"]


@pytest.mark.parametrize(
    ("k_dtype", "v_dtype"),
    [(torch.float32, torch.float32), (torch.float16, torch.bfloat16)],
    ids=["float32", "mixed"],
)
def test_store_declines_caches_reshape_and_cache_does_not_take(
    torch_npu: TorchNpuDouble, k_dtype: torch.dtype, v_dtype: torch.dtype
) -> None:
    _, k_cache, v_cache, *_ = pool((5,), page_size=1, dtype=k_dtype)
    v_cache = v_cache.to(v_dtype)
    with pytest.raises(Unsupported, match=r"float16/bfloat16 .* of one dtype"):
        store_kv_cache(None, k_cache, v_cache, torch.tensor([7]), k_cache[:1], v_cache[:1])
    assert torch_npu.calls == []


# -- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "layer", "options", "message"),
    [
        ("decode", {"logit_cap": 30.0}, {}, "soft-capping.*soft-capping"),
        ("extend", {"logit_cap": 30.0}, {}, "soft-capping"),
        ("decode", {}, {"dtype": torch.float32}, "float16/bfloat16.*float16/bfloat16"),
        ("decode", {}, {"head_dim": 96, "v_head_dim": 64, "page_size": 8}, "one shape outside TND"),
        ("decode", {}, {"head_dim": 36, "v_head_dim": 36, "page_size": 8}, "16-byte aligned"),
        ("decode", {}, {"page_size": 1024}, r"multiple of 16 up to 512"),
        ("decode", {}, {"heads": 130, "kv_heads": 2, "page_size": 8}, "a ratio <= 64"),
        ("extend", {}, {"page_size": 64}, r"TND without rope.*got 64/64.*128..512 in multiples"),
        ("extend", {}, {"head_dim": 128, "v_head_dim": 128, "page_size": 2048}, r"up to 1024"),
        ("extend", {}, {"head_dim": 96, "v_head_dim": 64}, r"one shape outside TND"),
    ],
)
def test_declines_before_any_call(
    torch_npu: TorchNpuDouble,
    op: str,
    layer: dict[str, Any],
    options: dict[str, Any],
    message: str,
) -> None:
    q, k_cache, v_cache, req_to_token, rows, lens = pool((3, 8), **{"page_size": 128, **options})
    obj = attention_layer(scaling=0.1, **layer)
    page = options.get("page_size", 128)
    two_new = torch.tensor([2, 2], dtype=torch.int32)  # extend: the last two tokens of each
    plan = (
        decode_plan(req_to_token, rows, lens, page)
        if op == "decode"
        else extend_plan(req_to_token, rows, lens, lens - 2, two_new, page)
    )
    attend = decode_attention if op == "decode" else extend_attention
    with pytest.raises(Unsupported, match=message):
        attend(obj, q, k_cache, v_cache, plan)
    assert torch_npu.calls == []


def test_a_release_without_the_operators_declines(
    torch_npu: TorchNpuDouble, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backend's probe does not require the attention operators: a torch_npu without them
    still serves the other ops, and these calls are declined by name."""
    for name in (
        "_npu_reshape_and_cache",
        "_npu_paged_attention",
        "npu_fused_infer_attention_score",
    ):
        monkeypatch.setattr(torch_npu, name, None)
    q, k_cache, v_cache, req_to_token, rows, lens = pool((5,), page_size=16)
    with pytest.raises(Unsupported, match="has no _npu_reshape_and_cache"):
        store_kv_cache(None, k_cache, v_cache, torch.tensor([7]), k_cache[:1], v_cache[:1])
    plan = decode_plan(req_to_token, rows, lens, 16)
    with pytest.raises(Unsupported, match=r"has no _npu_paged_attention.*has no npu_fused_infer"):
        decode_attention(attention_layer(scaling=0.1), q, k_cache, v_cache, plan)
    assert torch_npu.calls == []
