"""The fused ops of Gemma, vision-language and LayerNorm models, routed through sglang-fl.

Each SGLang layer class, called the normal way, must cache a bridge bound to sglang-fl's
implementation, and compute what the same layer computes with ``backend=KernelBackend.TORCH``
(its ``forward_native``): exactly in float32, within the op contract's tolerance in bfloat16,
for empty batches, higher-rank and non-contiguous inputs too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("sglang")

from sglang.kernels.ops.attention.clamp_position import ClampPositionOp
from sglang.kernels.spec import KernelBackend
from sglang.srt.layers.activation import GeluAndMul, NewGELU, QuickGELU
from sglang.srt.layers.layernorm import Gemma3RMSNorm, GemmaRMSNorm, LayerNorm
from sglang.srt.layers.rotary_embedding import MRotaryEmbedding
from sglang.srt.layers.rotary_embedding.mrope import YaRNScalingMRotaryEmbedding

from sglang_fl.dispatch_report import read_log
from sglang_fl.ops import get_contract

DTYPES = (torch.float32, torch.bfloat16)
TORCH = KernelBackend.TORCH


@pytest.fixture(autouse=True)
def _routed(router: Any) -> None:
    """Every test here runs with sglang-fl's hook applied by SGLang's plugin loader."""


def routed_impl(layer: Any) -> str | None:
    return getattr(layer._forward_method, "sglang_fl_impl_id", None)


def randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float32).to(dtype)


def strided(tensor: torch.Tensor) -> torch.Tensor:
    """The same values as a non-contiguous view (every other column of a wider buffer)."""
    wide = torch.zeros(*tensor.shape[:-1], 2 * tensor.shape[-1], dtype=tensor.dtype)
    wide[..., ::2] = tensor
    view = wide[..., ::2]
    assert view.stride(-1) == 2
    return view


def assert_matches(op: str, got: Any, want: Any, dtype: torch.dtype) -> None:
    """Exact in float32; within the op contract's tolerance otherwise. Tuples element-wise."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_matches(op, g, w, dtype)
        return
    assert got.shape == want.shape
    assert got.dtype == want.dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    else:
        tol = get_contract(op).tolerance(dtype)
        torch.testing.assert_close(got, want, rtol=tol.rtol, atol=tol.atol)


def layer_record(dispatch_log: Path, cls: type) -> dict[str, Any]:
    name = f"{cls.__module__}.{cls.__qualname__}"
    rows = [r for r in read_log(dispatch_log) if r["event"] == "layer" and r["layer"] == name]
    assert rows, f"no dispatch record for {name}"
    return rows[0]


# --- activations ---------------------------------------------------------------------------

