"""The reference implementations of the second set of ops: the rules SGLang's numerics imply.

Bit-for-bit agreement with SGLang's ``forward_native`` is checked against SGLang itself in
``tests/sglang/test_layers_gemma_vl.py``; here, without SGLang, the behaviours a vendor kernel
must reproduce: where rounding happens, which axis feeds which rope lane, what an empty batch
gives, and the errors for inputs outside the contract.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from sglang_fl.ops import get_contract
from sglang_fl.ops.rotary.mrotary_embedding import lane_axes
from sglang_fl.testing.checks import _make_inputs

# The activations, norms, rope and position ops of the second set (the MoE ops have their own
# output dtypes: float32 top-k weights, int32 ids; tests/sglang covers them against SGLang).
SECOND_SET = [
    "gelu_and_mul",
    "gelu_new",
    "gelu_quick",
    "gemma_rms_norm",
    "layer_norm",
    "mrotary_embedding",
    "clamp_position",
]


@pytest.mark.parametrize("op", SECOND_SET)
def test_every_case_runs_and_keeps_what_the_contract_preserves(op: str) -> None:
    contract = get_contract(op)
    for dtype in contract.dtypes:
        for case in contract.cases:
            inputs = _make_inputs(contract, case, dtype, "cpu")
            kept = {n: inputs.argument(n, contract.signature).clone() for n in inputs.preserved}
            out = contract.reference(inputs.obj, *inputs.args, **inputs.kwargs)
            outputs = out if isinstance(out, tuple) else (out,)
            assert all(
                o.dtype == (torch.int64 if op == "clamp_position" else dtype) for o in outputs
            )
            for name, before in kept.items():
                assert torch.equal(inputs.argument(name, contract.signature), before), (op, name)


def test_gelu_and_mul_follows_the_layer_approximation() -> None:
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    reference = get_contract("gelu_and_mul").reference
    for approximate in ("none", "tanh"):
        want = F.gelu(x[:, :4], approximate=approximate) * x[:, 4:]
        assert torch.equal(reference(SimpleNamespace(approximate=approximate), x), want)
    with pytest.raises(ValueError, match=r"'sigmoid'; allowed: 'none', 'tanh'"):
        reference(SimpleNamespace(approximate="sigmoid"), x)


def test_gelu_new_is_the_tanh_gelu_in_the_input_dtype() -> None:
    x = torch.linspace(-4, 4, 101)
    got = get_contract("gelu_new").reference(None, x)
    torch.testing.assert_close(got, F.gelu(x, approximate="tanh"), rtol=1e-6, atol=1e-6)
    half = get_contract("gelu_new").reference(None, x.bfloat16())
    assert half.dtype == torch.bfloat16


def test_gelu_quick_is_x_sigmoid_1702x() -> None:
    x = torch.linspace(-4, 4, 101)
    assert torch.equal(get_contract("gelu_quick").reference(None, x), x * torch.sigmoid(1.702 * x))


def test_gemma_rms_norm_scales_by_one_plus_weight_in_float32() -> None:
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    obj = SimpleNamespace(weight=torch.zeros(16), variance_epsilon=1e-6)
    out = get_contract("gemma_rms_norm").reference(obj, x)
    rms = x.pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt()
    torch.testing.assert_close(out, x * rms)  # weight 0: scale 1


def test_gemma_rms_norm_adds_the_residual_in_the_input_dtype() -> None:
    """Both SGLang Gemma norms add in x's dtype (RMSNorm adds in float32): s is rounded."""
    x = torch.tensor([[1.0, 2.0**-9, 3.0, 4.0]], dtype=torch.bfloat16)
    residual = torch.tensor([[1.0, 1.0, 0.0, 0.0]], dtype=torch.bfloat16)
    obj = SimpleNamespace(weight=torch.zeros(4, dtype=torch.bfloat16), variance_epsilon=1e-6)
    _, total = get_contract("gemma_rms_norm").reference(obj, x, residual)
    assert total.dtype == torch.bfloat16
    assert total[0, 1].item() == 1.0  # 1 + 2**-9 rounds to 1 in bfloat16


