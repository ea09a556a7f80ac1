"""The Ascend GDN adapters against the ``sgl_kernel_npu`` double (no NPU).

Every case and dtype of each served op runs through core's conformance check (the gating in the
three forms sgl_kernel_npu has had); then the calls themselves, what is declined before any call
(and why), the signature probe against releases this wheel does not know, and the double's
constraints.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch
from sgl_kernel_npu_double import (
    CausalConv1d,
    Chunk,
    FlaUtils,
    FusedChunk,
    FusedGdnGating,
    LayernormGated,
    Recurrent,
    RecurrentDecode,
    SglKernelNpuDouble,
    install_sgl_kernel_npu,
)
from sglang_fl_ascend import plugin
from sglang_fl_ascend.backend import SGL_KERNEL_NPU, TORCH_NPU, SglKernelNpuBackend
from sglang_fl_ascend.impl import linear_attention as gdn
from torch_npu_double import TorchNpuDouble

from sglang_fl import Unsupported
from sglang_fl.ops import OpCase, get_contract
from sglang_fl.testing.checks import PASSED, SKIPPED, check_case
from sglang_fl.testing.doubles import constraint_tests, install_double
from sglang_fl.testing.vendor import VendorSuite

SUITE = VendorSuite("ascend", plugin.sglang_fl_register_ops)
CASES = [p for p in SUITE.contract_cases() if p.values[0] in gdn.ADAPTERS]
FORMS = ("with-sigmoid", "flat", "g-only")


@pytest.fixture(params=FORMS)
def release(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> SglKernelNpuDouble:
    """The double in each gating form sgl_kernel_npu has had (main, #747, the one without b)."""
    return install_sgl_kernel_npu(monkeypatch, SglKernelNpuDouble(gating=request.param))


def test_registers_the_gdn_adapters_under_their_own_probe() -> None:
    for op, fn in gdn.ADAPTERS.items():
        impl = SUITE.implementations[op]
        assert impl.fn is fn
        assert impl.impl_id == "vendor.ascend"
        assert isinstance(getattr(impl.available, "__self__", None), SglKernelNpuBackend)
    assert set(gdn.NO_KERNEL).isdisjoint(gdn.ADAPTERS)
    # The ten GDN ops and Qwen3.5's two (its contiguous split, the attention output gate).
    assert len(set(gdn.NO_KERNEL) | set(gdn.ADAPTERS)) == 12


def declined(op: str, p: Mapping[str, Any]) -> bool:
    """What the kernels cannot serve: non-power-of-two Triton ranges (the splits), a sigmoid
    gate (the norm), a bias or several tokens (the conv update's torch path)."""
    if op == "fused_qkvzba_split_reshape_cat":
        h, hv, dk, dv = p["heads"]
        return not all(n & (n - 1) == 0 for n in (dk, hv // h * dv, hv // h))
    if op == "fused_qkvzba_split_reshape_cat_contiguous":
        return p["heads"][1] & (p["heads"][1] - 1) != 0
    if op == "rms_norm_gated":
        return p["activation"] == "sigmoid"
    if op == "causal_conv1d_update":
        return bool(p.get("bias")) or any(n > 1 for n in p["lens"])
    return False


def declined_before_747(op: str, p: Mapping[str, Any], dtype: torch.dtype) -> bool:
    """The delta rule on main's kernels: two value heads per decode program, no float32
    chunked prefill."""
    if op == "fused_sigmoid_gating_delta_rule_update":
        return p["heads"][1] % 2 == 1
    if op == "chunk_gated_delta_rule":
        return dtype == torch.float32
    return declined(op, p)


def calls(op: str, p: Mapping[str, Any]) -> int:
    """Kernel calls of a served case: none for an empty one; the prefill conv one per group of
    sequences (continuing a state, starting afresh) that has live sequences."""
    if op == "causal_conv1d_fn":
        lens = p["lens"]
        initial = p.get("initial", tuple(i % 2 == 0 for i in range(len(lens))))
        live = [i for i, n in enumerate(lens) if n and not (p.get("padding") and i == 1)]
        return len({initial[i] for i in live})
    rows = p.get("tokens", len(p.get("lens", ())))
    return int(rows > 0)


@pytest.mark.parametrize(("op", "case", "dtype"), CASES)
def test_contract_case(
    sgl_kernel_npu: SglKernelNpuDouble, op: str, case: OpCase, dtype: torch.dtype
) -> None:
    outcome = check_case(SUITE.implementations[op], case, dtype)
    expected = SKIPPED if declined_before_747(op, case.params, dtype) else PASSED
    assert outcome.status == expected, outcome.message
    assert len(sgl_kernel_npu.calls) == (calls(op, case.params) if expected == PASSED else 0)


DELTA_RULE = ("fused_sigmoid_gating_delta_rule_update", "chunk_gated_delta_rule")
DELTA_CASES = [p for p in CASES if p.values[0] in DELTA_RULE]


@pytest.mark.parametrize(("op", "case", "dtype"), DELTA_CASES)
def test_the_delta_rule_on_the_unified_release(
    monkeypatch: pytest.MonkeyPatch, op: str, case: OpCase, dtype: torch.dtype
) -> None:
    """sgl-kernel-npu #747/#740 on an Ascend 950 (float32 states): the decode-optimised kernel
    for one token per sequence, the fused chunked operator (bfloat16, L2-normalised q/k)."""
    install_double(monkeypatch, TorchNpuDouble(soc_version=260), TORCH_NPU)
    double = install_sgl_kernel_npu(
        monkeypatch, SglKernelNpuDouble(release="unified", soc_version=260)
    )
    outcome = check_case(SUITE.implementations[op], case, dtype)
    p = case.params
    if op == "chunk_gated_delta_rule":
        refused = dtype != torch.bfloat16 or not p.get("l2norm", True)
    else:
        refused = p["heads"][1] % 2 == 1 and any(n != 1 for n in p["lens"])
    assert outcome.status == (SKIPPED if refused else PASSED), outcome.message
    live = any(p["lens"])
    assert len(double.calls) == int(live and not refused)
    if live and not refused and op != "chunk_gated_delta_rule":
        one_token = all(n == 1 for n in p["lens"])
        expected = "_decode_npu" if one_token else "_update_npu"
        assert double.calls[0].name.endswith(expected)


GATING_CASES = [p for p in CASES if p.values[0] == "fused_gdn_gating"]


@pytest.mark.parametrize(("op", "case", "dtype"), GATING_CASES)
def test_the_gating_in_every_form(
    release: SglKernelNpuDouble, op: str, case: OpCase, dtype: torch.dtype
) -> None:
    outcome = check_case(SUITE.implementations[op], case, dtype)
    assert outcome.status == PASSED, outcome.message
    assert release.called == (["fused_gdn_gating_npu"] if case.params["tokens"] else [])


def test_strided_rows_are_packed_for_the_dense_kernel(sgl_kernel_npu: SglKernelNpuDouble) -> None:
    a = torch.randn(5, 8)[:, ::2]
    b = torch.randn(5, 4)
    g, beta = gdn.fused_gdn_gating(None, torch.rand(4), a, b, torch.randn(4))
    (call,) = sgl_kernel_npu.calls
    assert call.args[1].is_contiguous()
    torch.testing.assert_close(call.args[1], a)
    assert g.shape == beta.shape == (1, 5, 4)
    assert g.dtype == beta.dtype == torch.float32


def test_the_release_without_b_gets_no_b(monkeypatch: pytest.MonkeyPatch) -> None:
    """Passing b where that release reads dt_bias would be silently wrong: the probe sees its
    five parameters and the adapter computes sigmoid(b) itself."""
    double = install_sgl_kernel_npu(monkeypatch, SglKernelNpuDouble(gating="g-only"))
    a, b, dt_bias = torch.randn(3, 4), torch.randn(3, 4), torch.randn(4)
    _, beta = gdn.fused_gdn_gating(None, torch.rand(4), a, b, dt_bias)
    (call,) = double.calls
    assert len(call.args) == 5
    assert call.args[2] is dt_bias or torch.equal(call.args[2], dt_bias)
    torch.testing.assert_close(beta[0], torch.sigmoid(b))


def test_the_gating_refuses_a_shape_it_cannot_serve(sgl_kernel_npu: SglKernelNpuDouble) -> None:
    with pytest.raises(Unsupported, match=r"\[T, HV\]"):
        gdn.fused_gdn_gating(
            None, torch.rand(4), torch.randn(2, 3, 4), torch.randn(2, 3, 4), torch.randn(4)
        )
    assert sgl_kernel_npu.calls == []


def test_an_unknown_signature_is_declined_naming_what_was_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    double = install_sgl_kernel_npu(monkeypatch, SglKernelNpuDouble())
    gating = double.submodules["sgl_kernel_npu.fla.fused_gdn_gating"]

    def fused_gdn_gating_npu(
        A_log: Any, a: Any, b: Any, dt_bias: Any, beta: Any, threshold: Any, *, scale: Any
    ) -> Any:
        raise AssertionError("never called")

    monkeypatch.setattr(gating, "fused_gdn_gating_npu", fused_gdn_gating_npu)
    with pytest.raises(
        Unsupported, match=r"no call form of fused_gdn_gating this wheel knows"
    ) as info:
        gdn.fused_gdn_gating(
            None, torch.rand(4), torch.randn(3, 4), torch.randn(3, 4), torch.randn(4)
        )
    assert "also requires scale" in str(info.value)
    assert "fused_gdn_gating.py:80-137" in str(info.value)


@pytest.mark.parametrize(
    ("missing", "op", "message"),
    [
        ("layer_norm_fwd_npu", "rms_norm_gated", "layer_norm_fwd_npu is missing"),
        ("causal_conv1d_update_npu", "causal_conv1d_update", "causal_conv1d_update_npu is missing"),
    ],
)
def test_a_release_without_a_function_declines_its_op(
    monkeypatch: pytest.MonkeyPatch, missing: str, op: str, message: str
) -> None:
    install_sgl_kernel_npu(monkeypatch, SglKernelNpuDouble(missing=(missing,)))
    contract = get_contract(op)
    case = contract.cases[1]
    outcome = check_case(SUITE.implementations[op], case, torch.bfloat16)
    assert outcome.status == SKIPPED
    assert message in outcome.message


def test_a_release_without_a_module_declines_its_ops(
    monkeypatch: pytest.MonkeyPatch, sgl_kernel_npu: SglKernelNpuDouble
) -> None:
    monkeypatch.delitem(__import__("sys").modules, "sgl_kernel_npu.fla.utils")
    with pytest.raises(Unsupported, match=r"sgl_kernel_npu.fla.utils does not import"):
        gdn.fused_qkvzba_split_reshape_cat(None, torch.zeros(2, 64), torch.zeros(2, 4), 2, 2, 8, 8)
    assert sgl_kernel_npu.calls == []


def test_the_split_declines_ranges_triton_cannot_build(sgl_kernel_npu: SglKernelNpuDouble) -> None:
    qkvz, ba = torch.zeros(3, 2 * (2 * 8 + 2 * 3 * 16)), torch.zeros(3, 12)
    with pytest.raises(Unsupported, match=r"powers of two, got \{'r \* head_v': 48, 'r': 3\}"):
        gdn.fused_qkvzba_split_reshape_cat(None, qkvz, ba, 2, 6, 8, 16)
    assert sgl_kernel_npu.calls == []


def norm_layer(**options: Any) -> Any:
    from types import SimpleNamespace

    base = {
        "weight": torch.ones(16),
        "eps": 1e-6,
        "activation": "swish",
        "group_size": None,
        "norm_before_gate": True,
    }
    return SimpleNamespace(**{**base, **options})


def test_the_norm_is_called_as_sglang_calls_it(sgl_kernel_npu: SglKernelNpuDouble) -> None:
    x = torch.randn(16, 5).t()  # columns of unit stride: packed for the kernel
    gate = torch.randn(5, 16)
    gdn.rms_norm_gated(norm_layer(), x, gate)
    (call,) = sgl_kernel_npu.calls
    assert call.name == "layer_norm_fwd_npu"
    assert call.args[0].stride(-1) == 1
    assert call.args[2] is None  # no bias
    assert call.kwargs["z"] is gate
    assert call.kwargs["is_rms_norm"] is True


def test_the_norm_declines_a_sigmoid_gate_and_oversized_groups(
    sgl_kernel_npu: SglKernelNpuDouble,
) -> None:
    x = torch.randn(3, 16)
    with pytest.raises(Unsupported, match=r"SiLU only.*not 'sigmoid'"):
        gdn.rms_norm_gated(norm_layer(activation="sigmoid"), x, x)
    with pytest.raises(Unsupported, match=r"groups that divide the row"):
        gdn.rms_norm_gated(norm_layer(group_size=5), x, x)
    assert sgl_kernel_npu.calls == []


def conv_pool(slots: int, dim: int = 8, width: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(slots, dim, width - 1, generator=g), torch.randn(dim, width, generator=g)


def test_the_conv_update_leaves_pad_rows_out_of_the_call(
    sgl_kernel_npu: SglKernelNpuDouble,
) -> None:
    """Its torch path indexes the pool with every index: -1 would write the last slot."""
    pool, weight = conv_pool(5)
    before = pool.clone()
    x = torch.randn(3, 8)
    indices = torch.tensor([3, -1, 0], dtype=torch.int32)
    out, _ = gdn.causal_conv1d_update(None, x, pool, weight, None, "silu", indices)
    (call,) = sgl_kernel_npu.calls
    assert call.kwargs["conv_state_indices"].tolist() == [3, 0]
    assert torch.equal(out[1], torch.zeros(8))
    assert torch.equal(pool[4], before[4])  # the last slot, which -1 would have written
    reference = get_contract("causal_conv1d_update").reference
    expected_pool = before.clone()
    expected, _ = reference(None, x, expected_pool, weight, None, "silu", indices)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(pool, expected_pool)


def test_the_conv_update_declines_a_bias_and_several_tokens(
    sgl_kernel_npu: SglKernelNpuDouble,
) -> None:
    pool, weight = conv_pool(4)
    indices = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(Unsupported, match=r"ignores bias"):
        gdn.causal_conv1d_update(
            None, torch.randn(2, 8), pool, weight, torch.ones(8), None, indices
        )
    with pytest.raises(Unsupported, match=r"one token per request, got 3"):
        gdn.causal_conv1d_update(None, torch.randn(2, 8, 3), pool, weight, None, None, indices)
    assert sgl_kernel_npu.calls == []


def test_the_prefill_conv_splits_fresh_and_continuing_sequences(
    sgl_kernel_npu: SglKernelNpuDouble,
) -> None:
    """One call for each: in a mixed call the kernel gathers a fresh sequence's final state
    at its un-prefixed offsets inside the prefixed input (the double computes it as the
    kernel does). Empty and pad sequences never reach it."""
    pool, weight = conv_pool(6)
    lens = [5, 0, 7, 3, 2]
    x = torch.randn(sum(lens), 8).t()
    qsl = torch.tensor([0, 5, 5, 12, 15, 17], dtype=torch.int32)
    slots = torch.tensor([1, 2, 3, -1, 5], dtype=torch.int32)
    initial = torch.tensor([True, True, False, True, False])
    args = (x, weight, None, pool, qsl, lens, slots, initial, "silu")
    expected_pool = pool.clone()
    expected, _ = get_contract("causal_conv1d_fn").reference(
        None, *args[:3], expected_pool, *args[4:]
    )
    out, _ = gdn.causal_conv1d_fn(None, *args)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(pool, expected_pool)
    first, second = sgl_kernel_npu.calls
    assert first.kwargs["cache_indices"].tolist() == [1]  # continuing: 5 tokens
    assert first.kwargs["has_initial_state"].tolist() == [True]
    assert second.kwargs["cache_indices"].tolist() == [3, 5]  # fresh: 7 and 2 tokens
    assert second.kwargs["query_start_loc"].tolist() == [0, 7, 9]
    assert second.args[0].shape == (8, 9)


def test_a_mixed_call_would_misplace_the_fresh_final_state() -> None:
    """Why the adapter splits: the double, computing as the kernel does, gets a fresh
    sequence's final state wrong in a call that mixes it with a continuing one."""
    double = CausalConv1d([])
    pool, weight = conv_pool(2)
    x = torch.randn(8, 10)
    qsl = torch.tensor([0, 4, 10], dtype=torch.int32)
    indices = torch.tensor([0, 1], dtype=torch.int32)
    initial = torch.tensor([True, False])
    expected_pool = pool.clone()
    get_contract("causal_conv1d_fn").reference(
        None, x, weight, None, expected_pool, qsl, [4, 6], indices, initial, "silu"
    )
    double.causal_conv1d_fn_npu(x, weight, None, qsl, indices, initial, pool, "silu")
    torch.testing.assert_close(pool[0], expected_pool[0])  # the continuing one is right
    assert not torch.allclose(pool[1], expected_pool[1])  # the fresh one is not


def decode_inputs(heads_v: int = 2, pool: int = 5) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(2, 1, 3, 1, 8, generator=g)
    v = torch.randn(1, 3, heads_v, 4, generator=g)
    a, b = torch.randn(2, 3, heads_v, generator=g)
    states = torch.randn(pool, heads_v, 4, 8, generator=g)
    indices = torch.tensor([3, -1, 0], dtype=torch.int32)
    cu = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    A_log, dt_bias = torch.rand(heads_v), torch.randn(heads_v)
    return (A_log, a, dt_bias, 1.0, 20.0, q, k, v, b, states, indices), {"cu_seqlens": cu}


def test_before_747_the_kernel_gets_live_states_k_major(
    sgl_kernel_npu: SglKernelNpuDouble,
) -> None:
    """main's kernel reads the pool K-major (sgl-kernel-npu issue #640): the live rows go to it
    transposed, padding stays -1, and the results come back V-major into their slots."""
    args, kwargs = decode_inputs()
    pool = args[9]
    expected_pool = pool.clone()
    reference = get_contract("fused_sigmoid_gating_delta_rule_update").reference
    expected, _ = reference(None, *args[:9], expected_pool, args[10], **kwargs)
    out, _ = gdn.fused_sigmoid_gating_delta_rule_update(None, *args, **kwargs)
    (call,) = sgl_kernel_npu.calls
    handed, local = call.args[9], call.args[10]
    assert handed.shape == (2, 2, 8, 4)  # [live, HV, K, V]
    assert local.tolist() == [0, -1, 1]
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(pool, expected_pool)


def test_from_747_the_kernel_updates_the_pool_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    double = install_sgl_kernel_npu(monkeypatch, SglKernelNpuDouble(release="unified"))
    args, kwargs = decode_inputs()
    gdn.fused_sigmoid_gating_delta_rule_update(None, *args, **kwargs)
    (call,) = double.calls
    assert call.name == "fused_sigmoid_gating_delta_rule_update_decode_npu"
    assert call.args[9] is args[9]
    assert gdn.state_order() is gdn.StateOrder.V_MAJOR


def test_main_s_decode_kernel_declines_an_odd_number_of_value_heads(
    sgl_kernel_npu: SglKernelNpuDouble,
) -> None:
    args, kwargs = decode_inputs(heads_v=3)
    with pytest.raises(Unsupported, match=r"two value heads per program .*last of 3"):
        gdn.fused_sigmoid_gating_delta_rule_update(None, *args, **kwargs)
    assert sgl_kernel_npu.calls == []
    assert gdn.state_order() is gdn.StateOrder.K_MAJOR


def test_the_fused_chunked_operator_takes_bfloat16_states_on_a2(
    monkeypatch: pytest.MonkeyPatch, torch_npu: TorchNpuDouble
) -> None:
    double = install_sgl_kernel_npu(monkeypatch, SglKernelNpuDouble(release="unified"))
    contract = get_contract("chunk_gated_delta_rule")
    case = next(c for c in contract.cases if c.params["lens"] == (7, 0, 33))
    inputs = contract.make_inputs(case, torch.bfloat16, torch.device("cpu"), torch.Generator())
    with pytest.raises(
        Unsupported,
        match=r"bfloat16 state \(float32 on Ascend 950\), not "
        r"torch.float32 on torch_npu .* Atlas A2",
    ):
        gdn.chunk_gated_delta_rule(None, *inputs.args, **inputs.kwargs)
    pool = inputs.kwargs["initial_state"].bfloat16()
    kwargs = {**inputs.kwargs, "initial_state": pool}
    expected_pool = pool.float().clone()
    expected = contract.reference(None, *inputs.args, **{**kwargs, "initial_state": expected_pool})
    o, h, states = gdn.chunk_gated_delta_rule(None, *inputs.args, **kwargs)
    (call,) = double.calls
    assert call.kwargs["actual_seq_lengths"].tolist() == [7, 33]  # the empty one left out
    assert call.kwargs["chunk_state"].shape[0] == 1 + 1
    torch.testing.assert_close(o, expected[0], atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(h.float(), expected[1].float(), atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(states.float(), expected_pool, atol=3e-2, rtol=3e-2)


def test_without_torch_npu_the_reason_is_torch_npu_s() -> None:
    """sgl_kernel_npu is not even imported without an NPU: torch_npu's probe answers."""
    availability = SglKernelNpuBackend().is_available()
    assert not availability
    assert availability.reason.startswith("torch_npu import failed")
    assert SGL_KERNEL_NPU.module is None


# -- the double refuses what the functions refuse, one constraint at a time ---------------------


def _tests(
    make: Callable[[], Any], valid: list[Callable[[Any], object]], rejected: dict[Any, Any]
) -> tuple[Callable[..., None], Callable[..., None], Callable[..., None]]:
    return constraint_tests(make, valid, rejected)


G = FusedGdnGating
test_gating_valid, test_gating_rejects, test_gating_constraints_covered = _tests(
    lambda: G([]),
    [
        lambda d: d.fused_gdn_gating_npu(
            torch.rand(4), torch.randn(3, 4), torch.randn(3, 4), torch.randn(4)
        )
    ],
    {
        G.GATING_LAYOUT: lambda d: d.fused_gdn_gating_npu(
            torch.rand(4), torch.randn(3, 8)[:, ::2], torch.randn(3, 4), torch.randn(4)
        ),
        G.GATING_ROWS: lambda d: d.fused_gdn_gating_npu(
            torch.rand(4), torch.randn(0, 4), torch.randn(0, 4), torch.randn(4)
        ),
    },
)

U = FlaUtils
test_split_valid, test_split_rejects, test_split_constraints_covered = _tests(
    lambda: U([]),
    [
        lambda d: d.fused_qkvzba_split_reshape_cat(
            torch.zeros(3, 128), torch.zeros(3, 8), 2, 4, 16, 8
        ),
        lambda d: d.fused_qkvzba_split_reshape_cat_contiguous(
            torch.zeros(0, 128), torch.zeros(0, 8), 2, 4, 16, 8
        ),
    ],
    {
        U.SPLIT_LAYOUT: lambda d: d.fused_qkvzba_split_reshape_cat(
            torch.zeros(128, 3).t(), torch.zeros(3, 8), 2, 4, 16, 8
        ),
        U.SPLIT_RANGES: lambda d: d.fused_qkvzba_split_reshape_cat(
            torch.zeros(3, 2 * (2 * 8 + 2 * 3 * 16)), torch.zeros(3, 12), 2, 6, 8, 16
        ),
        U.SPLIT_ROWS: lambda d: d.fused_qkvzba_split_reshape_cat(
            torch.zeros(0, 128), torch.zeros(0, 8), 2, 4, 16, 8
        ),
    },
)

N = LayernormGated
test_norm_valid, test_norm_rejects, test_norm_constraints_covered = _tests(
    lambda: N([]),
    [
        lambda d: d.layer_norm_fwd_npu(
            torch.randn(3, 16), torch.ones(16), None, 1e-6, z=torch.randn(3, 16), is_rms_norm=True
        )
    ],
    {
        N.NORM_LAYOUT: lambda d: d.layer_norm_fwd_npu(
            torch.randn(3, 16),
            torch.ones(16),
            None,
            1e-6,
            z=torch.randn(16, 3).t(),
            is_rms_norm=True,
        ),
        N.NORM_GROUP: lambda d: d.layer_norm_fwd_npu(
            torch.randn(3, 16),
            torch.ones(16),
            None,
            1e-6,
            z=torch.randn(3, 16),
            group_size=5,
            is_rms_norm=True,
        ),
        N.NORM_ROWS: lambda d: d.layer_norm_fwd_npu(
            torch.randn(0, 16),
            torch.ones(16),
            None,
            1e-6,
            z=torch.randn(0, 16),
            is_rms_norm=True,
        ),
    },
)

C = CausalConv1d
IDX = torch.tensor([0, 1], dtype=torch.int32)
QSL = torch.tensor([0, 3, 5], dtype=torch.int32)
test_conv_valid, test_conv_rejects, test_conv_constraints_covered = _tests(
    lambda: C([]),
    [
        lambda d: d.causal_conv1d_update_npu(
            torch.randn(2, 8), *conv_pool(2), activation="silu", conv_state_indices=IDX
        ),
        lambda d: d.causal_conv1d_fn_npu(
            torch.randn(8, 5),
            conv_pool(2)[1],
            None,
            QSL,
            IDX,
            torch.tensor([True, True]),
            conv_pool(2)[0],
        ),
    ],
    {
        C.UPDATE_INDEXED: lambda d: d.causal_conv1d_update_npu(
            torch.randn(2, 8), *conv_pool(2), conv_state_indices=torch.tensor([0, -1])
        ),
        C.UPDATE_ONE_TOKEN: lambda d: d.causal_conv1d_update_npu(
            torch.randn(2, 8, 2), *conv_pool(2), conv_state_indices=IDX
        ),
        C.UPDATE_NO_BIAS: lambda d: d.causal_conv1d_update_npu(
            torch.randn(2, 8), *conv_pool(2), bias=torch.ones(8), conv_state_indices=IDX
        ),
        C.FN_INDICES: lambda d: d.causal_conv1d_fn_npu(
            torch.randn(8, 5), conv_pool(2)[1], None, QSL, IDX, None, conv_pool(2)[0]
        ),
        C.FN_DTYPES: lambda d: d.causal_conv1d_fn_npu(
            torch.randn(8, 5).bfloat16(),
            conv_pool(2)[1],
            None,
            QSL,
            IDX,
            torch.tensor([True, False]),
            conv_pool(2)[0],
        ),
    },
)

R = Recurrent
DEC = (torch.rand(2), torch.randn(3, 2), torch.randn(2), 1.0, 20.0)
QKV = (torch.randn(1, 3, 1, 8), torch.randn(1, 3, 1, 8), torch.randn(1, 3, 2, 4))
CU3 = torch.tensor([0, 1, 2, 3], dtype=torch.int32)


def recurrent(d: Any, heads_v: int = 2, *, k_major: bool = True, **options: Any) -> Any:
    v = torch.randn(1, 3, heads_v, 4)
    states = (4, heads_v, 8, 4) if k_major else (4, heads_v, 4, 8)
    args = (
        torch.rand(heads_v),
        torch.randn(3, heads_v),
        torch.randn(heads_v),
        1.0,
        20.0,
        *QKV[:2],
        v,
        torch.randn(3, heads_v),
        torch.randn(*states),
        torch.tensor([0, -1, 3], dtype=torch.int32),
    )
    return d(*args, **{"cu_seqlens": CU3, **options})


test_recurrent_valid, test_recurrent_rejects, test_recurrent_constraints_covered = _tests(
    lambda: R([], k_major=True),
    [lambda d: recurrent(d.fused_sigmoid_gating_delta_rule_update_npu)],
    {
        R.DECODE_HEADS: lambda d: recurrent(d.fused_sigmoid_gating_delta_rule_update_npu, 3),
        R.DECODE_SHAPES: lambda d: recurrent(
            d.fused_sigmoid_gating_delta_rule_update_npu, scale=-1.0
        ),
    },
)

RD = RecurrentDecode
test_decode_valid, test_decode_rejects, test_decode_constraints_covered = _tests(
    lambda: RD([], k_major=False),
    [lambda d: recurrent(d.fused_sigmoid_gating_delta_rule_update_decode_npu, 3, k_major=False)],
    {
        RD.DECODE_ONE_TOKEN: lambda d: recurrent(
            d.fused_sigmoid_gating_delta_rule_update_decode_npu,
            k_major=False,
            cu_seqlens=torch.tensor([0, 2, 3, 3], dtype=torch.int32),
        ),
        RD.DECODE_SHAPES: lambda d: recurrent(
            d.fused_sigmoid_gating_delta_rule_update_decode_npu, k_major=False, scale=0.0
        ),
    },
)


def chunk(d: Any, dtype: torch.dtype = torch.bfloat16, **options: Any) -> Any:
    g = torch.Generator().manual_seed(5)
    q, k = (torch.randn(1, 9, 2, 8, generator=g).to(dtype) for _ in range(2))
    v = torch.randn(1, 9, 2, 4, generator=g).to(dtype)
    gates, beta = -torch.rand(1, 9, 2, generator=g), torch.rand(1, 9, 2, generator=g)
    args = {
        "initial_state": torch.zeros(2, 2, 8, 4),
        "cu_seqlens": torch.tensor([0, 4, 9]),
        **options,
    }
    return d.chunk_gated_delta_rule_npu(q, k, v, gates, beta, **args)


test_chunk_valid, test_chunk_rejects, test_chunk_constraints_covered = _tests(
    lambda: Chunk([]),
    [chunk],
    {
        Chunk.CHUNK_DTYPES: lambda d: chunk(d, torch.float32),
        Chunk.CHUNK_SHAPES: lambda d: chunk(d, initial_state=torch.zeros(3, 2, 8, 4)),
    },
)


def fused(d: Any, state_dtype: torch.dtype = torch.bfloat16, **options: Any) -> Any:
    g = torch.Generator().manual_seed(6)
    bf = torch.bfloat16
    query, key = (torch.randn(9, 2, 8, generator=g).to(bf) for _ in range(2))
    args = {
        "beta": torch.rand(9, 2, generator=g).to(bf),
        "initial_state": torch.zeros(2, 2, 4, 8, dtype=state_dtype),
        "actual_seq_lengths": torch.tensor([4, 5], dtype=torch.int32),
        "scale": 0.3,
        "g": -torch.rand(9, 2, generator=g),
        "chunk_state": torch.zeros(2, 2, 4, 8, dtype=state_dtype),
        **options,
    }
    return d.chunk_gated_delta_rule_npu(query, key, torch.randn(9, 2, 4).to(bf), **args)


test_fused_valid, test_fused_rejects, test_fused_constraints_covered = _tests(
    lambda: FusedChunk([], soc_version=220),
    [
        fused,
        lambda _: fused(FusedChunk([], soc_version=260), torch.float32),  # Ascend 950
    ],
    {
        FusedChunk.FUSED_DTYPES: lambda d: fused(d, torch.float32),
        FusedChunk.FUSED_SHAPES: lambda d: fused(
            d, actual_seq_lengths=torch.tensor([4, 4], dtype=torch.int32)
        ),
    },
)