SHAPES = [(0, 64), (1, 32), (7, 256), (2, 3, 64)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("contiguous", [True, False], ids=["", "strided"])
@pytest.mark.parametrize(
    ("make", "op"),
    [
        (lambda: GeluAndMul("tanh"), "gelu_and_mul"),
        (lambda: GeluAndMul("none"), "gelu_and_mul"),
        (NewGELU, "gelu_new"),
        (QuickGELU, "gelu_quick"),
    ],
    ids=["gelu_and_mul-tanh", "gelu_and_mul-none", "gelu_new", "gelu_quick"],
)
def test_activation_matches_forward_native(
    make: Any, op: str, dtype: torch.dtype, shape: tuple[int, ...], contiguous: bool
) -> None:
    layer = make()
    x = randn(*shape, dtype=dtype, seed=1)
    x = x if contiguous else strided(x)
    before = x.clone()
    routed = layer(x)
    native = layer(x, backend=TORCH)  # same strides: SIMD and scalar paths round differently
    assert routed_impl(layer) == f"reference.{op}"
    assert_matches(op, routed, native, dtype)
    assert torch.equal(x, before), f"{op} must leave its input untouched"


def test_activation_layers_are_reported_routed(dispatch_log: Path) -> None:
    for layer, op in ((GeluAndMul(), "gelu_and_mul"), (NewGELU(), "gelu_new")):
        layer(randn(2, 32, dtype=torch.float32, seed=2))
        row = layer_record(dispatch_log, type(layer))
        assert (row["runner"], row["op"], row["impl_id"]) == ("sglang-fl", op, f"reference.{op}")


def test_gelu_and_mul_with_an_unknown_approximation_stays_with_sglang(dispatch_log: Path) -> None:
    layer = GeluAndMul("sigmoid")
    with pytest.raises(RuntimeError, match="approximate"):  # SGLang's own F.gelu refuses it
        layer(randn(2, 32, dtype=torch.float32, seed=3))
    assert routed_impl(layer) is None
    rows = [r for r in read_log(dispatch_log) if r.get("scope") == "instance"]
    assert any("approximate='sigmoid'" in r["reason"] for r in rows), rows


# --- Gemma norms -----------------------------------------------------------------------------


def make_gemma_norm(cls: type, hidden: int, dtype: torch.dtype) -> Any:
    layer = cls(hidden, eps=1e-6)
    with torch.no_grad():
        layer.weight.copy_(0.1 * randn(hidden, dtype=torch.float32, seed=7))
    return layer.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cls", [GemmaRMSNorm, Gemma3RMSNorm], ids=lambda c: c.__name__)
@pytest.mark.parametrize("tokens", [0, 1, 9])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("contiguous", [True, False], ids=["", "strided"])
def test_gemma_norms_match_forward_native(
    dtype: torch.dtype, cls: type, tokens: int, residual: bool, contiguous: bool
) -> None:
    layer = make_gemma_norm(cls, 128, dtype)
    x = randn(tokens, 128, dtype=dtype, seed=4)
    x = x if contiguous else strided(x)
    res = randn(tokens, 128, dtype=dtype, seed=5) if residual else None
    args = (lambda: (x.clone(), res.clone())) if residual else (lambda: (x.clone(),))
    native = layer(*args(), backend=TORCH)
    routed = layer(*args())
    assert routed_impl(layer) == "reference.gemma_rms_norm"
    assert_matches("gemma_rms_norm", routed, native, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gemma3_head_norm_on_a_strided_3d_view(dtype: torch.dtype) -> None:
    """Gemma 3 normalises q and k per head: ``[tokens, heads, head_dim]`` views of qkv."""
    layer = make_gemma_norm(Gemma3RMSNorm, 16, dtype)
    qkv = randn(5, 8 * 16, dtype=dtype, seed=6)
    q = qkv[:, : 4 * 16].unflatten(-1, (4, 16))
    assert not q.is_contiguous()
    before = qkv.clone()
    routed = layer(q)
    assert routed_impl(layer) == "reference.gemma_rms_norm"
    assert_matches("gemma_rms_norm", routed, layer(q, backend=TORCH), dtype)
    assert torch.equal(qkv, before)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gemma_rms_norm_post_residual_addition(dtype: torch.dtype) -> None:
    layer = make_gemma_norm(GemmaRMSNorm, 64, dtype)
    x, res, post = (randn(3, 2, 64, dtype=dtype, seed=s) for s in (8, 9, 10))
    native = layer(x.clone(), res.clone(), post.clone(), backend=TORCH)
    routed = layer(x.clone(), res.clone(), post.clone())
    assert routed_impl(layer) == "reference.gemma_rms_norm"
    assert_matches("gemma_rms_norm", routed, native, dtype)


def test_gemma_norms_are_reported_routed(dispatch_log: Path) -> None:
    for cls in (GemmaRMSNorm, Gemma3RMSNorm):
        make_gemma_norm(cls, 32, torch.float32)(randn(2, 32, dtype=torch.float32, seed=11))
        row = layer_record(dispatch_log, cls)
        assert (row["runner"], row["op"]) == ("sglang-fl", "gemma_rms_norm")


# --- LayerNorm -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens", [0, 1, 6])
@pytest.mark.parametrize(
    ("affine", "bias"), [(True, True), (True, False), (False, False)], ids=["wb", "w", "none"]
)
@pytest.mark.parametrize("compute", [torch.float32, "input"], ids=["fp32", "input"])
@pytest.mark.parametrize("contiguous", [True, False], ids=["", "strided"])
def test_layer_norm_matches_forward_native(
    dtype: torch.dtype, tokens: int, affine: bool, bias: bool, compute: Any, contiguous: bool
) -> None:
    compute_dtype = dtype if compute == "input" else compute
    layer = LayerNorm(96, eps=1e-5, elementwise_affine=affine, bias=bias, dtype=compute_dtype)
    with torch.no_grad():
        layer.weight.copy_(1.0 + 0.1 * randn(96, dtype=torch.float32, seed=12))
        layer.bias.copy_(0.1 * randn(96, dtype=torch.float32, seed=13))
    x = randn(tokens, 3, 96, dtype=dtype, seed=14)
    x = x if contiguous else strided(x)
    routed = layer(x)
    assert routed_impl(layer) == "reference.layer_norm"
    assert_matches("layer_norm", routed, layer(x, backend=TORCH), dtype)


# --- MRotaryEmbedding -------------------------------------------------------------------------

HEAD, ROTARY, Q_HEADS, KV_HEADS = 64, 64, 4, 2


def make_mrope(dtype: torch.dtype, *, interleaved: bool, neox: bool = True) -> MRotaryEmbedding:
    return MRotaryEmbedding(
        HEAD,
        ROTARY,
        512,
        10000,
        neox,
        dtype,
        mrope_section=[8, 12, 12],
        mrope_interleaved=interleaved,
    )


def qkv_slices(tokens: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k as SGLang's attention passes them: column slices of one qkv projection."""
    q_size, kv_size = Q_HEADS * HEAD, KV_HEADS * HEAD
    qkv = randn(tokens, q_size + 2 * kv_size, dtype=dtype, seed=20)
    return qkv[:, :q_size], qkv[:, q_size : q_size + kv_size]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens", [1, 13])
@pytest.mark.parametrize("positions_3d", [True, False], ids=["positions3d", "positions1d"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["sections", "interleaved"])
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
def test_mrotary_embedding_matches_forward_native(
    dtype: torch.dtype, tokens: int, positions_3d: bool, interleaved: bool, neox: bool
) -> None:
    layer = make_mrope(dtype, interleaved=interleaved, neox=neox)
    shape = (3, tokens) if positions_3d else (tokens,)
    positions = torch.randint(0, 400, shape, generator=torch.Generator().manual_seed(21))
    query, key = qkv_slices(tokens, dtype)
    assert query.stride(0) > query.shape[1]  # a slice of the wider qkv rows
    native = layer(positions, query.clone(), key.clone(), backend=TORCH)
    routed = layer(positions, query.clone(), key.clone())
    assert routed_impl(layer) == "reference.mrotary_embedding"
    assert_matches("mrotary_embedding", routed, native, dtype)


@pytest.mark.parametrize("positions_3d", [True, False], ids=["positions3d", "positions1d"])
def test_mrotary_embedding_of_an_empty_batch(positions_3d: bool) -> None:
    """SGLang's forward_native cannot view 0 rows as heads (its CUDA path returns early)."""
    layer = make_mrope(torch.bfloat16, interleaved=False)
    positions = torch.zeros((3, 0) if positions_3d else (0,), dtype=torch.int64)
    query, key = qkv_slices(0, torch.bfloat16)
    routed_q, routed_k = layer(positions, query, key)
    assert routed_impl(layer) == "reference.mrotary_embedding"
    assert (routed_q.shape, routed_k.shape) == (query.shape, key.shape)
    with pytest.raises(RuntimeError, match="ambiguous"):
        layer(positions, query, key, backend=TORCH)


def test_mrope_subclass_that_only_scales_the_cache_is_routed() -> None:
    layer = YaRNScalingMRotaryEmbedding(
        HEAD, ROTARY, 256, 10000, True, 2.0, torch.float32, mrope_section=[8, 12, 12]
    )
    positions = torch.randint(0, 300, (3, 5), generator=torch.Generator().manual_seed(22))
    query, key = qkv_slices(5, torch.float32)
    native = layer(positions, query.clone(), key.clone(), backend=TORCH)
    routed = layer(positions, query.clone(), key.clone())
    assert routed_impl(layer) == "reference.mrotary_embedding"
    assert_matches("mrotary_embedding", routed, native, torch.float32)


def test_mrope_is_its_own_op_not_plain_rope(dispatch_log: Path) -> None:
    make_mrope(torch.float32, interleaved=False)(torch.arange(2), *qkv_slices(2, torch.float32))
    row = layer_record(dispatch_log, MRotaryEmbedding)
    assert (row["runner"], row["op"]) == ("sglang-fl", "mrotary_embedding")


def test_glm_interleaved_mrope_stays_with_sglang(dispatch_log: Path) -> None:
    layer = MRotaryEmbedding(
        HEAD,
        ROTARY,
        256,
        10000,
        True,
        torch.float32,
        mrope_section=[8, 12, 12],
        mrope_interleaved_glm=True,
    )
    positions = torch.randint(0, 200, (3, 4), generator=torch.Generator().manual_seed(23))
    query, key = qkv_slices(4, torch.float32)
    layer(positions, query.clone(), key.clone())
    assert routed_impl(layer) is None
    rows = [r for r in read_log(dispatch_log) if r.get("scope") == "instance"]
    assert any("mrope_interleaved_glm" in r["reason"] for r in rows), rows


def test_mrope_fused_kv_write_is_handed_to_sglang(dispatch_log: Path) -> None:
    layer = make_mrope(torch.float32, interleaved=False)
    layer(torch.arange(3), *qkv_slices(3, torch.float32))  # bind the bridge
    with pytest.raises(AssertionError, match="save kv cache"):  # SGLang's own forward_native
        layer(torch.arange(3), *qkv_slices(3, torch.float32), {"k_buffer": None})
    rows = [r for r in read_log(dispatch_log) if r["event"] == "handoff"]
    assert any(r["op"] == "mrotary_embedding" for r in rows), rows


# --- ClampPositionOp ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("batch", [0, 1, 8])
@pytest.mark.parametrize("contiguous", [True, False], ids=["", "strided"])
def test_clamp_position_matches_forward_native(
    dtype: torch.dtype, batch: int, contiguous: bool
) -> None:
    op = ClampPositionOp()
    lengths = torch.randint(0, 100, (2 * batch,), generator=torch.Generator().manual_seed(24))
    lengths[::3] = 0
    seq_lens = lengths.to(dtype)[::2] if not contiguous else lengths.to(dtype)[:batch]
    before = seq_lens.clone()
    routed = op(seq_lens)
    native = op(seq_lens, backend=TORCH)
    assert routed_impl(op) == "reference.clamp_position"
    assert routed.dtype == torch.int64
    assert torch.equal(routed, native)
    assert torch.equal(seq_lens, before)
    assert bool((routed >= 0).all())
