"""The CUDA GDN adapters against the double of SGLang's Triton GDN kernels (no GPU, no Triton).

Every case and dtype of the five contracts runs through core's conformance check against a
double that rejects what SGLang's kernels reject; the tests below pin the kernel calls (what
the adapter passes for what the contract leaves out) and every refusal: ``Unsupported``, raised
before the kernel is called and before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch
from sglang_fl_cuda import plugin
from sglang_fl_cuda.backend import SGLANG_TRITON
from sglang_fl_cuda.impl import linear_attention as gdn
from sglang_fl_cuda.impl.causal_conv import ADAPTERS as CAUSAL_CONV
from sglang_triton_double import SglangTritonGdnDouble

from sglang_fl import Unsupported
from sglang_fl.ops import OpCase, get_contract
from sglang_fl.testing.checks import PASSED, SKIPPED, check_case
from sglang_fl.testing.vendor import VendorSuite

SUITE = VendorSuite("cuda", plugin.sglang_fl_register_ops)
CASES = [p for p in SUITE.contract_cases() if p.values[0] in gdn.ADAPTERS]


def test_registers_the_six_adapters_under_the_triton_probe() -> None:
    impls = {op: SUITE.implementations[op] for op in gdn.ADAPTERS}
    assert {op: impl.fn for op, impl in impls.items()} == dict(gdn.ADAPTERS)
    assert {impl.impl_id for impl in impls.values()} == {"vendor.cuda"}
    # Probed on their own: a machine without sgl_kernel may still have SGLang's Triton kernels.
    (probe,) = {getattr(impl.available, "__self__", None) for impl in impls.values()}
    assert probe.sdk is SGLANG_TRITON
    assert set(gdn.NO_KERNEL).isdisjoint(gdn.ADAPTERS)
    # The ten GDN ops and Qwen3.5's two (its contiguous split, the attention output gate); the
    # causal convs are sgl_kernel's (test_causal_conv.py).
    assert len(set(gdn.NO_KERNEL) | set(gdn.ADAPTERS) | set(CAUSAL_CONV)) == 12


def test_the_gated_norm_asks_for_a_new_output(triton_gdn: SglangTritonGdnDouble) -> None:
    """SGLang's launcher writes the result over x unless given out_dtype."""
    contract = get_contract("rms_norm_gated")
    inputs = contract.make_inputs(
        contract.cases[2], torch.bfloat16, torch.device("cpu"), torch.Generator().manual_seed(0)
    )
    x, gate = inputs.args
    before = x.clone()
    y = gdn.rms_norm_gated(inputs.obj, x, gate)
    (call,) = triton_gdn.calls
    assert call.kwargs["out_dtype"] == torch.bfloat16
    assert call.kwargs["is_rms_norm"] is True
    assert torch.equal(x, before)
    assert y.data_ptr() != x.data_ptr()


def declined(op: str, params: Mapping[str, Any], dtype: torch.dtype) -> bool:
    """SGLang's chunked kernel asserts q is not float32 (fla/chunk.py); its gated norm
    normalises whole rows before the gate (fla/fused_norm_gate.py)."""
    if op == "rms_norm_gated":
        return bool(params.get("group")) or not params.get("norm_before_gate", True)
    return op == "chunk_gated_delta_rule" and dtype == torch.float32


@pytest.mark.parametrize(("op", "case", "dtype"), CASES)
def test_contract_case(
    triton_gdn: SglangTritonGdnDouble, op: str, case: OpCase, dtype: torch.dtype
) -> None:
    outcome = check_case(SUITE.implementations[op], case, dtype)
    if declined(op, case.params, dtype):
        assert outcome.status == SKIPPED, outcome.message
        assert triton_gdn.calls == []
    else:
        assert outcome.status == PASSED, outcome.message
        empty_chunk = op == "chunk_gated_delta_rule" and not case.params["lens"]
        empty_norm = op == "rms_norm_gated" and not case.params["tokens"]
        kernel = "layer_norm_gated_fwd" if op == "rms_norm_gated" else op
        assert triton_gdn.called == ([] if empty_chunk or empty_norm else [kernel])


def _inputs(op: str, case: int = 2, dtype: torch.dtype = torch.bfloat16) -> Any:
    contract = get_contract(op)
    return contract.make_inputs(
        contract.cases[case], dtype, torch.device("cpu"), torch.Generator().manual_seed(0)
    )


def _call(op: str, inputs: Any, **override: Any) -> Any:
    kwargs = {**inputs.kwargs, **override}
    return gdn.ADAPTERS[op](inputs.obj, *inputs.args, **kwargs)


