"""The causal-conv adapters against the ``sgl_kernel.mamba`` double, and the double's own rules.

Every case and dtype of ``causal_conv1d_fn`` and ``causal_conv1d_update`` runs through core's
conformance check (values, untouched inputs, the pool written in place) against a double that
refuses what sgl_kernel's compiled convs refuse or mishandle (sources in
``causal_conv_double.py``); then the calls themselves are pinned (a copy of ``x`` for the
in-place kernel, int32 indices, padding zeros) and the refusals, each before any kernel call.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
from causal_conv_double import SglKernelMambaDouble
from sglang_fl_cuda import plugin
from sglang_fl_cuda.backend import SGL_KERNEL_MAMBA
from sglang_fl_cuda.impl import causal_conv

from sglang_fl import Unsupported
from sglang_fl.ops import OpCase, get_contract
from sglang_fl.testing.checks import PASSED, check_case
from sglang_fl.testing.doubles import assert_rejects, constraint_tests
from sglang_fl.testing.vendor import VendorSuite

SUITE = VendorSuite("cuda", plugin.sglang_fl_register_ops)
CASES = [p for p in SUITE.contract_cases() if p.values[0] in causal_conv.ADAPTERS]


def test_registers_both_convs_under_their_own_probe() -> None:
    impls = {op: SUITE.implementations[op] for op in causal_conv.ADAPTERS}
    assert {op: impl.fn for op, impl in impls.items()} == causal_conv.ADAPTERS
    assert {impl.impl_id for impl in impls.values()} == {"vendor.cuda"}
    # sgl_kernel.mamba is probed apart from sgl_kernel's other kernels.
    (probe,) = {getattr(impl.available, "__self__", None) for impl in impls.values()}
    assert probe.sdk is SGL_KERNEL_MAMBA
    assert SUITE.registry.no_kernel("causal_conv1d_fn") == ()


def test_the_cases_are_all_collected() -> None:
    fn, update = (len(get_contract(op).cases) * 3 for op in causal_conv.ADAPTERS)
    assert len(CASES) == fn + update


@pytest.mark.parametrize(("op", "case", "dtype"), CASES)
def test_contract_case(
    sgl_kernel_mamba: SglKernelMambaDouble, op: str, case: OpCase, dtype: torch.dtype
) -> None:
    outcome = check_case(SUITE.implementations[op], case, dtype)
    assert outcome.status == PASSED, outcome.message
    kernel = "causal_conv1d_fwd" if op == "causal_conv1d_fn" else op
    empty = not case.params["lens"]  # a batch of 0: no launch (a 0-block grid fails)
    assert sgl_kernel_mamba.called == ([] if empty else [kernel])


def _inputs(op: str, case: int, dtype: torch.dtype = torch.bfloat16) -> Any:
    contract = get_contract(op)
    return contract.make_inputs(
        contract.cases[case], dtype, torch.device("cpu"), torch.Generator().manual_seed(0)
    )


def _call(op: str, inputs: Any, *args: Any, **kwargs: Any) -> Any:
    positional = list(inputs.args)
    for index, value in enumerate(args):
        if value is not None:
            positional[index] = value
    return causal_conv.ADAPTERS[op](inputs.obj, *positional, **{**inputs.kwargs, **kwargs})


def test_prefill_hands_the_kernel_a_contiguous_copy_and_int32_indices(
    sgl_kernel_mamba: SglKernelMambaDouble,
) -> None:
    inputs = _inputs("causal_conv1d_fn", 2)  # three sequences, x transposed as SGLang passes it
    x, _, _, pool, qsl, _ = inputs.args
    assert x.stride(-1) != 1
    before = x.clone()
    out, states = _call("causal_conv1d_fn", inputs, None, None, None, None, qsl.long())
    ((name, args, _),) = sgl_kernel_mamba.calls
    kernel_x, _, _, kernel_pool, kernel_qsl, kernel_indices, kernel_initial, silu, pad = args
    assert name == "causal_conv1d_fwd"
    assert kernel_x is out  # the kernel's in-place output is what the adapter returns
    assert out.is_contiguous()
    assert out.data_ptr() != x.data_ptr()
    assert torch.equal(x, before)
    assert kernel_pool is pool
    assert states is pool
    assert (kernel_qsl.dtype, kernel_indices.dtype, kernel_initial.dtype) == (
        torch.int32,
        torch.int32,
        torch.bool,
    )
    assert (silu, pad) == (True, -1)


def test_padded_rows_are_zeros_and_their_slots_untouched(
    sgl_kernel_mamba: SglKernelMambaDouble,
) -> None:
    """The kernels skip a padding row and leave x there (out = x); the contract says zeros."""
    fn = _inputs("causal_conv1d_fn", 4)  # lengths 4, 6, 2; the second sequence padded
    pool = fn.args[3].clone()
    out, states = _call("causal_conv1d_fn", fn)
    assert torch.count_nonzero(out[:, 4:10]) == 0
    assert torch.count_nonzero(out[:, :4]) > 0
    assert torch.count_nonzero(out[:, 10:]) > 0
    used = fn.kwargs["cache_indices"].tolist()
    untouched = [s for s in range(pool.shape[0]) if s not in used]
    assert torch.equal(states[untouched], pool[untouched])
    update = _inputs("causal_conv1d_update", 3)  # four rows, the third padded
    out, _ = _call("causal_conv1d_update", update)
    assert torch.count_nonzero(out[2]) == 0
    assert all(torch.count_nonzero(out[row]) > 0 for row in (0, 1, 3))


def test_decode_without_indices_addresses_the_pool_through_the_identity(
    sgl_kernel_mamba: SglKernelMambaDouble,
) -> None:
    """Without indices the kernel needs a pool of exactly `batch` rows; the contract's pool
    may be larger, so the adapter passes the identity indices."""
    inputs = _inputs("causal_conv1d_update", 1)  # one row, a pool of three
    x, pool = inputs.args[0], inputs.args[1]
    assert pool.shape[0] > x.shape[0]
    want = get_contract("causal_conv1d_update").reference(None, x, pool.clone(), *inputs.args[2:5])
    got = causal_conv.causal_conv1d_update(None, x, pool, *inputs.args[2:5])
    ((_, args, _),) = sgl_kernel_mamba.calls
    assert args[6].tolist() == [0]
    assert args[0].shape == (1, 24, 1)  # [B, dim] as the kernel's [B, dim, 1]
    assert got[0].shape == x.shape
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


def _strided_last(pool: torch.Tensor) -> torch.Tensor:
    wide = torch.zeros(*pool.shape[:-1], pool.shape[-1] * 2, dtype=pool.dtype)
    wide[..., ::2] = pool
    return wide[..., ::2]


REFUSALS: dict[str, tuple[str, int, Callable[[Any], dict[str, Any]], str]] = {
    "a weight in another dtype": (
        "causal_conv1d_fn", 2, lambda i: {"weight": i.args[1].float()}, "the weight is",
    ),
    "width 5": (
        "causal_conv1d_update", 2,
        lambda i: {"weight": torch.randn(24, 5).bfloat16(), "conv_state": torch.zeros(7, 24, 4)
                   .bfloat16()},
        "widths 2 to 4",
    ),
    "a wider conv state": (
        "causal_conv1d_update", 2, lambda i: {"conv_state": torch.zeros(7, 24, 5).bfloat16()},
        "width - 1",
    ),
    "a strided prefill pool": (
        "causal_conv1d_fn", 2, lambda i: {"conv_states": _strided_last(i.args[3])},
        "last dim must be contiguous",
    ),
    "an empty sequence": (
        "causal_conv1d_fn", 2,
        lambda i: {"query_start_loc": torch.tensor([0, 7, 7, 42], dtype=torch.int32),
                   "seq_lens_cpu": [7, 0, 35]},
        "a sequence of no token",
    ),
    "an index past the pool": (
        "causal_conv1d_fn", 2, lambda i: {"cache_indices": torch.tensor([0, 5, 1])},
        "outside the state pool of 5 slots",
    ),
    "a decode index past the pool": (
        "causal_conv1d_update", 2,
        lambda i: {"conv_state_indices": torch.tensor([0, 1, 2, 3, 9], dtype=torch.int32)},
        "outside the state pool of 7 slots",
    ),
    "another activation": (
        "causal_conv1d_update", 2, lambda i: {"activation": "gelu"}, "SiLU or nothing",
    ),
}  # fmt: skip
_NAMES = {
    "causal_conv1d_fn": ("x", "weight", "bias", "conv_states", "query_start_loc", "seq_lens_cpu"),
    "causal_conv1d_update": (
        "x", "conv_state", "weight", "bias", "activation", "conv_state_indices",
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(REFUSALS))
def test_refuses_before_calling_or_writing(
    sgl_kernel_mamba: SglKernelMambaDouble, name: str
) -> None:
    op, case, change, reason = REFUSALS[name]
    inputs = _inputs(op, case)
    arguments = {**dict(zip(_NAMES[op], inputs.args, strict=True)), **inputs.kwargs}
    arguments.update(change(inputs))
    pool_name = _NAMES[op][3 if op == "causal_conv1d_fn" else 1]
    pool_before = arguments[pool_name].clone()
    x_before = arguments["x"].clone()
    with pytest.raises(Unsupported, match=reason):
        causal_conv.ADAPTERS[op](None, **arguments)
    assert sgl_kernel_mamba.calls == []
    assert torch.equal(arguments[pool_name], pool_before)
    assert torch.equal(arguments["x"], x_before)


def test_declines_where_the_wheel_has_no_compiled_convs(monkeypatch: pytest.MonkeyPatch) -> None:
    """An sgl_kernel without sgl_kernel.mamba: the probe keeps the adapters unbound; called
    anyway (the hardware script does), they decline with the import's reason."""
    monkeypatch.setitem(sys.modules, "sgl_kernel.mamba", None)  # import raises ImportError
    monkeypatch.setattr(SGL_KERNEL_MAMBA, "module", None)
    monkeypatch.setattr(SGL_KERNEL_MAMBA, "_error", None)
    inputs = _inputs("causal_conv1d_update", 2)
    pool = inputs.args[1].clone()
    with pytest.raises(Unsupported, match="no compiled causal convs here"):
        _call("causal_conv1d_update", inputs)
    assert torch.equal(inputs.args[1], pool)


