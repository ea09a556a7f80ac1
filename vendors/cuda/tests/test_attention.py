"""The FlashAttention-3 attention adapters against the ``sgl_kernel.flash_attn`` test double.

Every case and dtype of ``decode_attention`` and ``extend_attention`` runs through core's
conformance check against a double that rejects what FA3's ``mha_fwd`` rejects; the tests
below pin the call itself (the paged view, the page table, the window, soft-cap and scale)
and the refusals, each before any kernel call.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import pytest
import torch
from flash_attn_double import FlashAttnDouble
from sglang_fl_cuda import plugin
from sglang_fl_cuda.backend import FA3_DEVICES, FLASH_ATTN, NO_FLASHINFER, FlashAttnBackend
from sglang_fl_cuda.impl.attention import PLANNER, decode_attention, extend_attention
from torch._subclasses.fake_tensor import FakeTensor

from sglang_fl import Unsupported
from sglang_fl.ops import OpCase
from sglang_fl.ops.attention import attention_layer
from sglang_fl.ops.attention.common import build_pool
from sglang_fl.testing.checks import PASSED, SKIPPED, check_case, check_plan
from sglang_fl.testing.vendor import VendorSuite
from sglang_fl.types import AttentionBatch, AttentionPlan, GraphMode

SUITE = VendorSuite("cuda", plugin.sglang_fl_register_ops)
IMPLS = SUITE.implementations
ATTENTION = ("decode_attention", "extend_attention")
CASES = [param for param in SUITE.contract_cases() if param.values[0] in ATTENTION]


def declined(params: Mapping[str, object], dtype: torch.dtype) -> bool:
    """FA3 has no float32 kernel, and takes a v_head_dim other than head_dim only in
    (128, 192] -> (96, 128] or <= 64 -> <= 512 (the contracts' 96/64 is neither)."""
    return dtype == torch.float32 or params["v_head_dim"] != params["head_dim"]


def test_the_attention_cases_are_all_collected() -> None:
    assert {param.values[0] for param in CASES} == set(ATTENTION)
    assert len(CASES) > 50


@pytest.mark.parametrize(("op", "case", "dtype"), CASES)
def test_contract_case(
    flash_attn: FlashAttnDouble, op: str, case: OpCase, dtype: torch.dtype
) -> None:
    outcome = check_case(IMPLS[op], case, dtype)
    expected = SKIPPED if declined(case.params, dtype) else PASSED
    assert outcome.status == expected, outcome.message
    batch = case.params.get("seq_lens", case.params.get("batch"))
    assert isinstance(batch, tuple)
    # One FA3 call per served non-empty batch; none for a declined or an empty one (the
    # kit's second run, on fake tensors, looks for host reads: it is not counted).
    real = [call for call in flash_attn.calls if not isinstance(call.args[0], FakeTensor)]
    assert len(real) == int(expected == PASSED and len(batch) > 0)


@pytest.mark.parametrize(("op", "case"), SUITE.plan_cases())
def test_plan(flash_attn: FlashAttnDouble, op: str, case: OpCase) -> None:
    """The default plan, and a graph-mode plan rewritten in place for the next batch that the
    kernel reads (the planner claims CUDA graphs)."""
    outcome = check_plan(IMPLS[op], case)
    assert outcome.status == PASSED, outcome.message


def pool_args(
    seq_lens: tuple[int, ...],
    *,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 64,
    v_head_dim: int = 64,
    page_size: int = 4,
    dtype: torch.dtype = torch.bfloat16,
    q_tokens: int | None = None,
) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    pool = build_pool(
        seq_lens,
        kv_heads=kv_heads,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        page_size=page_size,
        dtype=dtype,
        device=torch.device("cpu"),
        generator=g,
    )
    tokens = len(seq_lens) if q_tokens is None else q_tokens
    q = torch.randn(tokens, heads, head_dim, generator=g).to(dtype)
    return q, pool.k_cache, pool.v_cache, pool.req_to_token, pool.req_pool_indices, pool.seq_lens


def planned(
    req_to_token: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor, page_size: int = 1
) -> AttentionPlan:
    """The decode plan the adapter's planner makes of a batch."""
    return PLANNER.plan(AttentionBatch.decode(req_to_token, rows, seq_lens, page_size))


def decode_args(seq_lens: tuple[int, ...], page_size: int = 4, **options: object) -> tuple:
    """``(q, k_cache, v_cache, plan)`` of a decode batch over a fresh pool."""
    q, k_cache, v_cache, req_to_token, rows, lens = pool_args(
        seq_lens,
        page_size=page_size,
        **options,  # type: ignore[arg-type]
    )
    return q, k_cache, v_cache, planned(req_to_token, rows, lens, page_size)


def test_the_planner_claims_both_graph_modes() -> None:
    """The calls read only the plan's device tensors and plain values: CUDA graphs replay them."""
    assert IMPLS["decode_attention"].planner is PLANNER
    assert IMPLS["extend_attention"].planner is PLANNER
    assert [PLANNER.graph_problem(mode) for mode in GraphMode] == [None, None]


def test_decode_passes_the_paged_pool_and_the_page_table(flash_attn: FlashAttnDouble) -> None:
    q, k_cache, v_cache, req_to_token, rows, seq_lens = pool_args((5, 9))
    layer = attention_layer(scaling=0.3, logit_cap=2.0, sliding_window_size=3)
    plan = planned(req_to_token, rows, seq_lens, 4)
    out = decode_attention(layer, q, k_cache, v_cache, plan)
    ((name, (kernel_q, kernel_k, kernel_v), kw),) = flash_attn.calls
    assert name == "flash_attn_with_kvcache"
    assert kernel_q is q
    assert kernel_k.shape == (k_cache.shape[0] // 4, 4, 2, 64)
    assert kernel_k.data_ptr() == k_cache.data_ptr()  # a view of the pool, not a copy
    assert kernel_v.data_ptr() == v_cache.data_ptr()
    expected_table = req_to_token[rows, :9][:, ::4] // 4
    assert kw["page_table"] is plan.page_table  # the forward's plan, not rebuilt per layer
    assert kw["page_table"].dtype == torch.int32
    assert torch.equal(kw["page_table"], expected_table.to(torch.int32))
    assert kw["cache_seqlens"].tolist() == [5, 9]
    assert kw["cu_seqlens_q"].tolist() == [0, 1, 2]
    assert kw["max_seqlen_q"] == 1
    assert (kw["softmax_scale"], kw["softcap"]) == (0.3, 2.0)
    assert kw["causal"] is True
    assert kw["window_size"] == (3, 0)
    assert out.shape == (2, 4, 64)


def test_extend_maps_lengths_and_the_mask(flash_attn: FlashAttnDouble) -> None:
    q, k_cache, v_cache, req_to_token, rows, seq_lens = pool_args((6, 10), q_tokens=9)
    prefix, extend = torch.tensor([0, 7], dtype=torch.int32), torch.tensor([6, 3])
    batch = AttentionBatch.extend(req_to_token, rows, seq_lens, prefix, extend, 4)
    plan = PLANNER.plan(batch)
    causal = attention_layer(scaling=0.125, sliding_window_size=4)
    extend_attention(causal, q, k_cache, v_cache, plan)
    encoder = attention_layer(scaling=0.125, sliding_window_size=4, is_causal=False)
    extend_attention(encoder, q, k_cache, v_cache, plan)
    first, second = (call.kwargs for call in flash_attn.calls)
    assert first["cu_seqlens_q"].tolist() == [0, 6, 9]
    assert first["max_seqlen_q"] == 6
    assert first["cache_seqlens"].tolist() == [6, 10]
    assert (first["causal"], first["window_size"]) == (True, (4, 0))
    # A non-causal layer sees every key of its request: no window (the contract's rule).
    assert (second["causal"], second["window_size"]) == (False, (-1, -1))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dtype": torch.float32}, "float16/bfloat16"),
        ({"head_dim": 320, "v_head_dim": 320}, "head_dim <= 256"),
        ({"head_dim": 36, "v_head_dim": 36}, "multiple of 8"),
        ({"head_dim": 96, "v_head_dim": 64}, r"\(128, 192\]"),
    ],
)
def test_declines_what_fa3_rejects_before_calling(
    flash_attn: FlashAttnDouble, options: dict[str, object], message: str
) -> None:
    layer = attention_layer(scaling=0.1)
    with pytest.raises(Unsupported, match=message):
        decode_attention(layer, *decode_args((3, 8), **options))
    assert flash_attn.calls == []


