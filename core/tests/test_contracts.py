"""Op contracts: which functions can take an op's standard arguments, and the error texts."""

from __future__ import annotations

import functools

import pytest
import torch

from sglang_fl.ops import STANDARD_OPS, get_contract, unknown_op_message


def test_standard_ops_are_the_design_set():
    assert list(STANDARD_OPS) == [
        "silu_and_mul",
        "rms_norm",
        "rotary_embedding",
        "gelu_and_mul",
        "gelu_new",
        "gelu_quick",
        "gemma_rms_norm",
        "layer_norm",
        "mrotary_embedding",
        "clamp_position",
        "topk",
        "fused_moe",
        "fused_gate_sigmoid_mul",
        "fused_sigmoid_mul",
        "store_kv_cache",
        "decode_attention",
        "extend_attention",
        "fused_qkvzba_split_reshape_cat",
        "fused_qkvzba_split_reshape_cat_contiguous",
        "causal_conv1d_fn",
        "causal_conv1d_update",
        "fused_gdn_gating",
        "chunk_gated_delta_rule",
        "fused_recurrent_gated_delta_rule",
        "fused_recurrent_gated_delta_rule_packed_decode",
        "fused_sigmoid_gating_delta_rule_update",
        "rms_norm_gated",
        "track_mamba_states",
        "all_reduce",
        "quant_all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "all_gatherv",
        "gather",
        "reduce_scatter_tensor",
        "reduce_scatterv",
        "reduce_scatter",
        "broadcast",
        "send",
        "recv",
        "all_to_all_single",
        "w8a8_int8_linear",
        "w8a8_fp8_linear",
        "w8a8_block_fp8_linear",
        "wna16_linear",
        "fused_moe_w8a8_int8",
        "fused_moe_w8a8_fp8",
    ]


@pytest.mark.parametrize(
    ("op", "text"),
    [
        ("silu_and_mul", "silu_and_mul(obj, x)"),
        ("rms_norm", "rms_norm(obj, x, residual=None)"),
        (
            "rotary_embedding",
            "rotary_embedding(obj, query, key, cos, sin, position_ids, "
            "rotary_interleaved=False, inplace=True)",
        ),
        ("gelu_and_mul", "gelu_and_mul(obj, x)"),
        ("gelu_new", "gelu_new(obj, x)"),
        ("gelu_quick", "gelu_quick(obj, x)"),
        ("gemma_rms_norm", "gemma_rms_norm(obj, x, residual=None)"),  # as in FlagOS
        ("layer_norm", "layer_norm(obj, x)"),
        ("mrotary_embedding", "mrotary_embedding(obj, positions, query, key)"),  # as in FlagOS
        ("clamp_position", "clamp_position(obj, seq_lens)"),
        ("topk", "topk(obj, router_logits)"),
        ("fused_moe", "fused_moe(obj, x, w13, w2, topk_weights, topk_ids, activation='silu')"),
        (
            "fused_gate_sigmoid_mul",
            "fused_gate_sigmoid_mul(obj, hidden_states, gate_weight, shared_output, addend=None)",
        ),
        ("store_kv_cache", "store_kv_cache(obj, k_cache, v_cache, loc, k, v)"),
        ("decode_attention", "decode_attention(obj, q, k_cache, v_cache, plan)"),
        ("extend_attention", "extend_attention(obj, q, k_cache, v_cache, plan)"),
    ],
)
def test_signature_text_is_the_design_signature(op, text):
    assert get_contract(op).signature_text() == text


def test_required_parameters():
    assert get_contract("rms_norm").required_parameters == ("obj", "x")
    assert get_contract("rotary_embedding").required_parameters == (
        "obj",
        "query",
        "key",
        "cos",
        "sin",
        "position_ids",
    )


def test_unknown_op_suggests_close_match():
    with pytest.raises(KeyError) as info:
        get_contract("rms_nrom")
    message = info.value.args[0]
    assert "'rms_nrom'" in message
    assert "did you mean 'rms_norm'?" in message
    assert "silu_and_mul, rms_norm, rotary_embedding, gelu_and_mul" in message