def test_chunk_passes_the_pool_and_its_indices(triton_gdn: SglangTritonGdnDouble) -> None:
    inputs = _inputs("chunk_gated_delta_rule")
    pool, indices = inputs.kwargs["initial_state"], inputs.kwargs["initial_state_indices"]
    _, h, states = _call("chunk_gated_delta_rule", inputs)
    (call,) = triton_gdn.calls
    assert call.kwargs["initial_state"] is pool
    assert states is pool
    assert call.kwargs["initial_state_indices"] is indices
    assert call.kwargs["head_first"] is False
    assert h.shape[:2] == (1, 1 + 1)  # 7 tokens, then 33: one chunk each


def test_chunk_without_a_pool_gives_the_kernel_one_of_zeros(
    triton_gdn: SglangTritonGdnDouble,
) -> None:
    """The kernel reads a pool and its indices unconditionally; the contract allows neither."""
    inputs = _inputs("chunk_gated_delta_rule")
    kwargs = {**inputs.kwargs, "initial_state": None, "initial_state_indices": None}
    o, _, finals = gdn.chunk_gated_delta_rule(None, *inputs.args, **kwargs)
    want = get_contract("chunk_gated_delta_rule").reference(None, *inputs.args, **kwargs)
    (call,) = triton_gdn.calls
    assert call.kwargs["initial_state_indices"].tolist() == [0, 1, 2]
    assert call.kwargs["inplace_update"] is True
    torch.testing.assert_close(finals, want[2])
    torch.testing.assert_close(o, want[0])


def _unchanged(inputs: Any) -> Callable[[], None]:
    before = {
        name: t.clone()
        for name, t in {**dict(enumerate(inputs.args)), **inputs.kwargs}.items()
        if isinstance(t, torch.Tensor)
    }

    def check() -> None:
        now = {**dict(enumerate(inputs.args)), **inputs.kwargs}
        for name, was in before.items():
            assert torch.equal(now[name], was), f"{name} was written"

    return check


def _strided_pool(pool: torch.Tensor) -> torch.Tensor:
    """The pool's values in a slot-major envelope whose slots are not dense."""
    wide = torch.zeros(*pool.shape[:-1], pool.shape[-1] * 2)
    wide[..., ::2] = pool
    return wide[..., ::2]


REFUSALS: Mapping[str, tuple[str, int, torch.dtype, dict[str, Any], str]] = {
    "chunk float32": ("chunk_gated_delta_rule", 2, torch.float32, {}, "float32"),
    "chunk strided pool": ("chunk_gated_delta_rule", 2, torch.bfloat16, {"pool": True}, "copies"),
    "chunk padding index": (
        "chunk_gated_delta_rule", 2, torch.bfloat16, {"index": -1}, "outside the state pool",
    ),
    "chunk index past the pool": (
        "chunk_gated_delta_rule", 2, torch.bfloat16, {"index": 5}, "outside the state pool",
    ),
    "recurrent scale": (
        "fused_recurrent_gated_delta_rule", 2, torch.bfloat16, {"scale": -1.0}, "scale > 0",
    ),
    "packed strided out": (
        "fused_recurrent_gated_delta_rule_packed_decode", 2, torch.bfloat16, {"out": True},
        "out must be contiguous",
    ),
    "packed strided pool": (
        "fused_recurrent_gated_delta_rule_packed_decode", 2, torch.bfloat16, {"pool": True},
        "dense",
    ),
    "packed index past the pool": (
        "fused_recurrent_gated_delta_rule_packed_decode", 2, torch.bfloat16, {"index": 7},
        "outside the state pool",
    ),
    "sigmoid index past the pool": (
        "fused_sigmoid_gating_delta_rule_update", 1, torch.bfloat16, {"index": 5},
        "outside the state pool",
    ),
    "sigmoid scale": (
        "fused_sigmoid_gating_delta_rule_update", 1, torch.bfloat16, {"scale": 0.0}, "scale > 0",
    ),
}  # fmt: skip

# The pool (and index) argument of each op: (positional index or keyword, index name).
_POOL = {
    "chunk_gated_delta_rule": ("initial_state", "initial_state_indices"),
    "fused_recurrent_gated_delta_rule_packed_decode": (6, 8),
    "fused_sigmoid_gating_delta_rule_update": (9, 10),
}


def _get(inputs: Any, key: int | str) -> Any:
    return inputs.args[key] if isinstance(key, int) else inputs.kwargs[key]


