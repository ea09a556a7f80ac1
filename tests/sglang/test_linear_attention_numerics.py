"""The GDN family's references against transformers' own torch implementations (the oracle).

transformers 5.19's ``models/qwen3_next/modeling_qwen3_next.py`` computes Qwen3-Next's linear
attention in plain torch (``torch_chunk_gated_delta_rule``, ``torch_recurrent_gated_delta_rule``,
``causal_conv1d_fn``/``causal_conv1d_update``, ``Qwen3NextRMSNormGated``); its layout is
``[B, T, H, D]`` with states ``[B, HV, K, V]``, SGLang's (and the contracts') ``[N, HV, V, K]``.
Runs in the ``sglang`` session, whose venv has transformers.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from sglang_fl.ops import get_contract

M = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")

FP32 = dict(atol=1e-4, rtol=1e-4)


def ref(name):
    return get_contract(name).reference


def gdn_inputs(gen, tokens, h, hv, dk, dv, dtype=torch.float32):
    q = torch.randn(1, tokens, h, dk, generator=gen).to(dtype)
    k = torch.randn(1, tokens, h, dk, generator=gen).to(dtype)
    v = torch.randn(1, tokens, hv, dv, generator=gen).to(dtype)
    g = -0.5 * torch.rand(1, tokens, hv, generator=gen)
    beta = torch.sigmoid(torch.randn(1, tokens, hv, generator=gen))
    return q, k, v, g, beta


def hf_chunk(q, k, v, g, beta, state_vk=None):
    """transformers' chunked rule on SGLang-layout inputs; returns (o, state [HV, V, K])."""
    hv = v.shape[2]
    rep = hv // q.shape[2]
    qe, ke = (x.float().repeat_interleave(rep, dim=2) for x in (q, k))
    init = None if state_vk is None else state_vk.transpose(-1, -2).unsqueeze(0).float()
    o, final = M.torch_chunk_gated_delta_rule(
        qe,
        ke,
        v.float(),
        g=g,
        beta=beta,
        initial_state=init,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    return o, final[0].transpose(-1, -2)


@pytest.mark.parametrize("heads", [(2, 2, 16, 16), (2, 4, 16, 8), (1, 3, 8, 16)])
def test_chunk_matches_transformers_across_chunks(heads):
    h, hv, dk, dv = heads
    gen = torch.Generator().manual_seed(0)
    q, k, v, g, beta = gdn_inputs(gen, 150, h, hv, dk, dv)
    pool = 0.1 * torch.randn(3, hv, dv, dk, generator=gen)
    want_o, want_state = hf_chunk(q, k, v, g, beta, pool[2])
    untouched = pool[[0, 1]].clone()
    o, chunk_h, states = ref("chunk_gated_delta_rule")(
        None, q, k, v, g, beta, None, pool, torch.tensor([2]), torch.tensor([0, 150]), True
    )
    torch.testing.assert_close(o, want_o, **FP32)
    torch.testing.assert_close(states[2], want_state, **FP32)
    assert states is pool
    assert torch.equal(pool[[0, 1]], untouched)
    # h: the state before each of the 3 chunks; the first is the initial state.
    assert chunk_h.shape == (1, 3, hv, dv, dk)
    _, state_64 = hf_chunk(q[:, :64], k[:, :64], v[:, :64], g[:, :64], beta[:, :64], chunk_h[0, 0])
    torch.testing.assert_close(chunk_h[0, 1], state_64, **FP32)


def test_chunk_prefill_in_two_pieces_equals_one():
    gen = torch.Generator().manual_seed(1)
    q, k, v, g, beta = gdn_inputs(gen, 130, 2, 4, 16, 8)
    fn = ref("chunk_gated_delta_rule")
    whole = torch.zeros(1, 4, 8, 16)
    o_whole, _, _ = fn(
        None, q, k, v, g, beta, None, whole, torch.tensor([0]), torch.tensor([0, 130]), True
    )
    pieces = torch.zeros(1, 4, 8, 16)
    outs = []
    for s, e in ((0, 77), (77, 130)):
        o, _, _ = fn(
            None,
            q[:, s:e],
            k[:, s:e],
            v[:, s:e],
            g[:, s:e],
            beta[:, s:e],
            None,
            pieces,
            torch.tensor([0]),
            torch.tensor([0, e - s]),
            True,
        )
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs, dim=1), o_whole, **FP32)
    torch.testing.assert_close(pieces, whole, **FP32)