def test_declines_a_pool_in_another_dtype(flash_attn: FlashAttnDouble) -> None:
    q, k_cache, v_cache, plan = decode_args((3,))
    with pytest.raises(Unsupported, match="KV pool in q's dtype"):
        decode_attention(attention_layer(scaling=0.1), q.half(), k_cache, v_cache, plan)
    assert flash_attn.calls == []


@pytest.mark.parametrize("capability", [(8, 0), (8, 9), (12, 0)], ids=["sm80", "sm89", "sm120"])
def test_a_wider_key_than_value_head_runs_on_hopper_only(
    flash_attn: FlashAttnDouble, capability: tuple[int, int]
) -> None:
    """192/128 (DeepSeek-style) is one of FA3's two allowed v_head_dim pairs, on sm90 only:
    the adapter declines it elsewhere before calling (the double would refuse the call)."""
    args = decode_args((3, 8), head_dim=192, v_head_dim=128)
    layer = attention_layer(scaling=0.1)
    flash_attn.capability = capability
    with pytest.raises(Unsupported, match="Hopper only"):
        decode_attention(layer, *args)
    assert flash_attn.calls == []
    flash_attn.capability = (9, 0)
    out = decode_attention(layer, *args)
    assert out.shape == (2, 4, 128)
    assert len(flash_attn.calls) == 1