def test_layer_norm_computes_in_the_layer_dtype_and_honours_its_options() -> None:
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(2)).bfloat16()
    weight, bias = torch.full((8,), 2.0), torch.full((8,), 0.5)
    reference = get_contract("layer_norm").reference

    def layer(affine: bool, use_bias: bool) -> SimpleNamespace:
        return SimpleNamespace(
            hidden_size=8,
            variance_epsilon=1e-5,
            elementwise_affine=affine,
            use_bias=use_bias,
            dtype=torch.float32,
            weight=weight,
            bias=bias,
        )

    plain = F.layer_norm(x.float(), (8,), eps=1e-5)
    assert torch.equal(reference(layer(False, False), x), plain.bfloat16())
    assert torch.equal(reference(layer(True, False), x), (plain * 2).bfloat16())
    assert torch.equal(reference(layer(True, True), x), (plain * 2 + 0.5).bfloat16())


def test_mrope_lane_axes() -> None:
    assert lane_axes([2, 3, 3], interleaved=False) == [0, 0, 1, 1, 1, 2, 2, 2]
    # Qwen3-VL: lanes 1, 4, 7 from height, 2, 5 (up to 3 * 3) from width, the rest time.
    assert lane_axes([2, 3, 3], interleaved=True) == [0, 1, 2, 0, 1, 2, 0, 1]


def test_mrope_takes_each_lane_from_its_axis() -> None:
    """With one position per axis, lane j rotates by the angle of its axis' position."""
    head, rotary = 8, 8
    freqs = torch.outer(torch.arange(16.0), torch.ones(rotary // 2))  # angle = position
    obj = SimpleNamespace(
        head_size=head,
        rotary_dim=rotary,
        is_neox_style=True,
        cos_sin_cache=torch.cat((freqs.cos(), freqs.sin()), dim=-1),
        mrope_section=[1, 2, 1],
        mrope_interleaved=False,
    )
    positions = torch.tensor([[3], [5], [7]])  # t, h, w of one token
    query = torch.cat((torch.ones(1, 4), torch.zeros(1, 4)), dim=-1)  # x1 = 1, x2 = 0
    q, _ = get_contract("mrotary_embedding").reference(obj, positions, query, query.clone())
    angles = torch.tensor([3.0, 5.0, 5.0, 7.0])
    torch.testing.assert_close(q[0, :4], angles.cos())  # x1 * cos - x2 * sin
    torch.testing.assert_close(q[0, 4:], angles.sin())  # x2 * cos + x1 * sin


def test_mrope_3d_positions_need_sections() -> None:
    obj = SimpleNamespace(rotary_dim=8, mrope_section=None, cos_sin_cache=torch.zeros(4, 8))
    with pytest.raises(ValueError, match=r"need obj.mrope_section of 3 lane counts summing to"):
        get_contract("mrotary_embedding").reference(
            obj, torch.zeros(3, 1, dtype=torch.long), torch.zeros(1, 8), torch.zeros(1, 8)
        )
    with pytest.raises(ValueError, match=r"positions must be \[num_tokens\] or \[3, num_tokens\]"):
        get_contract("mrotary_embedding").reference(
            obj, torch.zeros(1, 1, 1, dtype=torch.long), torch.zeros(1, 8), torch.zeros(1, 8)
        )


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_clamp_position_is_exact_and_never_negative(dtype: torch.dtype) -> None:
    seq_lens = torch.tensor([0, 1, 2, 2**31 - 1], dtype=dtype)
    got = get_contract("clamp_position").reference(None, seq_lens)
    assert got.dtype == torch.int64
    assert got.tolist() == [0, 0, 1, 2**31 - 2]
    assert math.prod(get_contract("clamp_position").reference(None, seq_lens[:0]).shape) == 0