# -- the double refuses what the compiled convs refuse, one constraint at a time ----------------

D = SglKernelMambaDouble
Call = Callable[[SglKernelMambaDouble], object]


def fwd(**parts: Any) -> Call:
    """A valid prefill call: sequences of 3 and 5 tokens, 16 channels, width 4, 4 slots."""
    args: dict[str, Any] = {
        "x": torch.randn(16, 8).half(),
        "weight": torch.randn(16, 4).half(),
        "bias_": torch.randn(16).half(),
        "conv_states": torch.randn(4, 16, 3).half(),
        "query_start_loc": torch.tensor([0, 3, 8], dtype=torch.int32),
        "cache_indices": torch.tensor([2, 0], dtype=torch.int32),
        "has_initial_state": torch.tensor([True, False]),
        "silu_activation": True,
        "pad_slot_id": -1,
    }
    args.update(parts)
    return lambda sdk: sdk.causal_conv1d_fwd(**args)


def update(**parts: Any) -> Call:
    """A valid decode call: 3 rows of one token, 16 channels, width 4, a pool of 5."""
    args: dict[str, Any] = {
        "x": torch.randn(3, 16, 1).bfloat16(),
        "conv_state": torch.randn(5, 16, 3).bfloat16(),
        "weight": torch.randn(16, 4).bfloat16(),
        "bias_": None,
        "silu_activation": False,
        "cache_seqlens": None,
        "conv_state_indices": torch.tensor([4, -1, 1], dtype=torch.int32),
        "pad_slot_id": -1,
    }
    args.update(parts)
    return lambda sdk: sdk.causal_conv1d_update(**args)