def test_chunk_varlen_batch_equals_each_sequence_alone():
    gen = torch.Generator().manual_seed(2)
    lens = (5, 0, 70, 1)
    q, k, v, g, beta = gdn_inputs(gen, sum(lens), 1, 3, 8, 16)
    pool = 0.1 * torch.randn(6, 3, 16, 8, generator=gen)
    before = pool.clone()
    slots = torch.tensor([4, 0, 1, 5])
    cu = torch.tensor([0, 5, 5, 75, 76])
    o, _, _ = ref("chunk_gated_delta_rule")(None, q, k, v, g, beta, None, pool, slots, cu, True)
    for i, slot in enumerate(slots.tolist()):
        s, e = int(cu[i]), int(cu[i + 1])
        if s == e:
            torch.testing.assert_close(pool[slot], before[slot], rtol=0, atol=0)
            continue
        want_o, want_state = hf_chunk(
            q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e], before[slot]
        )
        torch.testing.assert_close(o[:, s:e], want_o, **FP32)
        torch.testing.assert_close(pool[slot], want_state, **FP32)
    for slot in (2, 3):  # no sequence uses these slots
        assert torch.equal(pool[slot], before[slot])


def test_decode_paths_match_transformers_recurrent_step_by_step():
    """Prefill, then decode steps through both decode kernels, against transformers."""
    gen = torch.Generator().manual_seed(3)
    h, hv, dk, dv = 2, 4, 16, 8
    steps = 4
    hf_state = None
    packed_pool = torch.zeros(3, hv, dv, dk)
    sigmoid_pool = torch.zeros(3, hv, dv, dk)
    A_log = torch.log(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    dt_bias = torch.randn(hv, generator=gen)
    for _ in range(steps):
        q, k, v, _, _ = gdn_inputs(gen, 1, h, hv, dk, dv)
        a = torch.randn(1, hv, generator=gen)
        b = torch.randn(1, hv, generator=gen)
        g = -A_log.exp() * F.softplus(a + dt_bias)
        rep = hv // h
        o_hf, hf_state = M.torch_recurrent_gated_delta_rule(
            q.repeat_interleave(rep, 2),
            k.repeat_interleave(rep, 2),
            v,
            g=g.unsqueeze(0),
            beta=b.sigmoid().unsqueeze(0),
            initial_state=hf_state,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        mixed = torch.cat((q.reshape(1, -1), k.reshape(1, -1), v.reshape(1, -1)), dim=-1)
        out = torch.empty(1, 1, hv, dv)
        ref("fused_recurrent_gated_delta_rule_packed_decode")(
            None, mixed, a, b, A_log, dt_bias, dk**-0.5, packed_pool, out, torch.tensor([1]), True
        )
        o_sig, _ = ref("fused_sigmoid_gating_delta_rule_update")(
            None,
            A_log,
            a,
            dt_bias,
            1.0,
            20.0,
            q,
            k,
            v,
            b,
            sigmoid_pool,
            torch.tensor([2]),
            None,
            True,
            torch.tensor([0, 1]),
        )
        torch.testing.assert_close(out[:, 0], o_hf[:, 0], **FP32)
        torch.testing.assert_close(o_sig, o_hf, **FP32)
    want = hf_state[0].transpose(-1, -2)
    torch.testing.assert_close(packed_pool[1], want, **FP32)
    torch.testing.assert_close(sigmoid_pool[2], want, **FP32)
    assert not packed_pool[[0, 2]].any()
    assert not sigmoid_pool[[0, 1]].any()


def test_chunked_equals_token_by_token():
    gen = torch.Generator().manual_seed(4)
    q, k, v, g, beta = gdn_inputs(gen, 140, 2, 2, 16, 16)
    init = 0.1 * torch.randn(1, 2, 16, 16, generator=gen)
    cu = torch.tensor([0, 140])
    o_rec, final = ref("fused_recurrent_gated_delta_rule")(
        None, q, k, v, g, beta, None, init, True, cu, True
    )
    pool = init.clone()
    o_chunk, _, _ = ref("chunk_gated_delta_rule")(
        None, q, k, v, g, beta, None, pool, torch.tensor([0]), cu, True
    )
    torch.testing.assert_close(o_chunk, o_rec, **FP32)
    torch.testing.assert_close(pool, final, **FP32)


def test_conv_prefill_then_update_matches_transformers():
    gen = torch.Generator().manual_seed(5)
    dim, width, n = 12, 4, 13
    x = torch.randn(1, dim, n, generator=gen)
    weight = torch.randn(dim, width, generator=gen)
    bias = torch.randn(dim, generator=gen)
    want = M.causal_conv1d_fn(x, weight, bias, activation="silu")
    pool = torch.randn(2, dim, width - 1, generator=gen)
    fn, update = ref("causal_conv1d_fn"), ref("causal_conv1d_update")
    out, _ = fn(
        None,
        x[0, :, :10],
        weight,
        bias,
        pool,
        torch.tensor([0, 10]),
        [10],
        torch.tensor([1]),
        torch.tensor([False]),
        "silu",
    )
    torch.testing.assert_close(out, want[0, :, :10], **FP32)
    for t in range(10, n):
        step, _ = update(None, x[:, :, t], pool, weight, bias, "silu", torch.tensor([1]))
        torch.testing.assert_close(step, want[:, :, t], **FP32)
    torch.testing.assert_close(pool[1], x[0, :, n - width + 1 :], rtol=0, atol=0)
    # transformers' update on its own state agrees too
    hf_state = x[:, :, 10 - width + 1 : 10].clone()
    hf = M.causal_conv1d_update(x[:, :, 10:], hf_state, weight, bias, activation="silu")
    torch.testing.assert_close(hf, want[:, :, 10:], **FP32)


def test_gating_and_norm_match_transformers():
    gen = torch.Generator().manual_seed(6)
    a, b = 6 * torch.randn(9, 4, generator=gen), torch.randn(9, 4, generator=gen)
    A_log, dt_bias = torch.randn(4, generator=gen), torch.randn(4, generator=gen)
    g, beta = ref("fused_gdn_gating")(None, A_log, a, b, dt_bias)
    torch.testing.assert_close(g[0], -A_log.exp() * F.softplus(a + dt_bias))
    torch.testing.assert_close(beta[0], b.sigmoid())
    norm = M.Qwen3NextRMSNormGated(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(16, generator=gen))
    x, z = torch.randn(5, 16, generator=gen), torch.randn(5, 16, generator=gen)
    obj = SimpleNamespace(weight=norm.weight.detach(), eps=1e-6, activation="silu")
    torch.testing.assert_close(ref("rms_norm_gated")(obj, x, z), norm(x, z))


def test_split_matches_sglangs_torch_reshuffle():
    """The fused split equals Qwen3-Next's ``fix_query_key_value_ordering`` + cat (what SGLang
    does for ratios outside {1, 2, 4}), written out here."""
    gen = torch.Generator().manual_seed(7)
    h, hv, dk, dv, t = 2, 6, 8, 4, 5
    r = hv // h
    qkvz = torch.randn(t, h * (2 * dk + 2 * r * dv), generator=gen)
    ba = torch.randn(t, h * 2 * r, generator=gen)
    mixed, z, b, a = ref("fused_qkvzba_split_reshape_cat")(None, qkvz, ba, h, hv, dk, dv)
    grouped = qkvz.view(t, h, -1)
    q, k, v, zz = torch.split(grouped, [dk, dk, r * dv, r * dv], dim=2)
    bb, aa = torch.split(ba.view(t, h, -1), [r, r], dim=2)
    want = torch.cat((q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)), dim=-1)
    assert torch.equal(mixed, want)
    assert torch.equal(z, zz.reshape(t, hv, dv))
    assert torch.equal(b, bb.reshape(t, hv))
    assert torch.equal(a, aa.reshape(t, hv))


def test_contiguous_split_matches_transformers_qwen3_5_projections():
    """Qwen3.5's split recovers what transformers' ``Qwen3_5GatedDeltaNet`` projects
    separately (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``), which SGLang
    concatenates into ``[q | k | v | z]`` and ``[b | a]``."""
    gen = torch.Generator().manual_seed(9)
    h, hv, dk, dv, t = 2, 4, 8, 4, 6
    qkv = torch.randn(t, 2 * h * dk + hv * dv, generator=gen)
    zz = torch.randn(t, hv * dv, generator=gen)
    bb, aa = torch.randn(t, hv, generator=gen), torch.randn(t, hv, generator=gen)
    wide = torch.cat((qkv, zz, torch.zeros(t, 3)), dim=-1)[:, : qkv.shape[1] + zz.shape[1]]
    fn = ref("fused_qkvzba_split_reshape_cat_contiguous")
    mixed, z, b, a = fn(None, wide, torch.cat((bb, aa), dim=-1), h, hv, dk, dv)
    assert torch.equal(mixed, qkv)
    assert torch.equal(z, zz.reshape(t, hv, dv))
    assert torch.equal(b, bb)
    assert torch.equal(a, aa)
    with pytest.raises(ValueError, match="multiple of num_heads_qk"):
        fn(None, wide, torch.cat((bb, aa), dim=-1), 3, hv, dk, dv)


def test_sigmoid_mul_matches_transformers_qwen3_5_attention_gate():
    """``Qwen3_5Attention``: ``attn_output * torch.sigmoid(gate)``, gate from the per-head
    ``[q | gate]`` chunk reshaped to ``[T, hidden]``."""
    gen = torch.Generator().manual_seed(10)
    q_gate = torch.randn(7, 3, 2 * 8, generator=gen)
    _, gate = torch.chunk(q_gate, 2, dim=-1)
    attn = torch.randn(7, 24, generator=gen)
    want = attn * torch.sigmoid(gate.reshape(7, -1))
    fn = ref("fused_sigmoid_mul")
    torch.testing.assert_close(fn(None, attn, gate), want, **FP32)
    torch.testing.assert_close(fn(None, attn, gate.reshape(7, -1)), want, **FP32)
    with pytest.raises(ValueError, match="heads \\* head_dim"):
        fn(None, attn[:, :16], gate)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_within_contract_tolerance_of_fp32(dtype):
    """Low-precision inputs (fp32 state) stay within the contract's tolerance of the fp32 run
    on the same (rounded) values, over two chunks and a decode step."""
    gen = torch.Generator().manual_seed(8)
    q, k, v, g, beta = gdn_inputs(gen, 100, 2, 4, 16, 8, dtype)
    tol = get_contract("chunk_gated_delta_rule").tolerance(dtype)
    fn = ref("chunk_gated_delta_rule")
    lo_pool, hi_pool = torch.zeros(1, 4, 8, 16), torch.zeros(1, 4, 8, 16)
    args = (torch.tensor([0]), torch.tensor([0, 100]), True)
    o_lo, h_lo, _ = fn(None, q, k, v, g, beta, None, lo_pool, *args)
    o_hi, _, _ = fn(None, q.float(), k.float(), v.float(), g, beta, None, hi_pool, *args)
    assert o_lo.dtype == dtype
    assert h_lo.dtype == dtype
    torch.testing.assert_close(o_lo.float(), o_hi, atol=tol.atol, rtol=tol.rtol)
    torch.testing.assert_close(lo_pool, hi_pool, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize(
    ("op", "call"),
    [
        (
            "chunk_gated_delta_rule",
            lambda fn, pool: fn(
                None,
                *gdn_inputs(torch.Generator().manual_seed(0), 3, 1, 1, 8, 8),
                None,
                pool,
                torch.tensor([3]),
                torch.tensor([0, 3]),
                True,
            ),
        ),
        (
            "fused_recurrent_gated_delta_rule_packed_decode",
            lambda fn, pool: fn(
                None,
                torch.randn(1, 24),
                torch.randn(1, 1),
                torch.randn(1, 1),
                torch.zeros(1),
                torch.zeros(1),
                1.0,
                pool,
                torch.empty(1, 1, 1, 8),
                torch.tensor([-2]),
                True,
            ),
        ),
        (
            "fused_sigmoid_gating_delta_rule_update",
            lambda fn, pool: fn(
                None,
                torch.zeros(1),
                torch.randn(1, 1),
                torch.zeros(1),
                1.0,
                20.0,
                *gdn_inputs(torch.Generator().manual_seed(0), 1, 1, 1, 8, 8)[:3],
                torch.randn(1, 1),
                pool,
                torch.tensor([7]),
                None,
                True,
                torch.tensor([0, 1]),
            ),
        ),
    ],
)
def test_state_index_outside_the_pool_is_an_error_naming_the_op(op, call):
    pool = torch.randn(3, 1, 8, 8)
    before = pool.clone()
    with pytest.raises(
        IndexError, match=rf"{op}: state index -?\d+ .* outside the state pool of 3"
    ):
        call(ref(op), pool)
    assert torch.equal(pool, before)
