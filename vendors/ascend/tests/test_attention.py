"""The torch_npu attention adapters against the ``torch_npu`` double (no NPU, no torch-npu).

Every case and dtype of ``store_kv_cache``, ``decode_attention`` and ``extend_attention`` runs
through core's conformance check; the contracts' page sizes (1, 4, 16) are below the fused
operator's prefill block size (multiples of 128), so extend is also checked against the
reference at SGLang's NPU page size, 128. Then the calls themselves and every refusal, each
before any operator call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch
from sglang_fl_ascend import plugin
from sglang_fl_ascend.impl.attention import decode_attention, extend_attention, store_kv_cache
from torch._subclasses.fake_tensor import FakeTensor
from torch_npu_double import TorchNpuDouble

from sglang_fl import Unsupported
from sglang_fl.ops import STANDARD_OPS, OpCase
from sglang_fl.ops.attention import attention_layer
from sglang_fl.ops.attention.cases import Option
from sglang_fl.ops.attention.common import build_pool
from sglang_fl.testing.checks import PASSED, SKIPPED, check_case
from sglang_fl.testing.vendor import VendorSuite
from sglang_fl.types import AttentionBatch, AttentionPlan, DefaultPlanner, GraphMode

SUITE = VendorSuite("ascend", plugin.sglang_fl_register_ops)
IMPLS = SUITE.implementations
ATTENTION = ("store_kv_cache", "decode_attention", "extend_attention")
CASES = [param for param in SUITE.contract_cases() if param.values[0] in ATTENTION]


def declined(op: str, p: Mapping[str, Any], dtype: torch.dtype) -> bool:
    """float16/bfloat16 only; the fused operator has no soft-cap, no window with one query
    token, one head dim for key and value, decode blocks 16-aligned, prefill blocks 128..512."""
    if dtype == torch.float32:
        return True
    if op == "store_kv_cache":
        return False
    if op == "extend_attention":
        return True  # page sizes 1, 4, 16: no multiple of 128
    return bool(
        p["v_head_dim"] != p["head_dim"]
        or p["option"] in (Option.SOFTCAP, Option.WINDOW)
        or p["page_size"] % 16
    )


def requests(op: str, p: Mapping[str, Any]) -> int:
    if op == "store_kv_cache":
        return int(p["tokens"])
    return len(p["seq_lens"] if op == "decode_attention" else p["batch"])


def test_the_attention_cases_are_all_collected() -> None:
    assert {param.values[0] for param in CASES} == set(ATTENTION)


@pytest.mark.parametrize(("op", "case", "dtype"), CASES)
def test_contract_case(
    torch_npu: TorchNpuDouble, op: str, case: OpCase, dtype: torch.dtype
) -> None:
    outcome = check_case(IMPLS[op], case, dtype)
    expected = SKIPPED if declined(op, case.params, dtype) else PASSED
    assert outcome.status == expected, outcome.message
    # One operator call per served non-empty call; none for a declined or an empty one (the
    # kit's second run, on fake tensors, looks for host reads: it is not counted).
    real = [call for call in torch_npu.calls if not isinstance(call.args[0], FakeTensor)]
    assert len(real) == int(expected == PASSED and requests(op, case.params) > 0)


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
    """The operator takes its lengths as host lists, which a recorded NPU graph would replay
    unchanged; compiled, each call runs afresh."""
    for op in ("decode_attention", "extend_attention"):
        planner = IMPLS[op].planner
        assert type(planner) is DefaultPlanner
        assert planner.graph_problem(GraphMode.COMPILED) is None
        assert planner.graph_problem(GraphMode.CAPTURED)


EXTEND_LAYERS = {
    "causal": attention_layer(scaling=0.125),
    "window": attention_layer(scaling=0.125, sliding_window_size=40),
    "noncausal": attention_layer(scaling=0.3, is_causal=False),
}


@pytest.mark.parametrize("kind", EXTEND_LAYERS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_extend_at_npu_page_size_matches_the_reference(
    torch_npu: TorchNpuDouble, kind: str, dtype: torch.dtype
) -> None:
    """A prefill, a radix hit over two pages and a one-token extend, in blocks of 128."""
    batch = ((0, 70), (150, 30), (200, 1))
    seq_lens = tuple(pre + ext for pre, ext in batch)
    q, k_cache, v_cache, req_to_token, rows, lens = pool(
        seq_lens, page_size=128, tokens=101, dtype=dtype
    )
    prefix = torch.tensor([pre for pre, _ in batch], dtype=torch.int32)
    extend = torch.tensor([ext for _, ext in batch], dtype=torch.int32)
    layer = EXTEND_LAYERS[kind]
    plan = extend_plan(req_to_token, rows, lens, prefix, extend, 128)
    out = extend_attention(layer, q, k_cache, v_cache, plan)
    expected = STANDARD_OPS["extend_attention"].reference(layer, q, k_cache, v_cache, plan)
    tolerance = STANDARD_OPS["extend_attention"].tolerance(dtype)
    torch.testing.assert_close(out, expected, atol=tolerance.atol, rtol=tolerance.rtol)
    ((name, (query, key, _), kw),) = torch_npu.calls
    assert name == "npu_fused_infer_attention_score"
    assert query.is_contiguous()  # the strided q, packed
    assert torch.equal(query, q)
    assert key.shape == (k_cache.shape[0] // 128, 128, 2 * 64)
    assert key.data_ptr() == k_cache.data_ptr()
    assert kw["input_layout"] == "TND"
    assert kw["actual_seq_lengths"] == [70, 100, 101]
    assert kw["actual_seq_lengths_kv"] == [70, 180, 201]
    assert kw["block_table"] is plan.page_table  # the forward's, not rebuilt per layer
    assert kw["block_table"].dtype == torch.int32
    assert (kw["sparse_mode"], kw["pre_tokens"]) == {
        "causal": (3, 2147483647),
        "window": (4, 40),
        "noncausal": (0, 2147483647),
    }[kind]
    assert (kw["atten_mask"] is None) is (kind == "noncausal")


def test_decode_calls_the_bsh_page_attention(torch_npu: TorchNpuDouble) -> None:
    q, k_cache, v_cache, req_to_token, rows, lens = pool((5, 40), page_size=16)
    plan = decode_plan(req_to_token, rows, lens, 16)
    out = decode_attention(attention_layer(scaling=0.2), q, k_cache, v_cache, plan)
    ((_, (query, key, value), kw),) = torch_npu.calls
    assert query.shape == (2, 1, 4 * 64)
    assert key.shape == value.shape == (k_cache.shape[0] // 16, 16, 2 * 64)
    expected_table = (req_to_token[rows, :40][:, ::16] // 16).to(torch.int32)
    assert kw["block_table"] is plan.page_table
    assert torch.equal(kw["block_table"], expected_table)
    assert kw["actual_seq_lengths_kv"] == [5, 40]
    assert (kw["num_heads"], kw["num_key_value_heads"], kw["block_size"]) == (4, 2, 16)
    assert (kw["input_layout"], kw["scale"]) == ("BSH", 0.2)
    assert out.shape == (2, 4, 64)


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


@pytest.mark.parametrize(
    ("op", "layer", "options", "message"),
    [
        ("decode", {"logit_cap": 30.0}, {}, "soft-capping"),
        ("extend", {"logit_cap": 30.0}, {}, "soft-capping"),
        ("decode", {"sliding_window_size": 8}, {}, "pre_tokens has no effect"),
        ("decode", {}, {"dtype": torch.float32}, "float16/bfloat16"),
        ("decode", {}, {"head_dim": 96, "v_head_dim": 64}, "one head dim"),
        ("decode", {}, {"head_dim": 36, "v_head_dim": 36}, "16-byte aligned"),
        ("decode", {}, {"page_size": 8}, "16-aligned"),
        ("decode", {}, {"page_size": 1024}, "block_size <= 512"),
        ("extend", {}, {"page_size": 64}, "128..512 in multiples of 128"),
        ("decode", {}, {"heads": 130, "kv_heads": 2}, "num_key_value_heads <= 64"),
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
    one_new = torch.tensor([1, 1], dtype=torch.int32)  # extend: the last token of each request
    call = (
        (
            lambda: decode_attention(
                obj, q, k_cache, v_cache, decode_plan(req_to_token, rows, lens, page)
            )
        )
        if op == "decode"
        else (
            lambda: extend_attention(
                obj,
                q,
                k_cache,
                v_cache,
                extend_plan(req_to_token, rows, lens, lens - 1, one_new, page),
            )
        )
    )
    with pytest.raises(Unsupported, match=message):
        call()
    assert torch_npu.calls == []


def test_store_declines_a_float32_pool(torch_npu: TorchNpuDouble) -> None:
    _, k_cache, v_cache, *_ = pool((5,), page_size=1, dtype=torch.float32)
    with pytest.raises(Unsupported, match="float16/bfloat16"):
        store_kv_cache(None, k_cache, v_cache, torch.tensor([7]), k_cache[:1], v_cache[:1])
    assert torch_npu.calls == []


def test_the_causal_mask_is_built_once_per_device(torch_npu: TorchNpuDouble) -> None:
    batch = ((0, 3),)
    q, k_cache, v_cache, req_to_token, rows, lens = pool((3,), page_size=128, tokens=3)
    prefix, extend = torch.tensor([0]), torch.tensor([3])
    layer = attention_layer(scaling=0.1)
    plan = extend_plan(req_to_token, rows, lens, prefix, extend, 128)
    for _ in batch * 2:
        extend_attention(layer, q, k_cache, v_cache, plan)
    first, second = (call.kwargs["atten_mask"] for call in torch_npu.calls)
    assert first is second
    assert first.shape == (2048, 2048)
    assert bool(first[0, 1])  # True above the diagonal: masked
    assert not bool(first[1, 0])


def test_a_release_without_the_operators_declines(
    torch_npu: TorchNpuDouble, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backend's probe does not require the attention operators: a torch_npu without them
    still serves the other ops, and these calls are declined by name."""
    monkeypatch.setattr(torch_npu, "_npu_reshape_and_cache", None)
    _, k_cache, v_cache, *_ = pool((5,), page_size=1)
    with pytest.raises(Unsupported, match="has no _npu_reshape_and_cache"):
        store_kv_cache(None, k_cache, v_cache, torch.tensor([7]), k_cache[:1], v_cache[:1])
    assert torch_npu.calls == []