def _set(inputs: Any, key: int | str, value: Any) -> None:
    if isinstance(key, int):
        args = list(inputs.args)
        args[key] = value
        object.__setattr__(inputs, "args", tuple(args))
    else:
        inputs.kwargs[key] = value


@pytest.mark.parametrize("name", list(REFUSALS))
def test_refuses_before_calling_or_writing(triton_gdn: SglangTritonGdnDouble, name: str) -> None:
    op, case, dtype, change, reason = REFUSALS[name]
    inputs = _inputs(op, case, dtype)
    override: dict[str, Any] = {}
    if "pool" in change:
        pool_key = _POOL[op][0]
        _set(inputs, pool_key, _strided_pool(_get(inputs, pool_key)))
    if "index" in change:
        index_key = _POOL[op][1]
        indices = _get(inputs, index_key).clone()
        indices[0] = change["index"]
        _set(inputs, index_key, indices)
    if "out" in change:
        out = _get(inputs, 7)
        _set(inputs, 7, torch.zeros(*out.shape[:-1], out.shape[-1] * 2, dtype=out.dtype)[..., ::2])
    if "scale" in change:
        override["scale"] = change["scale"]
    unchanged = _unchanged(inputs)
    with pytest.raises(Unsupported, match=reason):
        _call(op, inputs, **override)
    assert triton_gdn.calls == []
    unchanged()


def test_refuses_a_head_ratio_the_kernels_cannot_map(triton_gdn: SglangTritonGdnDouble) -> None:
    inputs = _inputs("fused_recurrent_gated_delta_rule", 2, torch.float16)
    q, _, v, g, beta = inputs.args  # one key head, three value heads
    two_heads = q.expand(-1, -1, 2, -1).contiguous()  # H=2 against HV=3
    with pytest.raises(Unsupported, match="multiple of H"):
        gdn.fused_recurrent_gated_delta_rule(
            None, two_heads, two_heads, v, g, beta, **inputs.kwargs
        )
    assert triton_gdn.calls == []


def test_recurrent_without_beta_passes_ones_of_the_value_heads(
    triton_gdn: SglangTritonGdnDouble,
) -> None:
    """SGLang's own default, ones_like(q[..., 0]), has the key heads: wrong for HV > H."""
    inputs = _inputs("fused_recurrent_gated_delta_rule", 2, torch.float32)  # heads 1/3
    q, k, v, g, _ = inputs.args
    o, final = gdn.fused_recurrent_gated_delta_rule(None, q, k, v, g, None, **inputs.kwargs)
    (call,) = triton_gdn.calls
    assert call.kwargs["beta"].shape == g.shape
    assert bool((call.kwargs["beta"] == 1).all())
    assert call.kwargs["output_final_state"] is True
    want = get_contract("fused_recurrent_gated_delta_rule").reference(
        None, q, k, v, g, None, **inputs.kwargs
    )
    torch.testing.assert_close(o, want[0])
    torch.testing.assert_close(final, want[1])


def test_strided_read_only_inputs_reach_the_kernels_as_it_addresses_them(
    triton_gdn: SglangTritonGdnDouble,
) -> None:
    """The gating and decode kernels address rows densely: a strided row is copied, the pool
    and ``out`` (written in place) never are."""
    inputs = _inputs("fused_gdn_gating", 5, torch.float16)  # tokens=7, heads=4, strided
    A_log, a, b, dt_bias = inputs.args
    assert a.stride(-1) != 1
    gdn.fused_gdn_gating(None, A_log, a, b, dt_bias)
    (call,) = triton_gdn.calls
    assert call.args[1].stride(-1) == 1
    torch.testing.assert_close(call.args[1], a)


@pytest.mark.parametrize(
    "change",
    [{"weight": None}, {"group_size": 8}, {"norm_before_gate": False}, {"activation": "gelu"}],
    ids=["no weight", "groups", "gate first", "gelu gate"],
)
def test_the_gated_norm_refuses_what_the_kernel_cannot_do(
    triton_gdn: SglangTritonGdnDouble, change: dict[str, Any]
) -> None:
    contract = get_contract("rms_norm_gated")
    inputs = contract.make_inputs(
        contract.cases[5], torch.float16, torch.device("cpu"), torch.Generator().manual_seed(0)
    )
    for name, value in change.items():
        setattr(inputs.obj, name, value)
    with pytest.raises(Unsupported, match="rms_norm_gated"):
        gdn.rms_norm_gated(inputs.obj, *inputs.args)
    assert triton_gdn.calls == []