@pytest.mark.parametrize(
    ("capability", "cuda"), [((12, 0), "12.8"), ((10, 0), "12.8"), ((9, 0), "12.2")]
)
def test_declines_where_fa3_is_not_supported(
    flash_attn: FlashAttnDouble, capability: tuple[int, int], cuda: str
) -> None:
    flash_attn.capability, flash_attn.cuda = capability, cuda
    with pytest.raises(Unsupported, match=r"sm80/86/89/90 with CUDA >= 12\.3"):
        decode_attention(attention_layer(scaling=0.1), *decode_args((3,)))
    assert flash_attn.calls == []


@pytest.mark.parametrize("pool_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_an_fp8_pool_is_declined_for_the_scales_the_contract_lacks(
    flash_attn: FlashAttnDouble, pool_dtype: torch.dtype
) -> None:
    """mha_fwd takes e4m3 K/V with an e4m3 q and descales: serving the contract (K/V cast to
    q's dtype, no scale) would quantize q. The reason says so, not that FA3 lacks fp8."""
    q, k_cache, v_cache, plan = decode_args((3, 8))
    k8, v8 = k_cache.to(pool_dtype), v_cache.to(pool_dtype)
    with pytest.raises(Unsupported) as info:
        decode_attention(attention_layer(scaling=0.1), q, k8, v8, plan)
    reason = str(info.value)
    assert "an fp8 KV pool" in reason
    assert "descales" in reason
    assert "would quantize q" in reason
    assert flash_attn.calls == []


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch sees two CUDA devices; the probes are recomputed."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(FLASH_ATTN, "count_devices", torch.cuda.device_count)
    monkeypatch.setattr(FLASH_ATTN, "_probed", None)


@pytest.mark.parametrize(
    ("capability", "cuda", "available"),
    [((9, 0), "12.4", True), ((8, 0), "12.4", True), ((10, 0), "12.8", False),
     ((12, 0), "12.8", False), ((9, 0), "12.2", False)],
)  # fmt: skip
def test_the_probe_asks_is_fa3_supported_of_every_gpu(
    flash_attn: FlashAttnDouble,
    two_gpus: None,
    capability: tuple[int, int],
    cuda: str,
    available: bool,
) -> None:
    """On Blackwell the module imports but FA3 has no kernel: unavailable, with the reason
    (``sglang-fl explain`` shows it), rather than available and declining every call."""
    flash_attn.capability, flash_attn.cuda = capability, cuda
    verdict = FlashAttnBackend().is_available()
    assert bool(verdict) is available
    if available:
        assert verdict.reason == "sgl_kernel.flash_attn 0.0.0+double imported; 2 CUDA devices"
    else:
        sm = f"sm{capability[0]}{capability[1]}"
        assert verdict.reason == (
            f"sgl_kernel's FlashAttention-3 runs on {FA3_DEVICES}, not on cuda:0 ({sm}), "
            f"cuda:1 ({sm}) with CUDA {torch.version.cuda}; {NO_FLASHINFER}"
        )


def test_a_failing_device_query_is_a_reason(
    flash_attn: FlashAttnDouble, two_gpus: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(device: object = None) -> bool:
        raise RuntimeError("CUDA driver error: unknown error")

    monkeypatch.setattr(flash_attn, "is_fa3_supported", broken)
    verdict = FlashAttnBackend().is_available()
    assert not verdict
    assert verdict.reason == (
        "probing FlashAttention-3 failed: RuntimeError: CUDA driver error: unknown error"
    )


def test_declines_where_the_wheel_has_no_fa3(monkeypatch: pytest.MonkeyPatch) -> None:
    """An sgl_kernel built without FlashAttention-3: the import fails, the call is declined."""
    monkeypatch.setitem(sys.modules, "sgl_kernel.flash_attn", None)  # import raises ImportError
    monkeypatch.setattr(FLASH_ATTN, "module", None)
    monkeypatch.setattr(FLASH_ATTN, "_error", None)
    with pytest.raises(Unsupported, match="no FlashAttention-3 here"):
        decode_attention(attention_layer(scaling=0.1), *decode_args((3,)))


def test_an_empty_batch_launches_nothing(flash_attn: FlashAttnDouble) -> None:
    q, k_cache, v_cache, req_to_token, rows, seq_lens = pool_args((3,))
    plan = planned(req_to_token, rows[:0], seq_lens[:0])
    empty = decode_attention(attention_layer(scaling=0.1), q[:0], k_cache, v_cache, plan)
    assert empty.shape == (0, 4, 64)
    assert flash_attn.calls == []
