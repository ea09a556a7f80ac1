"""SGLang's standard layers, called the normal way, routed through sglang-fl's bridges.

Every routed call is compared with the same layer's ``forward_native`` (SGLang's own
reference, reached with ``backend=KernelBackend.TORCH``) on copies of the same inputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("sglang")

from sglang.kernels.fused_op import (
    clear_fused_op_trace,
    disable_fused_op_trace,
    enable_fused_op_trace,
    get_fused_op_trace,
    set_fused_op_backend,
)
from sglang.kernels.spec import KernelBackend
from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.rotary_embedding import RotaryEmbedding, get_rope

from sglang_fl.dispatch_report import read_log

DTYPES = (torch.float32, torch.bfloat16)
TORCH = KernelBackend.TORCH


@pytest.fixture(autouse=True)
def _routed(router: Any) -> None:
    """Every test here runs with sglang-fl's hook applied by SGLang's plugin loader."""


def records(path: Path, **match: Any) -> list[dict[str, Any]]:
    """Dispatch-log records of this process matching every ``key=value`` given."""
    return [r for r in read_log(path) if all(r.get(k) == v for k, v in match.items())]


def routed_impl(layer: Any) -> str | None:
    """The sglang-fl implementation the layer's cached forward is bound to, if any."""
    return getattr(layer._forward_method, "sglang_fl_impl_id", None)


def clones(*tensors: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    return tuple(None if t is None else t.clone() for t in tensors)


def randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float32).to(dtype)


