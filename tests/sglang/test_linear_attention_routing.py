"""The GDN routes' argument translation and their per-call declines (no engine needed).

A hook is called the way SGLang 0.5.23's GDN backend calls the function it replaces
(``gdn_backend.py``, ``kernels/gdn_triton.py``); calls outside the op's contract go to SGLang's
own function; an implementation declining a call hands it to the next candidate, and the first
decline per implementation and reason is a ``function`` record naming both and the reason, and
the first call a ``called`` record naming the implementation that served it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from sglang_fl import Unsupported
from sglang_fl.dispatch.binder import FallbackChain
from sglang_fl.dispatch.types import BackendImplKind, OpImpl
from sglang_fl.dispatch_report import DispatchReport, read_log
from sglang_fl.integrations.sglang.function_routes import report_declines, report_first_call
from sglang_fl.integrations.sglang.linear_attention import GDN_ROUTES
from sglang_fl.ops import get_contract

ROUTES = {
    route.target.removeprefix(route.target.rsplit(".", 2)[0] + "."): route for route in GDN_ROUTES
}  # "chunk.chunk_gated_delta_rule", "FusedRMSNormGated.forward", ...


def sglang_original(*args: Any, **kwargs: Any) -> str:
    return "sglang's own"


def test_every_gdn_op_has_a_route() -> None:
    from sglang_fl.ops.linear_attention import LINEAR_ATTENTION_OPS

    # fused_sigmoid_mul: Qwen3.5's full-attention output gate, routed with the GDN functions.
    ops = {c.name for c in LINEAR_ATTENTION_OPS} | {"fused_sigmoid_mul"}
    assert ops == {r.op_name for r in GDN_ROUTES}


def test_sigmoid_mul_hook_serves_in_place_and_leaves_fp8_to_sglang() -> None:
    """As ``models/qwen3_5.py`` calls it: ``(attn_output, gate, inplace=True)``, the gate the
    second half of each head's ``[q | gate]``; ``quant=True`` (FP8 output) is SGLang's."""
    hook = ROUTES["elementwise.fused_sigmoid_mul"].adapt(
        get_contract("fused_sigmoid_mul").reference
    )
    gen = torch.Generator().manual_seed(3)
    q_gate = torch.randn(5, 2, 2 * 8, generator=gen)
    gate = q_gate[..., 8:]
    attn = torch.randn(5, 16, generator=gen)
    want = attn * torch.sigmoid(gate.reshape(5, 16))
    out = hook(sglang_original, attn, gate, inplace=True)
    assert out is attn
    torch.testing.assert_close(attn, want)
    fresh = torch.randn(5, 16, generator=gen)
    kept = fresh.clone()
    torch.testing.assert_close(
        hook(sglang_original, fresh, gate), kept * torch.sigmoid(gate.reshape(5, 16))
    )
    assert torch.equal(fresh, kept)
    assert hook(sglang_original, attn, gate, quant=True) == "sglang's own"


def test_contiguous_split_hook_translates_sglangs_positional_call() -> None:
    hook = ROUTES["triton_gdn_fused_proj.fused_qkvzba_split_reshape_cat_contiguous"].adapt(
        get_contract("fused_qkvzba_split_reshape_cat_contiguous").reference
    )
    qkvz, ba = torch.arange(3 * 96.0).reshape(3, 96), torch.arange(3 * 8.0).reshape(3, 8)
    mixed, z, b, a = hook(sglang_original, qkvz, ba, 2, 4, 8, 8)
    assert torch.equal(mixed, qkvz[:, :64])
    assert torch.equal(z, qkvz[:, 64:].reshape(3, 4, 8))
    assert torch.equal(b, ba[:, :4])
    assert torch.equal(a, ba[:, 4:])


def test_chunk_hook_returns_sglangs_triple_and_updates_the_pool() -> None:
    contract = get_contract("chunk_gated_delta_rule")
    case = next(c for c in contract.cases if c.params["lens"] == (7, 0, 33))
    inputs = contract.make_inputs(case, torch.float32, torch.device("cpu"), torch.Generator())
    want_o, want_h, want_pool = contract.reference(
        None, *(x.clone() for x in inputs.args), **{
            k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.kwargs.items()
        }
    )  # fmt: skip
    hook = ROUTES["chunk.chunk_gated_delta_rule"].adapt(contract.reference)
    kw = inputs.kwargs
    q, k, v, g, beta = inputs.args
    # As TritonGDNKernel.extend calls it: keywords, head_first=False.
    o, final, h = hook(
        sglang_original, q=q, k=k, v=v, g=g, beta=beta, initial_state=kw["initial_state"],
        initial_state_indices=kw["initial_state_indices"], cu_seqlens=kw["cu_seqlens"],
        head_first=False, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    assert final is None
    torch.testing.assert_close(o, want_o)
    torch.testing.assert_close(h, want_h)
    torch.testing.assert_close(kw["initial_state"], want_pool)
    assert hook(sglang_original, q, k, v, g, beta, head_first=True) == "sglang's own"


def test_out_of_contract_options_go_to_sglangs_function() -> None:
    x = torch.zeros(2, 4)
    update = ROUTES["causal_conv1d_triton.causal_conv1d_update"].adapt(
        lambda *a: pytest.fail("not ours")
    )
    assert update(sglang_original, x, x, x, intermediate_conv_window=x) == "sglang's own"
    sigmoid = ROUTES["fused_sigmoid_gating_recurrent.fused_sigmoid_gating_delta_rule_update"].adapt(
        lambda *a: pytest.fail("not ours")
    )
    args = (x,) * 3 + (1.0, 20.0) + (x,) * 6
    assert sigmoid(sglang_original, *args, disable_state_update=True) == "sglang's own"
    assert sigmoid(sglang_original, *args, is_kda=True) == "sglang's own"
    norm = ROUTES["FusedRMSNormGated.forward"].adapt(lambda *a: pytest.fail("not ours"))
    assert norm(sglang_original, object(), x, x, residual=x) == "sglang's own"


def test_a_decline_is_reported_once_and_the_next_candidate_serves(tmp_path: Path) -> None:
    contract = get_contract("fused_recurrent_gated_delta_rule_packed_decode")
    calls = []

    def vendor(obj: Any, mixed_qkv: torch.Tensor, a: torch.Tensor, *rest: Any) -> Any:
        heads_v = a.shape[1]
        calls.append(heads_v)
        if heads_v % 4:
            raise Unsupported(f"acme: {heads_v} value heads; the kernel needs a multiple of 4")
        return contract.reference(obj, mixed_qkv, a, *rest)

    chain = [
        OpImpl(contract.name, "vendor.acme.gdn", BackendImplKind.VENDOR, vendor, vendor="acme"),
        OpImpl(contract.name, "reference.gdn", BackendImplKind.REFERENCE, contract.reference),
    ]
    log = tmp_path / "dispatch.jsonl"
    route = ROUTES["fused_recurrent.fused_recurrent_gated_delta_rule_packed_decode"]
    report = DispatchReport(log)
    declines = report_declines(report, route.target)
    called = report_first_call(report, route.target)
    hook = route.adapt(
        FallbackChain(contract.name, chain, on_decline=declines, on_first_call=called).fn
    )
    for case in contract.cases:
        inputs = contract.make_inputs(case, torch.float32, torch.device("cpu"), torch.Generator())
        expect = contract.make_inputs(case, torch.float32, torch.device("cpu"), torch.Generator())
        out, pool = hook(sglang_original, *inputs.args, **inputs.kwargs)
        want_out, want_pool = contract.reference(None, *expect.args, **expect.kwargs)
        torch.testing.assert_close(out, want_out)
        torch.testing.assert_close(pool, want_pool)
    assert set(calls) == {2, 3, 4}  # heads of the cases: 2 and 3 declined, 4 served
    rows = [r for r in read_log(log) if r["event"] == "function"]
    assert [(r["declined_by"], r["served_by"]) for r in rows] == [
        ("vendor.acme.gdn", "reference.gdn"),
        ("vendor.acme.gdn", "reference.gdn"),
    ]
    assert {r["reason"] for r in rows} == {
        "acme: 2 value heads; the kernel needs a multiple of 4",
        "acme: 3 value heads; the kernel needs a multiple of 4",
    }
    assert {r["op"] for r in rows} == {contract.name}
    # What was called, once: the first case's call, served by whoever took it.
    first = "vendor.acme.gdn" if calls[0] % 4 == 0 else "reference.gdn"
    (record,) = [r for r in read_log(log) if r["event"] == "called"]
    assert (record["function"], record["op"], record["impl_id"]) == (
        route.target,
        contract.name,
        first,
    )
    assert record["runner"] == "sglang-fl"


def test_one_layer_and_all_layer_track_hooks_copy_the_same_rows() -> None:
    contract = get_contract("track_mamba_states")
    one = ROUTES["mamba_state_scatter_triton.track_mamba_states_if_needed"].adapt(
        contract.reference
    )
    every = ROUTES["mamba_state_scatter_triton.track_mamba_states_all_layers"].adapt(
        contract.reference
    )
    gen = torch.Generator().manual_seed(0)
    conv, ssm = torch.randn(2, 6, 4, 3, generator=gen), torch.randn(2, 6, 2, 4, generator=gen)
    per_layer = [(conv[i].clone(), ssm[i].clone()) for i in range(2)]
    index = (torch.tensor([1, 2, 3]), torch.tensor([True, False, True]), torch.tensor([4, 5, 0]))
    every(sglang_original, conv, ssm, *index, 3)
    for layer, (c, s) in enumerate(per_layer):
        one(sglang_original, c, s, *index, 3)  # [N, ...] pools: one layer's
        torch.testing.assert_close(c, conv[layer], rtol=0, atol=0)
        torch.testing.assert_close(s, ssm[layer], rtol=0, atol=0)
        assert torch.equal(c[4], c[1])  # tracked rows copied to their slots
        assert torch.equal(c[0], c[3])
        assert not torch.equal(c[5], c[2])  # the untracked row: its slot untouched
    assert one(sglang_original, c, s, *index, 3, check_freed_slots=True) == "sglang's own"
