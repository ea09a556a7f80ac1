"""The ``torch_npu`` double rejects what the real operators reject, one constraint at a time.

Each documented constraint of the double (see its source in ``torch_npu_double.py``) gets a
call that is valid except for that one constraint: the double must refuse it, naming that
constraint. The valid calls themselves must pass, so every refusal is specific, and every
constraint the double declares must have its rejecting call here.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from attention_calls import ATTENTION_REJECTED, ATTENTION_VALID
from torch_npu_double import TorchNpuDouble

from sglang_fl.testing.doubles import (
    Constraint,
    ConstraintViolation,
    assert_rejects,
    constraint_tests,
)

D = TorchNpuDouble
Call = Callable[[TorchNpuDouble], object]


def t(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


def swiglu(x: torch.Tensor, dim: int = -1) -> Call:
    return lambda sdk: sdk.npu_swiglu(x, dim=dim)


def geglu(x: torch.Tensor, dim: int = -1, approximate: int = 1) -> Call:
    return lambda sdk: sdk.npu_geglu(x, dim=dim, approximate=approximate, activate_left=True)


def gelu(x: torch.Tensor, approximate: str = "tanh") -> Call:
    return lambda sdk: sdk.npu_gelu(x, approximate=approximate)


def fast_gelu(x: torch.Tensor) -> Call:
    return lambda sdk: sdk.npu_fast_gelu(x)


def rms_norm(x: torch.Tensor, gamma: torch.Tensor) -> Call:
    return lambda sdk: sdk.npu_rms_norm(x, gamma, 1e-6)


def add_rms_norm(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor) -> Call:
    return lambda sdk: sdk.npu_add_rms_norm(x1, x2, gamma, 1e-6)


def mrope(
    positions: torch.Tensor | None = None,
    query: torch.Tensor | None = None,
    cache: torch.Tensor | None = None,
    head_size: int = 32,
    mode: str = "half",
    section: list[int] | None = None,
) -> Call:
    """A valid call (3 tokens, 4 q heads, 2 kv heads, head size 32) with parts replaced."""
    positions = torch.tensor([0, 5, 2]) if positions is None else positions
    section = [0, 0, 0] if section is None else section
    query = t(3, 4 * 32) if query is None else query
    key = t(query.shape[0], 2 * 32, dtype=query.dtype)
    cache = t(8, 32, dtype=query.dtype) if cache is None else cache
    return lambda sdk: sdk.npu_mrope(
        positions, query, key, cache, head_size, mrope_section=section, rotary_mode=mode
    )


def gating_softmax(x: torch.Tensor, k: int = 2) -> Call:
    return lambda sdk: sdk.npu_moe_gating_top_k_softmax(x, k=k)


def gating(
    x: torch.Tensor | None = None,
    k: int = 2,
    bias: torch.Tensor | None = None,
    group_count: int = 4,
    k_group: int = 2,
    norm_type: int = 1,
) -> Call:
    """A valid grouped call (3 tokens, 16 experts in 4 groups, top 2) with parts replaced."""
    x = t(3, 16, dtype=torch.float32) if x is None else x
    return lambda sdk: sdk.npu_moe_gating_top_k(
        x,
        k=k,
        bias=bias,
        k_group=k_group,
        group_count=group_count,
        group_select_mode=1,
        renorm=0,
        norm_type=norm_type,
        out_flag=False,
        routed_scaling_factor=1.0,
        eps=1e-20,
    )


IDS = torch.tensor([[0, 1], [2, 3], [1, 2]], dtype=torch.int32)


def init_routing(x: torch.Tensor | None = None, ids: torch.Tensor = IDS, **options: object) -> Call:
    """A valid unquantized routing call (3 tokens, top 2 of 4 experts) with options replaced."""
    x = t(3, 16) if x is None else x
    kwargs: dict[str, object] = {
        "active_num": ids.numel(),
        "expert_num": 4,
        "expert_tokens_num_type": 1,
        "expert_tokens_num_flag": True,
        "active_expert_range": [0, 4],
        "quant_mode": -1,
    }
    kwargs.update(options)
    return lambda sdk: sdk.npu_moe_init_routing_v2(x, ids, **kwargs)


def grouped_matmul(
    x: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    group_list: torch.Tensor | None = None,
    group_list_type: int = 1,
) -> Call:
    """A valid call: 6 rows in groups of (1, 2, 3, 0) through 4 weights [16, 8]."""
    x = t(6, 16) if x is None else x
    weight = t(4, 16, 8) if weight is None else weight
    counts = torch.tensor([1, 2, 3, 0]) if group_list is None else group_list
    return lambda sdk: sdk.npu_grouped_matmul(
        [x],
        [weight],
        split_item=2,
        group_list_type=group_list_type,
        group_type=0,
        group_list=counts,
        output_dtype=x.dtype,
    )


def finalize(
    rows: torch.Tensor | None = None,
    scales: torch.Tensor | None = None,
    ids: torch.Tensor = IDS,
) -> Call:
    """A valid call gathering 3 tokens' top-2 rows back."""
    rows = t(6, 16) if rows is None else rows
    scales = torch.full(tuple(ids.shape), 0.5, dtype=rows.dtype) if scales is None else scales
    positions = torch.arange(ids.numel(), dtype=torch.int32)
    return lambda sdk: sdk.npu_moe_finalize_routing(
        rows, None, None, None, scales, positions, ids, drop_pad_mode=0
    )