def test_unknown_op_without_close_match_lists_known_ops():
    message = unknown_op_message("zzzz")
    assert "did you mean" not in message
    assert "known ops: silu_and_mul, rms_norm, rotary_embedding, gelu_and_mul" in message


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_tolerances_for_every_float_contract_dtype(dtype):
    """Computing contracts have a positive tolerance; collectives that only move data are
    exact, and those that sum allow for the order of the sum."""
    moving = {"all_gather", "all_gather_into_tensor", "all_gatherv", "broadcast", "send"}
    moving |= {"recv", "all_to_all_single", "gather"}
    for contract in STANDARD_OPS.values():
        if dtype in contract.dtypes:
            tol = contract.tolerance(dtype)
            if contract.name in moving or contract.name in COPY_OPS:  # nothing is rounded
                assert (tol.atol, tol.rtol) == (0, 0), contract.name
            else:
                assert tol.atol > 0
                assert tol.rtol > 0


COPY_OPS = ("store_kv_cache",)


def test_index_results_are_exact():
    contract = get_contract("clamp_position")
    assert contract.dtypes == (torch.int32, torch.int64)
    for dtype in contract.dtypes:
        assert (contract.tolerance(dtype).atol, contract.tolerance(dtype).rtol) == (0, 0)


KERNELS = [op for op, contract in STANDARD_OPS.items() if contract.collective is None]
COLLECTIVES = [op for op, contract in STANDARD_OPS.items() if contract.collective is not None]


@pytest.mark.parametrize("op", KERNELS[3:])
def test_newer_contracts_cover_empty_and_strided_inputs(op):
    """Every kernel contract beyond the first three has a 0-token and a non-contiguous case."""
    contract = get_contract(op)
    names = [case.name for case in contract.cases]
    assert any("tokens=0" in n or "batch=0" in n for n in names), names
    assert any("strided" in n or "qkv-slices" in n for n in names), names


@pytest.mark.parametrize("op", COLLECTIVES)
def test_collective_contracts_cover_an_idle_rank_on_2_and_4_ranks(op):
    """Collectives take contiguous tensors (torch.distributed refuses others: no strided
    case); each covers a rank without rows and runs on 2 and 4 ranks."""
    contract = get_contract(op)
    assert contract.collective is not None
    assert contract.collective.world_sizes == (2, 4)
    spec = contract.collective
    idle = False
    for case in contract.cases:
        for world_size in spec.world_sizes:
            for rank in range(world_size):
                inputs = spec.rank_inputs(
                    case, torch.float32, torch.device("cpu"), rank, world_size
                )
                tensors = [a for a in (*inputs.args, *inputs.kwargs.values())]
                tensors = [t for a in tensors for t in (a if isinstance(a, list) else [a])]
                tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
                assert all(t.is_contiguous() for t in tensors), case.name
                idle = idle or any(t.numel() == 0 for t in tensors)
    assert idle, f"{op}: no case gives a rank an empty tensor"


def test_tolerance_of_unknown_dtype_names_op_and_dtypes():
    with pytest.raises(ValueError, match=r"'rms_norm' has no tolerance for dtype torch\.int8"):
        get_contract("rms_norm").tolerance(torch.int8)


# -- accepted functions ---------------------------------------------------------------------------


def plain_rms(obj, x, residual=None):
    return x


def rms_with_kwargs(obj, x, residual=None, **extra):
    return x


def rms_varargs(*args, **kwargs):
    return args


def rms_extra_optional(obj, x, residual=None, scale=1.0):
    return x


def rotary_plain(obj, query, key, cos, sin, position_ids, rotary_interleaved=False, inplace=True):
    return query, key


class SeedBackend:
    """The seed's backend: ops are methods (bound: ``self`` is not an op argument)."""

    def silu_and_mul(self, obj, x):
        return x

    def rms_norm(self, obj, x, residual=None):
        return x

    def rotary_embedding(
        self, obj, query, key, cos, sin, position_ids, rotary_interleaved=False, inplace=True
    ):
        return query, key