VALID: list[Call] = [
    fwd(),
    fwd(x=torch.randn(16, 8), weight=torch.randn(16, 4), bias_=None,
        conv_states=torch.randn(4, 16, 3)),
    fwd(weight=torch.randn(4, 16).half().t()),  # any weight strides
    fwd(cache_indices=None, has_initial_state=None),
    fwd(query_start_loc=torch.tensor([0, 0, 8], dtype=torch.int32),
        cache_indices=torch.tensor([-1, 1], dtype=torch.int32)),  # an empty padded sequence
    update(),
    update(x=torch.randn(3, 16, 2).bfloat16()),  # two tokens per row
    update(conv_state=torch.randn(3, 16, 3).bfloat16(), conv_state_indices=None),
    update(conv_state=torch.randn(5, 16, 6).bfloat16()[..., ::2]),  # a strided pool
    update(weight=torch.randn(16, 2).bfloat16(), conv_state=torch.randn(5, 16, 1).bfloat16()),
]  # fmt: skip
REJECTED: dict[Any, Call] = {
    D.DTYPES: fwd(weight=torch.randn(16, 4)),
    D.WIDTH: update(weight=torch.randn(16, 5).bfloat16(), conv_state=torch.randn(5, 16, 4)
                    .bfloat16()),
    D.BIAS: update(bias_=torch.randn(32).bfloat16()[::2]),
    D.FWD_X: fwd(x=torch.randn(8, 16).half().t()),
    D.FWD_INDEX_OPERANDS: fwd(cache_indices=torch.tensor([2, 0])),
    D.FWD_STATES: fwd(conv_states=torch.randn(4, 16, 6).half()[..., ::2]),
    D.FWD_BATCH: fwd(x=torch.randn(16, 0).half(), query_start_loc=torch.tensor(
        [0], dtype=torch.int32), cache_indices=None, has_initial_state=None),
    D.FWD_TOKENS: fwd(query_start_loc=torch.tensor([0, 0, 8], dtype=torch.int32)),
    D.UPDATE_SHAPES: update(x=torch.randn(3, 16).bfloat16()),
    D.UPDATE_INDICES: update(conv_state_indices=torch.tensor([4, -1, 1])),
    D.UPDATE_BATCH: update(x=torch.randn(0, 16, 1).bfloat16(), conv_state_indices=torch.tensor(
        [], dtype=torch.int32)),
    D.SLOTS: update(conv_state_indices=torch.tensor([4, 5, 1], dtype=torch.int32)),
}  # fmt: skip

test_valid_calls_pass, test_rejects_what_the_kernels_reject, test_every_constraint_is_covered = (
    constraint_tests(SglKernelMambaDouble, VALID, REJECTED)
)


def test_two_live_rows_on_one_slot_are_refused() -> None:
    assert_rejects(
        SglKernelMambaDouble(),
        D.SLOTS,
        update(conv_state_indices=torch.tensor([4, -1, 4], dtype=torch.int32)),
    )


def test_the_double_writes_over_x_and_skips_padding() -> None:
    """What the adapters rely on: the output replaces x, a padded row keeps x."""
    x = torch.randn(3, 16, 1).bfloat16()
    before = x.clone()
    update(x=x)(SglKernelMambaDouble())
    assert torch.equal(x[1], before[1])
    assert not torch.equal(x[0], before[0])


def test_the_double_refuses_what_it_does_not_model() -> None:
    with pytest.raises(NotImplementedError, match="circular"):
        update(cache_seqlens=torch.zeros(3, dtype=torch.int32))(SglKernelMambaDouble())
    with pytest.raises(NotImplementedError, match="varlen"):
        fwd(query_start_loc=None)(SglKernelMambaDouble())