def layer_norm_eval(
    x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None
) -> Call:
    return lambda sdk: sdk.npu_layer_norm_eval(x, [x.shape[-1]], weight=weight, bias=bias, eps=1e-5)


def on(double: TorchNpuDouble, call: Call) -> Call:
    """``call`` against ``double`` (another release or SoC) instead of the default one."""
    return lambda _sdk: call(double)


def deepseek_gating(x: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> Call:
    """The layout every release takes: 256 experts in 8 groups, best 4, top 8, sigmoid, bias."""
    x = t(3, 256, dtype=torch.float32) if x is None else x
    bias = t(256, dtype=torch.float32) if bias is None else bias
    return lambda sdk: sdk.npu_moe_gating_top_k(
        x, k=8, bias=bias, k_group=4, group_count=8, group_select_mode=1, norm_type=1
    )


OLDER = "2.6.0"  # an Ascend Extension for PyTorch 7.1.0 build

VALID: list[Call] = [
    gating_softmax(t(3, 8)),
    gating_softmax(t(2, 2048), k=1024),
    deepseek_gating(),
    on(TorchNpuDouble(version=OLDER), deepseek_gating()),
    on(TorchNpuDouble(soc_version=200), gelu(t(3, 16))),  # float16 on an Atlas 300I
    on(TorchNpuDouble(soc_version=252), fast_gelu(t(3, 16, dtype=torch.bfloat16))),  # A3
    layer_norm_eval(t(3, 16)),
    layer_norm_eval(t(3, 16, dtype=torch.bfloat16), t(16).bfloat16(), t(16).bfloat16()),
    layer_norm_eval(t(3, 32)[:, ::2], t(16)),  # strided input: documented as supported
    grouped_matmul(group_list=torch.tensor([1, 3, 6, 6]), group_list_type=0),
    grouped_matmul(x=t(6, 16), weight=t(1, 16, 8), group_list=torch.tensor([6]), group_list_type=0),
    init_routing(expert_tokens_num_type=0),
    gating_softmax(t(2, 3, 8, dtype=torch.bfloat16)),
    gating(),
    gating(x=t(3, 16, dtype=torch.float32), bias=t(16, dtype=torch.float32), norm_type=0),
    gating(group_count=1, k_group=1),
    init_routing(),
    grouped_matmul(),
    finalize(),
    swiglu(t(3, 16)),
    swiglu(t(2, 6, 4), dim=1),
    geglu(t(3, 16)),
    geglu(t(3, 32)[:, ::2], approximate=0),  # strided input: documented as supported
    geglu(t(2, 6, 4), dim=1),
    gelu(t(3, 16)),
    gelu(t(3, 32)[:, ::2], approximate="none"),
    fast_gelu(t(3, 16, dtype=torch.bfloat16)),
    rms_norm(t(3, 16), t(16)),
    add_rms_norm(t(3, 16), t(3, 16), t(16)),
    mrope(),
    mrope(mode="interleave"),
    mrope(query=t(3, 64, dtype=torch.float32), cache=t(8, 16, dtype=torch.float32), head_size=16),
    mrope(query=t(3, 4 * 64), cache=t(8, 32), head_size=64),  # partial rotary
    mrope(positions=torch.randint(0, 8, (3, 3)), section=[4, 6, 6]),  # mrope: [3, tokens]
]

REJECTED: dict[Constraint, Call] = {
    D.SWIGLU_CONTIGUOUS: swiglu(t(3, 32)[:, ::2]),
    D.SWIGLU_NOT_EMPTY: swiglu(t(0, 16)),
    D.SWIGLU_SHAPE: swiglu(t(3, 15)),
    D.GEGLU_OPERANDS: geglu(t(3, 15)),
    D.GELU_OPERANDS: gelu(t(3, 16), approximate="erf"),
    D.FAST_GELU_OPERANDS: fast_gelu(torch.randn(3, 16, dtype=torch.float64)),
    D.RMS_NORM_OPERANDS: rms_norm(t(3, 16), t(16, dtype=torch.float32)),
    D.ADD_RMS_NORM_PAIR: add_rms_norm(t(3, 16), t(2, 16), t(16)),
    D.ADD_RMS_NORM_NOT_EMPTY: add_rms_norm(t(0, 16), t(0, 16), t(16)),
    D.MROPE_POSITIONS: mrope(positions=torch.tensor([0.0, 5.0, 2.0])),
    D.MROPE_OPERANDS: mrope(cache=t(8, 32, dtype=torch.float32)),
    D.MOE_NOT_EMPTY: init_routing(x=t(0, 16), ids=torch.empty(0, 2, dtype=torch.int32)),
    D.GATING_SOFTMAX_OPERANDS: gating_softmax(t(3, 8), k=9),
    D.GATING_X: gating(x=t(3, 4096, dtype=torch.float32), group_count=1, k_group=1),
    D.GATING_GROUPS: gating(group_count=3),  # 16 experts do not split into 3 groups
    D.GATING_RESTRICTED: on(TorchNpuDouble(version=OLDER), gating()),  # 16 experts in 4 groups
    D.GELU_BF16_SOC: on(TorchNpuDouble(soc_version=200), gelu(t(3, 16, dtype=torch.bfloat16))),
    D.LAYER_NORM_OPERANDS: layer_norm_eval(t(3, 16), t(16, dtype=torch.float32)),
    D.GATING_BIAS: gating(bias=t(16)),  # float16 bias, float32 x
    D.GATING_MODES: gating(norm_type=2),
    D.INIT_ROUTING_QUANT_MODE: init_routing(quant_mode=None),
    D.INIT_ROUTING_X: init_routing(x=t(3, 2, 8)),
    D.INIT_ROUTING_EXPERT_IDX: init_routing(ids=IDS.long()),
    D.GROUPED_MATMUL_OPERANDS: grouped_matmul(weight=t(4, 16, 8, dtype=torch.bfloat16)),
    D.GROUPED_MATMUL_GROUP_LIST: grouped_matmul(group_list=torch.tensor([1, 2, 3, 0]).int()),
    D.FINALIZE_OPERANDS: finalize(scales=torch.full((3, 2), 0.5)),  # float32, rows float16
    D.MROPE_ALIGNMENT: mrope(query=t(3, 4 * 16), cache=t(8, 16), head_size=16),  # fp16: 32
}


# The attention operators' calls live beside their double part (attention_calls.py).
VALID += ATTENTION_VALID
REJECTED |= ATTENTION_REJECTED

test_valid_calls_pass, test_rejects_what_the_sdk_rejects, test_every_constraint_is_covered = (
    constraint_tests(TorchNpuDouble, VALID, REJECTED)
)


def test_init_routing_without_quant_mode_is_refused() -> None:
    """The call left to the operator's default (quant_mode=0, static quantization, in the
    7.0.0 API reference) is refused: the adapter must always say -1."""
    sdk = TorchNpuDouble()
    with pytest.raises(ConstraintViolation, match="quant_mode passed explicitly"):
        sdk.npu_moe_init_routing_v2(
            t(3, 16),
            IDS,
            active_num=6,
            expert_num=4,
            expert_tokens_num_type=1,
            expert_tokens_num_flag=True,
            active_expert_range=[0, 4],
        )


def test_modes_the_double_does_not_compute_are_refused() -> None:
    with pytest.raises(NotImplementedError, match="quantized routing"):
        init_routing(quant_mode=0)(TorchNpuDouble())
    with pytest.raises(NotImplementedError, match="skips"):
        TorchNpuDouble().npu_moe_finalize_routing(
            t(6, 16),
            t(3, 16),
            None,
            None,
            torch.full((3, 2), 0.5, dtype=torch.float16),
            torch.arange(6, dtype=torch.int32),
            IDS,
        )


def test_moe_return_conventions() -> None:
    """New tensors: (y, ids, row_idx); (y, ids, None); (sorted x, positions, counts, None);
    [y]; out. Routing, matmuls and finalize compose to the per-token weighted sum."""
    sdk = TorchNpuDouble()
    y, ids, rows = sdk.npu_moe_gating_top_k_softmax(t(3, 8), k=2)
    assert (y.dtype, ids.dtype, rows.dtype, rows.shape) == (
        torch.float16,
        torch.int32,
        torch.int32,
        (3, 2),
    )
    norm_out = gating()(sdk)[2]  # type: ignore[index]
    # normOut is allocated float32 [tokens, experts] whatever out_flag says, unwritten here
    assert (norm_out.dtype, norm_out.shape) == (torch.float32, (3, 16))
    x = t(3, 16)
    sorted_x, positions, counts, scale = init_routing(x=x)(sdk)  # type: ignore[misc]
    assert scale is None
    assert counts.tolist() == [1, 2, 2, 1]
    assert torch.equal(sorted_x[positions.long()], x.repeat_interleave(2, dim=0))
    (out,) = sdk.npu_grouped_matmul(
        [sorted_x],
        [torch.eye(16, dtype=torch.float16).expand(4, 16, 16)],
        split_item=2,
        group_list_type=1,
        group_type=0,
        group_list=counts,
        output_dtype=torch.float16,
    )
    assert torch.equal(out, sorted_x)
    half = torch.full((3, 2), 0.5, dtype=torch.float16)
    total = sdk.npu_moe_finalize_routing(out, None, None, None, half, positions, IDS)
    torch.testing.assert_close(total, x, rtol=1e-3, atol=1e-3)  # 0.5 * x + 0.5 * x


def test_return_conventions() -> None:
    """New tensors, never the inputs: y; (y, rstd); (y, rstd, x1 + x2); (query, key)."""
    sdk, x, residual, gamma = TorchNpuDouble(), t(3, 16), t(3, 16), t(16)
    before = (x.clone(), residual.clone())
    assert sdk.npu_swiglu(x).shape == (3, 8)
    y, rstd = sdk.npu_rms_norm(x, gamma)
    assert (y.shape, rstd.shape) == ((3, 16), (3, 1))
    y, rstd, total = sdk.npu_add_rms_norm(residual, x, gamma)
    torch.testing.assert_close(total, (before[0].float() + before[1].float()).half())
    assert torch.equal(x, before[0])
    assert torch.equal(residual, before[1])
    rotated = mrope()(sdk)
    assert isinstance(rotated, tuple)
    query, key = rotated
    assert (query.shape, key.shape) == ((3, 128), (3, 64))
    assert sdk.called == ["npu_swiglu", "npu_rms_norm", "npu_add_rms_norm", "npu_mrope"]


@pytest.mark.parametrize(
    "call",
    [
        mrope(positions=torch.randint(0, 8, (3, 3)), section=[4, 6, 5]),  # 15 lanes, not 16
        mrope(section=[4, 6, 6]),  # [tokens] positions take no sections
    ],
)
def test_mrope_sections_must_match_the_positions(call: Call) -> None:
    """[3, tokens] positions need sections covering rotary_dim // 2 lanes; [tokens] none."""
    assert_rejects(TorchNpuDouble(), D.MROPE_POSITIONS, call)


@pytest.mark.parametrize(
    "call",
    [
        grouped_matmul(x=t(6, 16), weight=t(1, 16, 8), group_list=torch.tensor([6])),  # counts
        grouped_matmul(group_list=torch.tensor([1, 3, 2, 6]), group_list_type=0),  # decreasing
        grouped_matmul(group_list=torch.tensor([1, 3, 6, 5]), group_list_type=0),  # ends at 5
    ],
)
def test_grouped_matmul_group_lists_of_each_form(call: Call) -> None:
    """A count-form list of length 1 is refused; a cumulative one must rise to M."""
    with pytest.raises(ConstraintViolation) as info:
        call(TorchNpuDouble())
    assert info.value.constraint is D.GROUPED_MATMUL_GROUP_LIST


def test_gating_groups_need_more_than_two_experts_and_fit_2048_when_padded() -> None:
    for call in (
        gating(x=t(3, 8, dtype=torch.float32)),  # 8 experts in 4 groups of 2
        gating(x=t(3, 33 * 62, dtype=torch.float32), group_count=62),  # 62 * 64 > 2048
    ):
        with pytest.raises(ConstraintViolation) as info:
            call(TorchNpuDouble())
        assert info.value.constraint is D.GATING_GROUPS
    with pytest.raises(ConstraintViolation) as info:
        gating_softmax(t(2, 2048), k=1025)(TorchNpuDouble())
    assert info.value.constraint is D.GATING_SOFTMAX_OPERANDS


def test_gating_divides_sigmoid_weights_only() -> None:
    """As the page's equivalent code: norm_type 1 divides by the sum, norm_type 0 does not."""
    x = t(3, 16, dtype=torch.float32)
    sigmoid, _, _ = gating(x=x)(TorchNpuDouble())  # type: ignore[misc]
    softmax, _, _ = gating(x=x, norm_type=0)(TorchNpuDouble())  # type: ignore[misc]
    torch.testing.assert_close(sigmoid.sum(dim=-1), torch.ones(3))
    assert bool((softmax.sum(dim=-1) < 0.999).all())


def test_mrope_takes_the_default_cache_mode() -> None:
    """npu_mrope's 26.0.0+ schema has cache_mode='default'; only that layout is modelled."""
    call = mrope()
    sdk = TorchNpuDouble()
    call(sdk)
    positions, query, key, cache, head_size = sdk.calls[0].args
    sdk.npu_mrope(positions, query, key, cache, head_size, cache_mode="default")
    with pytest.raises(NotImplementedError, match="cache_mode"):
        sdk.npu_mrope(positions, query, key, cache, head_size, cache_mode="deepseek_nope")


def test_geglu_returns_the_product_and_the_gelu() -> None:
    x = t(3, 16)
    y, gelu = TorchNpuDouble().npu_geglu(x, dim=-1, approximate=1, activate_left=True)
    assert (y.shape, gelu.shape) == ((3, 8), (3, 8))
    torch.testing.assert_close(y.float(), gelu.float() * x[:, 8:].float(), atol=1e-2, rtol=1e-2)