# --- SiluAndMul ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 32), (7, 256), (33, 704), (2, 3, 64)], ids=str)
def test_silu_and_mul_matches_forward_native(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    layer = SiluAndMul()
    x = randn(*shape, dtype=dtype, seed=1)
    x_before = x.clone()
    routed = layer(x)
    native = layer(x.clone(), backend=TORCH)
    assert routed_impl(layer) == "reference.silu_and_mul"
    assert routed.shape == (*shape[:-1], shape[-1] // 2)
    assert routed.dtype == dtype
    torch.testing.assert_close(routed, native, rtol=0, atol=0)
    assert torch.equal(x, x_before), "silu_and_mul must leave its input untouched"


# --- RMSNorm -------------------------------------------------------------------------------


def make_norm(hidden: int, dtype: torch.dtype, **options: Any) -> RMSNorm:
    layer = RMSNorm(hidden, eps=1e-6, **options)
    with torch.no_grad():
        layer.weight.copy_(1.0 + 0.1 * randn(hidden, dtype=torch.float32, seed=7))
    return layer.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens", [1, 5, 64])
@pytest.mark.parametrize("hidden", [16, 128, 1024])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_rms_norm_matches_forward_native(
    dtype: torch.dtype, tokens: int, hidden: int, residual: bool
) -> None:
    layer = make_norm(hidden, dtype)
    x = randn(tokens, hidden, dtype=dtype, seed=2)
    res = randn(tokens, hidden, dtype=dtype, seed=3) if residual else None
    native = layer(*clones(x, res), backend=TORCH) if residual else layer(x.clone(), backend=TORCH)
    routed = layer(*clones(x, res)) if residual else layer(x.clone())
    assert routed_impl(layer) == "reference.rms_norm"
    if residual:
        assert isinstance(routed, tuple)
        assert len(routed) == 2
        torch.testing.assert_close(routed[0], native[0], rtol=0, atol=0)
        torch.testing.assert_close(routed[1], native[1], rtol=0, atol=0)
    else:
        torch.testing.assert_close(routed, native, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_post_residual_addition(dtype: torch.dtype) -> None:
    """SGLang adds ``post_residual_addition`` to the residual first, as its CUDA path does."""
    layer = make_norm(256, dtype)
    x, res, post = (randn(9, 256, dtype=dtype, seed=s) for s in (4, 5, 6))
    native = layer(*clones(x, res, post), backend=TORCH)
    routed = layer(*clones(x, res, post))
    assert routed_impl(layer) == "reference.rms_norm"
    # fp32: (x + r) + p vs x + (r + p) differ in the last bit; bf16 also rounds r + p once.
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(routed[0], native[0], **tol)
    torch.testing.assert_close(routed[1], native[1], **tol)


def test_rms_norm_3d_input_keeps_shape() -> None:
    layer = make_norm(64, torch.float32)
    x = randn(2, 3, 64, dtype=torch.float32, seed=8)
    routed = layer(x.clone())
    assert routed.shape == x.shape
    torch.testing.assert_close(routed, layer(x.clone(), backend=TORCH), rtol=0, atol=0)


def test_rms_norm_options_outside_the_op_stay_with_sglang(dispatch_log: Path) -> None:
    layer = make_norm(64, torch.bfloat16, cast_x_before_out_mul=True)
    x = randn(4, 64, dtype=torch.bfloat16, seed=9)
    torch.testing.assert_close(layer(x.clone()), layer(x.clone(), backend=TORCH), rtol=0, atol=0)
    assert routed_impl(layer) is None
    assert layer._forward_method.__name__ == "forward_native"
    rows = records(dispatch_log, event="layer", scope="instance", runner="sglang")
    (row,) = [r for r in rows if "cast_x_before_out_mul" in r["reason"]]
    assert row["layer"] == "sglang.srt.layers.layernorm.RMSNorm"


def test_rms_norm_quant_linear_argument_is_handed_to_sglang(dispatch_log: Path) -> None:
    layer = make_norm(64, torch.float32)
    x = randn(4, 64, dtype=torch.float32, seed=10)
    layer(x.clone())  # bind the bridge
    linear = torch.nn.Linear(64, 64)
    out = layer(x.clone(), quant_linear=linear)
    torch.testing.assert_close(out, layer(x.clone(), backend=TORCH), rtol=0, atol=0)
    rows = records(dispatch_log, event="handoff", layer="sglang.srt.layers.layernorm.RMSNorm")
    assert len(rows) == 1
    assert "quant_linear" in rows[0]["reason"]
    layer(x.clone(), quant_linear=linear)
    assert len(records(dispatch_log, event="handoff", op="rms_norm")) == 1, "logged once"


def test_models_attaching_a_plain_projection_stay_routed() -> None:
    """Llama/Qwen2 call ``fuse_input_quant`` on every norm; unquantized, that changes nothing."""
    layer = make_norm(64, torch.float32)
    layer.fuse_input_quant(torch.nn.Linear(64, 64))
    x = randn(3, 64, dtype=torch.float32, seed=11)
    torch.testing.assert_close(layer(x.clone()), layer(x.clone(), backend=TORCH), rtol=0, atol=0)
    assert routed_impl(layer) == "reference.rms_norm"


def test_norm_feeding_a_static_fp8_linear_stays_with_sglang(dispatch_log: Path) -> None:
    """SGLang fuses the FP8 input quantization into such a norm: that path stays SGLang's."""
    from sglang.srt.layers.linear import ReplicatedLinear
    from sglang.srt.layers.quantization.fp8 import Fp8Config

    config = Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="static")
    layer = make_norm(64, torch.bfloat16)
    layer.fuse_input_quant(ReplicatedLinear(64, 64, bias=False, quant_config=config))
    x = randn(3, 64, dtype=torch.bfloat16, seed=14)
    torch.testing.assert_close(layer(x.clone()), layer(x.clone(), backend=TORCH), rtol=0, atol=0)
    assert routed_impl(layer) is None
    rows = records(dispatch_log, event="layer", scope="instance", op="rms_norm")
    assert any("FP8 input quantization" in r["reason"] for r in rows), rows


class OnePlusWeightNorm(RMSNorm):
    """A Gemma-style subclass: same attributes as RMSNorm, but it computes x * (1 + w)."""

    def forward_native(self, x, residual=None, post_residual_addition=None, quant_linear=None):
        orig = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (x * (1.0 + self.weight.float())).to(orig)


def test_subclass_with_its_own_math_is_left_to_sglang(dispatch_log: Path) -> None:
    layer = OnePlusWeightNorm(32)
    with torch.no_grad():
        layer.weight.normal_()
    x = randn(3, 32, dtype=torch.float32, seed=12)
    expected = layer.forward_native(x.clone())
    torch.testing.assert_close(layer(x.clone()), expected, rtol=0, atol=0)
    assert routed_impl(layer) is None
    (row,) = records(dispatch_log, event="layer", layer=f"{__name__}.OnePlusWeightNorm")
    assert row["runner"] == "sglang"
    assert row["op"] == "rms_norm"
    assert "overrides forward_native" in row["reason"]


# --- RotaryEmbedding -----------------------------------------------------------------------


def make_rope(head_size: int, rotary_dim: int, neox: bool, dtype: torch.dtype) -> RotaryEmbedding:
    return RotaryEmbedding(head_size, rotary_dim, 256, 10000, neox, dtype)


def qk(tokens: int, head_size: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's flattened ``[num_tokens, heads * head_size]`` query (4 heads) and key (2)."""
    return (
        randn(tokens, 4 * head_size, dtype=dtype, seed=20),
        randn(tokens, 2 * head_size, dtype=dtype, seed=21),
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens", [1, 7, 40])
@pytest.mark.parametrize(("head_size", "rotary_dim"), [(64, 64), (64, 32), (128, 64)])
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "interleaved"])
@pytest.mark.parametrize("offsets", [False, True], ids=["", "offsets"])
def test_rotary_embedding_matches_forward_native(
    dtype: torch.dtype, tokens: int, head_size: int, rotary_dim: int, neox: bool, offsets: bool
) -> None:
    layer = make_rope(head_size, rotary_dim, neox, dtype)
    positions = torch.randint(0, 100, (tokens,), generator=torch.Generator().manual_seed(22))
    offs = torch.full((tokens,), 17, dtype=torch.int64) if offsets else None
    query, key = qk(tokens, head_size, dtype)
    native_q, native_k = layer(positions, *clones(query, key), offs, backend=TORCH)
    routed_q, routed_k = layer(positions, *clones(query, key), offs)
    assert routed_impl(layer) == "reference.rotary_embedding"
    assert routed_q.shape == query.shape
    assert routed_k.shape == key.shape
    torch.testing.assert_close(routed_q, native_q, rtol=0, atol=0)
    torch.testing.assert_close(routed_k, native_k, rtol=0, atol=0)
    if rotary_dim < head_size:  # the pass-through part of each head is untouched
        heads_q = routed_q.view(tokens, -1, head_size)[..., rotary_dim:]
        torch.testing.assert_close(heads_q, query.view(tokens, -1, head_size)[..., rotary_dim:])


def test_rotary_cos_sin_converted_once_per_dtype() -> None:
    layer = make_rope(64, 64, True, torch.float32)
    positions = torch.arange(5)
    for dtype in (torch.bfloat16, torch.bfloat16, torch.float32):
        layer(positions, *qk(5, 64, dtype))
    halves = layer._forward_method.cos_sin_halves
    assert set(halves) == {torch.bfloat16, torch.float32}
    cos_before = halves[torch.bfloat16][1]
    layer(positions, *qk(5, 64, torch.bfloat16))
    assert halves[torch.bfloat16][1] is cos_before, "a call must not reconvert the cache"
    assert cos_before.shape == (256, 32)
    # SGLang replaces the cache when it grows: the halves follow the new cache.
    layer._ensure_cos_sin_cache_length(300)
    layer(positions, *qk(5, 64, torch.bfloat16))
    assert halves[torch.bfloat16][1] is not cos_before
    assert halves[torch.bfloat16][1].shape[0] == layer.cos_sin_cache.shape[0]


def test_rotary_fused_kv_write_is_handed_to_sglang(dispatch_log: Path) -> None:
    layer = make_rope(64, 64, True, torch.float32)
    positions = torch.arange(3)
    layer(positions, *qk(3, 64, torch.float32))  # bind the bridge
    marker = {"key_cache": None}
    # SGLang's own CPU path (forward_native) refuses the argument: proof the call went there.
    with pytest.raises(AssertionError, match="fused_set_kv_buffer_arg"):
        layer(positions, *qk(3, 64, torch.float32), None, marker)
    (row,) = records(dispatch_log, event="handoff", op="rotary_embedding")
    assert "fused_set_kv_buffer_arg" in row["reason"]


def test_rotary_subclass_without_own_math_is_routed() -> None:
    """Llama 3 scaling only changes how the cos/sin cache is built, not forward_native."""
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    layer = get_rope(64, 64, 256, 500000, True, scaling, torch.float32)
    assert type(layer).__name__ == "Llama3RotaryEmbedding"
    positions = torch.arange(6)
    query, key = qk(6, 64, torch.float32)
    native = layer(positions, *clones(query, key), backend=TORCH)
    routed = layer(positions, *clones(query, key))
    assert routed_impl(layer) == "reference.rotary_embedding"
    torch.testing.assert_close(routed, native, rtol=0, atol=0)


# --- SGLang's own switches -----------------------------------------------------------------


def test_forced_backend_and_explicit_backend_bypass_the_route() -> None:
    layer = SiluAndMul()
    x = randn(4, 64, dtype=torch.float32, seed=30)
    enable_fused_op_trace()
    clear_fused_op_trace()
    try:
        layer(x)
        layer(x, backend=TORCH)
        set_fused_op_backend(TORCH)
        try:
            layer(x)
        finally:
            set_fused_op_backend(None)
        labels = [record.backend for record in get_fused_op_trace()]
    finally:
        disable_fused_op_trace()
        clear_fused_op_trace()
    assert labels == ["sglang_fl[reference.silu_and_mul]", "torch", "torch"]