def seed_wrapper(fn, is_available):
    """``_bind_is_available`` from the seed page: a ``functools.wraps``'d ``*args`` wrapper."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    wrapper._is_available = is_available
    return wrapper


@pytest.mark.parametrize(
    ("op", "fn"),
    [
        ("rms_norm", plain_rms),
        ("rms_norm", rms_with_kwargs),
        ("rms_norm", rms_varargs),
        ("rms_norm", rms_extra_optional),
        ("rms_norm", lambda obj, x, residual=None: x),
        ("rms_norm", SeedBackend().rms_norm),
        ("rms_norm", seed_wrapper(SeedBackend().rms_norm, lambda: True)),
        ("silu_and_mul", SeedBackend().silu_and_mul),
        ("silu_and_mul", seed_wrapper(SeedBackend().silu_and_mul, lambda: True)),
        ("silu_and_mul", functools.partial(plain_rms, residual=None)),
        ("rotary_embedding", rotary_plain),
        ("rotary_embedding", SeedBackend().rotary_embedding),
        ("rotary_embedding", seed_wrapper(SeedBackend().rotary_embedding, lambda: True)),
    ],
    ids=lambda v: v if isinstance(v, str) else getattr(v, "__qualname__", type(v).__name__),
)
def test_signature_problem_accepts(op, fn):
    assert get_contract(op).signature_problem(fn) is None


def test_reference_implementations_satisfy_their_contracts():
    for contract in STANDARD_OPS.values():
        assert contract.signature_problem(contract.reference) is None


def test_a_callable_object_is_accepted():
    class Kernel:
        def __call__(self, obj, x):
            return x

    assert get_contract("silu_and_mul").signature_problem(Kernel()) is None


# -- rejected functions ---------------------------------------------------------------------------


def too_few(obj):
    return obj


def too_many_required(obj, x, residual, scale):
    return x


def misnamed_optional(obj, x, res=None):
    return x


def rotary_misnamed(obj, query, key, cos, sin, position_ids, interleaved=False, inplace=True):
    return query, key


def rotary_missing_inplace(obj, query, key, cos, sin, position_ids, rotary_interleaved=False):
    return query, key


def keyword_only_x(obj, *, x):
    return x


@pytest.mark.parametrize(
    ("op", "fn", "expected"),
    [
        ("silu_and_mul", too_few, "cannot be called with 2 positional arguments"),
        ("rms_norm", too_few, "cannot be called with 3 positional arguments"),
        ("rms_norm", too_many_required, "cannot be called with 3 positional arguments"),
        ("silu_and_mul", SeedBackend.silu_and_mul, "cannot be called with 2 positional"),
        ("rms_norm", misnamed_optional, "optional parameters are not named as in the contract"),
        (
            "rotary_embedding",
            rotary_misnamed,
            "optional parameters are not named as in the contract",
        ),
        ("rotary_embedding", rotary_missing_inplace, "cannot be called with 8 positional"),
        ("silu_and_mul", keyword_only_x, "cannot be called with 2 positional arguments"),
    ],
    ids=lambda v: v if isinstance(v, str) else getattr(v, "__qualname__", type(v).__name__),
)
def test_signature_problem_rejects(op, fn, expected):
    problem = get_contract(op).signature_problem(fn)
    assert problem is not None
    assert expected in problem


def test_uninspectable_callable_is_reported():
    class Opaque:
        __signature__ = "not a signature"

        def __call__(self, *args):
            return args

    problem = get_contract("silu_and_mul").signature_problem(Opaque())
    assert problem is not None
    assert "cannot be inspected" in problem


@pytest.mark.parametrize("op", KERNELS)
def test_every_contract_covers_an_empty_batch_and_strided_inputs(op):
    """Kernels meet empty batches (an idle rank) and strided views (slices of a packed
    projection): every contract has both, so the kit and the hardware scripts run them."""
    contract = get_contract(op)
    tensors = []  # every case's tensor arguments (mrotary_embedding's data follows positions)
    for case in contract.cases:
        inputs = contract.make_inputs(case, torch.float16, torch.device("cpu"), torch.Generator())
        tensors += [arg for arg in inputs.args if isinstance(arg, torch.Tensor)]
    assert any(tensor.numel() == 0 for tensor in tensors)
    assert any(tensor.numel() > 0 and not tensor.is_contiguous() for tensor in tensors)


def test_rotary_packed_cases_cut_q_and_k_from_one_qkv_row():
    contract = get_contract("rotary_embedding")
    packed = [c for c in contract.cases if c.params["packed"]]
    assert {c.params["rotary_dim"] == c.params["head_size"] for c in packed} == {True, False}
    for case in packed:
        inputs = contract.make_inputs(case, torch.float32, torch.device("cpu"), torch.Generator())
        query, key = inputs.args[:2]
        p = case.params
        row = (p["q_heads"] + 2 * p["kv_heads"]) * p["head_size"]
        assert query.stride(0) == key.stride(0) == row
        assert key.data_ptr() - query.data_ptr() == p["q_heads"] * p["head_size"] * 4


# -- the whole contract, as explain and the API pages show it --------------------------------------


@pytest.mark.parametrize("op", sorted(STANDARD_OPS))
def test_every_contract_describes_itself_in_words_and_in_cases(op):
    contract = get_contract(op)
    described = contract.describe()
    assert described["details"].strip(), f"{op}: no contract text (its signature's docstring)"
    assert described["details"] == contract.details
    assert described["signature"] == contract.signature_text()
    assert described["cases"] == [case.name for case in contract.cases]
    world_sizes = len(contract.collective.world_sizes) if contract.collective else 1
    assert described["checks"] == len(contract.cases) * len(contract.dtypes) * world_sizes
    assert [t["dtype"] for t in described["tolerances"]] == described["dtypes"]
    # The in-place rules are the cases' own: every listed count adds up to the cases stating it.
    generator = torch.Generator().manual_seed(0)
    stated = {name: 0 for name in contract.parameter_names}
    for case in contract.cases:
        inputs = contract.make_inputs(case, contract.dtypes[0], torch.device("cpu"), generator)
        for name in {*inputs.preserved, *inputs.written_in_place.values()} & set(stated):
            stated[name] += 1
    for entry in described["in_place"]:
        assert entry["untouched"] + entry["written"] == stated[entry["argument"]], entry


def test_store_kv_cache_is_written_in_place_and_decode_writes_nothing():
    store = {e["argument"]: e for e in get_contract("store_kv_cache").describe()["in_place"]}
    assert store["k_cache"]["outputs"] == [0]
    assert store["v_cache"]["outputs"] == [1]
    decode = get_contract("decode_attention").describe()["in_place"]
    assert decode
    assert all(e["written"] == 0 for e in decode)


@pytest.mark.parametrize("op", ["decode_attention", "extend_attention"])
def test_attention_contracts_state_their_masks_as_formulas(op):
    rules = {rule.name: rule.formula for rule in get_contract(op).rules}
    assert {"positions", "scores", "soft-capping", "causal mask", "sliding window"} <= set(rules)
    assert "the key at i - w is included" in rules["sliding window"]
    assert "c * tanh(s(i, j) / c)" in rules["soft-capping"]
    assert "head_dim ** -0.5" in rules["scores"]


def _window_decode_inputs(window: int, seq_len: int = 12, head_dim: int = 16):
    """One request, one kv head: the decode query at position seq_len - 1 over a window, and
    the reference planner's plan of that batch."""
    from sglang_fl.ops.attention import attention_layer
    from sglang_fl.ops.attention.plan import REFERENCE_PLANNER, AttentionBatch

    generator = torch.Generator().manual_seed(3)
    k = torch.randn(seq_len + 1, 1, head_dim, generator=generator)
    v = torch.randn(seq_len + 1, 1, head_dim, generator=generator)
    q = torch.randn(1, 1, head_dim, generator=generator)
    req_to_token = torch.arange(1, seq_len + 1, dtype=torch.int32).unsqueeze(0)  # slot 0: padding
    layer = attention_layer(scaling=head_dim**-0.5, sliding_window_size=window)
    batch = AttentionBatch.decode(req_to_token, torch.tensor([0]), torch.tensor([seq_len]))
    return layer, q, k, v, REFERENCE_PLANNER.plan(batch)


def test_the_sliding_window_rule_is_what_the_reference_computes():
    """The window rule as printed: with w, the query at i sees i - w (included) to i."""
    reference = get_contract("decode_attention").reference
    window, seq_len = 4, 12
    layer, q, k, v, plan = _window_decode_inputs(window, seq_len)
    base = reference(layer, q, k, v, plan)
    i = seq_len - 1
    for position, seen in ((i - window, True), (i - window - 1, False)):
        changed = k.clone()
        changed[1 + position] += 5.0  # slot of the key at that position
        out = reference(layer, q, changed, v, plan)
        assert (not torch.equal(out, base)) is seen, f"key at i - {i - position}"


def test_the_soft_cap_rule_is_what_the_reference_computes():
    from sglang_fl.ops.attention import attention_layer

    reference = get_contract("decode_attention").reference
    layer, q, k, v, plan = _window_decode_inputs(-1)
    capped = attention_layer(scaling=layer.scaling, logit_cap=0.5)
    scores = (q[0, 0] @ k[1:, 0].T) * layer.scaling
    want = torch.softmax(0.5 * torch.tanh(scores / 0.5), dim=-1) @ v[1:, 0]
    got = reference(capped, q, k, v, plan)
    torch.testing.assert_close(got[0, 0], want)
