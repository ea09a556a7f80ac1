"""The reference backend computes what SGLang's ``forward_native`` computes, bit for bit.

The SGLang formulas are written here independently of ``sglang_fl.ops`` (from SGLang's
``RMSNorm.forward_native``, ``SiluAndMul.forward_native`` and ``RotaryEmbedding.forward_native``
with ``_apply_rotary_emb``), and run on the whole layer inputs SGLang sees (full heads,
``cos_sin_cache``), so the contract's reshaping into the standard signature is checked too.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang_fl.ops import STANDARD_OPS
from sglang_fl.reference import impl_id

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def cases(op_name: str):
    contract = STANDARD_OPS[op_name]
    return [
        pytest.param(case, dtype, id=f"{case.name}-{str(dtype).removeprefix('torch.')}")
        for case in contract.cases
        for dtype in DTYPES
    ]


def make(op_name, case, dtype):
    generator = torch.Generator().manual_seed(1234)
    return STANDARD_OPS[op_name].make_inputs(case, dtype, torch.device("cpu"), generator)


def test_every_float_contract_covers_the_three_dtypes():
    for contract in STANDARD_OPS.values():
        assert contract.cases, contract.name
        if any(dtype.is_floating_point for dtype in contract.dtypes):
            assert set(contract.dtypes) >= set(DTYPES), contract.name


def test_reference_impl_ids_are_namespaced():
    assert impl_id("rms_norm") == "reference.rms_norm"


# -- SGLang's formulas, written out ---------------------------------------------------------------


def sglang_rms_norm(weight, eps, x, residual=None):
    """``RMSNorm.forward_native``: fp32 accumulation, ``(x * weight).to(orig_dtype)``."""
    x = x.contiguous()
    orig_dtype = x.dtype
    x = x.to(torch.float32)
    if residual is not None:
        x = x + residual.to(torch.float32)
        residual = x.to(orig_dtype)
    variance = x.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    x = (x * weight).to(orig_dtype)
    return x if residual is None else (x, residual)


def sglang_silu_and_mul(x):
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def sglang_apply_rotary_emb(x, cos, sin, is_neox_style):
    cos = cos.unsqueeze(-2).to(x.dtype)
    sin = sin.unsqueeze(-2).to(x.dtype)
    if is_neox_style:
        x1, x2 = torch.chunk(x, 2, dim=-1)
    else:
        x1 = x[..., ::2]
        x2 = x[..., 1::2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    if is_neox_style:
        return torch.cat((o1, o2), dim=-1)
    return torch.stack((o1, o2), dim=-1).flatten(-2)


def sglang_rotary_forward_native(layer, positions, query, key):
    """``RotaryEmbedding.forward_native`` on full heads ``[tokens, heads * head_size]``."""
    positions = positions.flatten()
    cos_sin = layer.cos_sin_cache.index_select(0, positions)
    cos, sin = cos_sin.chunk(2, dim=-1)
    outputs = []
    for tensor in (query, key):
        shape = tensor.shape
        # SGLang's view(num_tokens, -1, head_size), which an empty batch would make ambiguous.
        tensor = tensor.unflatten(-1, (-1, layer.head_size))
        rot = tensor[..., : layer.rotary_dim]
        passthrough = tensor[..., layer.rotary_dim :]
        rot = sglang_apply_rotary_emb(rot, cos, sin, layer.is_neox_style)
        outputs.append(torch.cat((rot, passthrough), dim=-1).reshape(shape))
    return tuple(outputs)


# -- silu_and_mul ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("case", "dtype"), cases("silu_and_mul"))
def test_silu_and_mul_equals_sglang(case, dtype):
    contract = STANDARD_OPS["silu_and_mul"]
    inputs = make("silu_and_mul", case, dtype)
    (x,) = inputs.args
    before = x.clone()
    want = sglang_silu_and_mul(x)  # same strides: SIMD and scalar paths round differently
    got = contract.reference(inputs.obj, *inputs.args)
    assert got.dtype == dtype
    assert got.shape == (x.shape[0], x.shape[1] // 2)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert torch.equal(x, before), "silu_and_mul must not modify x"


# -- rms_norm -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("case", "dtype"), cases("rms_norm"))
def test_rms_norm_equals_sglang(case, dtype):
    contract = STANDARD_OPS["rms_norm"]
    inputs = make("rms_norm", case, dtype)
    obj = inputs.obj
    x = inputs.args[0]
    residual = inputs.args[1] if len(inputs.args) > 1 else None
    want = sglang_rms_norm(
        obj.weight, obj.variance_epsilon, x.clone(), None if residual is None else residual.clone()
    )
    x_before = x.clone()
    residual_before = None if residual is None else residual.clone()
    got = contract.reference(obj, *inputs.args)
    if residual is None:
        assert isinstance(got, torch.Tensor)
        assert got.dtype == dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert torch.equal(x, x_before), "rms_norm without residual must not modify x"
    else:
        out, new_residual = got
        assert out.dtype == dtype
        assert new_residual.dtype == dtype
        torch.testing.assert_close(out, want[0], rtol=0, atol=0)
        # The residual returned is (x + residual) rounded to the input dtype.
        torch.testing.assert_close(new_residual, want[1], rtol=0, atol=0)
        expected_sum = (x_before.float() + residual_before.float()).to(dtype)
        torch.testing.assert_close(new_residual, expected_sum, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_accumulates_in_float32(dtype):
    """A row whose squares overflow fp16 still normalises: statistics are fp32, not x.dtype."""
    contract = STANDARD_OPS["rms_norm"]
    from types import SimpleNamespace

    x = torch.full((2, 64), 300.0, dtype=dtype)  # 300**2 * 64 > fp16 max (65504)
    obj = SimpleNamespace(weight=torch.ones(64, dtype=dtype), variance_epsilon=1e-6)
    out = contract.reference(obj, x)
    torch.testing.assert_close(out, torch.ones_like(x), rtol=1e-2, atol=1e-2)
    assert torch.isfinite(out).all()


def test_rms_norm_residual_is_sum_in_input_dtype():
    contract = STANDARD_OPS["rms_norm"]
    from types import SimpleNamespace

    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.bfloat16)
    residual = torch.tensor([[0.5, 0.25, 0.125, 1000.0]], dtype=torch.bfloat16)
    obj = SimpleNamespace(weight=torch.full((4,), 2.0, dtype=torch.bfloat16), variance_epsilon=0.0)
    out, summed = contract.reference(obj, x, residual)
    assert summed.dtype == torch.bfloat16
    assert torch.equal(summed, (x.float() + residual.float()).to(torch.bfloat16))
    s = x.float() + residual.float()
    want = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True)) * 2.0).to(torch.bfloat16)
    assert torch.equal(out, want)


# -- rotary_embedding -----------------------------------------------------------------------------


def _full_heads(view: torch.Tensor, head_size: int) -> torch.Tensor:
    """The ``[tokens, heads, head_size]`` heads a (maybe partial) rotary view was cut from, where
    they lie (in their own tensor, or in a packed qkv buffer)."""
    tokens, heads, _ = view.shape
    return view.as_strided((tokens, heads, head_size), (view.stride(0), view.stride(1), 1))


@pytest.mark.parametrize(("case", "dtype"), cases("rotary_embedding"))
def test_rotary_embedding_equals_sglang(case, dtype):
    contract = STANDARD_OPS["rotary_embedding"]
    inputs = make("rotary_embedding", case, dtype)
    obj = inputs.obj
    query, key, cos, sin, positions = inputs.args
    inplace = inputs.kwargs["inplace"]
    assert inputs.kwargs["rotary_interleaved"] is (not obj.is_neox_style)
    query_full, key_full = _full_heads(query, obj.head_size), _full_heads(key, obj.head_size)
    # SGLang sees q/k flattened to [tokens, heads * head_size] and the whole cos_sin_cache.
    want_q, want_k = sglang_rotary_forward_native(
        obj,
        positions,
        query_full.flatten(1).clone(),
        key_full.flatten(1).clone(),
    )
    want_q = want_q.view_as(query_full)
    want_k = want_k.view_as(key_full)
    q_full_before, k_full_before = query_full.clone(), key_full.clone()
    cos_before, sin_before = cos.clone(), sin.clone()

    got_q, got_k = contract.reference(obj, *inputs.args, **inputs.kwargs)

    rotary_dim = obj.rotary_dim
    assert got_q.dtype == dtype
    assert got_k.dtype == dtype
    torch.testing.assert_close(got_q, want_q[..., :rotary_dim], rtol=0, atol=0)
    torch.testing.assert_close(got_k, want_k[..., :rotary_dim], rtol=0, atol=0)
    assert torch.equal(cos, cos_before)
    assert torch.equal(sin, sin_before)
    if inplace:
        # Written into the (maybe strided) views: the full heads now equal SGLang's output,
        # the pass-through columns are untouched, and the returned tensors are the inputs.
        assert got_q is query
        assert got_k is key
        torch.testing.assert_close(query_full, want_q, rtol=0, atol=0)
        torch.testing.assert_close(key_full, want_k, rtol=0, atol=0)
        assert torch.equal(query_full[..., rotary_dim:], q_full_before[..., rotary_dim:])
    else:
        assert torch.equal(query_full, q_full_before), "inplace=False must not touch query"
        assert torch.equal(key_full, k_full_before), "inplace=False must not touch key"
        assert got_q is not query
        assert got_k is not key
        assert query.numel() == 0 or got_q.data_ptr() != query.data_ptr()
        assert key.numel() == 0 or got_k.data_ptr() != key.data_ptr()


def test_partial_rotary_cases_use_strided_views():
    """The contract's partial-rotary cases really hand out non-contiguous views."""
    contract = STANDARD_OPS["rotary_embedding"]
    partial = [
        c
        for c in contract.cases
        if c.params["rotary_dim"] < c.params["head_size"] and c.params["tokens"] > 1
    ]
    assert partial
    for case in partial:
        inputs = make("rotary_embedding", case, torch.float32)
        query, key = inputs.args[:2]
        assert not query.is_contiguous(), case.name
        assert not key.is_contiguous(), case.name
        assert query.shape[-1] == case.params["rotary_dim"]


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_pairs_follow_style(interleaved):
    """A 90-degree rotation makes the pairing visible: halves for neox, neighbours for GPT-J."""
    contract = STANDARD_OPS["rotary_embedding"]
    from types import SimpleNamespace

    q = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])
    k = q.clone()
    cos = torch.zeros(1, 2)
    sin = torch.ones(1, 2)
    positions = torch.zeros(1, dtype=torch.int64)
    out_q, _ = contract.reference(
        SimpleNamespace(), q, k, cos, sin, positions, rotary_interleaved=interleaved, inplace=False
    )
    # interleaved pairs (1,2), (3,4) -> (-2, 1), (-4, 3);
    # neox pairs (1,3), (2,4) -> o1 = -x2 = (-3, -4), o2 = x1 = (1, 2)
    expected = [-2.0, 1.0, -4.0, 3.0] if interleaved else [-3.0, -4.0, 1.0, 2.0]
    assert out_q.flatten().tolist() == expected


def test_rotary_casts_cos_sin_to_query_dtype():
    """cos/sin in float32 with a bf16 query: computed in bf16 as SGLang's ``.to(x.dtype)``."""
    contract = STANDARD_OPS["rotary_embedding"]
    from types import SimpleNamespace

    generator = torch.Generator().manual_seed(0)
    q = torch.randn(3, 2, 8, generator=generator).to(torch.bfloat16)
    k = torch.randn(3, 1, 8, generator=generator).to(torch.bfloat16)
    cos = torch.randn(5, 4, generator=generator)
    sin = torch.randn(5, 4, generator=generator)
    positions = torch.tensor([4, 0, 2])
    got_q, got_k = contract.reference(SimpleNamespace(), q, k, cos, sin, positions, False, False)
    want_q = sglang_apply_rotary_emb(q, cos[positions], sin[positions], True)
    want_k = sglang_apply_rotary_emb(k, cos[positions], sin[positions], True)
    assert got_q.dtype == torch.bfloat16
    assert torch.equal(got_q, want_q)
    assert torch.equal(got_k, want_k)
