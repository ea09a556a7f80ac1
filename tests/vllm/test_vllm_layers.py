"""vLLM's layers bound to sglang-fl compute what their ``forward_native`` computes.

Each routed layer is built the way vLLM builds it (inside its config, so ``CustomOp`` picks the
forward through the hooked ``dispatch_forward``), called through ``layer(...)``, and compared
with vLLM's own ``forward_native`` on clones of the same inputs: equal for float32, within the
op contract's tolerance for bfloat16.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from sglang_fl.dispatch_report import read_log
from sglang_fl.ops import STANDARD_OPS

pytest.importorskip("vllm")

pytestmark = pytest.mark.usefixtures("vllm_config")

DTYPES = (torch.float32, torch.bfloat16)
TOKENS = 7


def _clone(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


def _in(dtype: torch.dtype, value: Any) -> Any:
    """Floating tensors in ``dtype``; positions (integers) and ``None`` as they are."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    return value


def _assert_close(got: Any, want: Any, op_name: str, dtype: torch.dtype) -> None:
    if isinstance(want, tuple):
        assert isinstance(got, tuple)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _assert_close(g, w, op_name, dtype)
        return
    assert got.shape == want.shape
    assert got.dtype == want.dtype
    if dtype == torch.float32:
        assert torch.equal(got, want), f"{op_name}: float32 differs from vLLM's forward_native"
    else:
        tol = STANDARD_OPS[op_name].tolerances[dtype]
        torch.testing.assert_close(got.float(), want.float(), atol=tol.atol, rtol=tol.rtol)


def check_routed(layer: Any, op_name: str, dtype: torch.dtype, *args: Any) -> None:
    """``layer(*args)`` runs the reference implementation and matches ``forward_native``."""
    layer = layer.to(dtype)
    args = tuple(_in(dtype, arg) for arg in args)
    want = layer.forward_native(*map(_clone, args))
    got = layer(*map(_clone, args))
    assert layer._forward_method.sglang_fl_impl_id == f"reference.{op_name}"
    _assert_close(got, want, op_name, dtype)


def rand(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=_GEN).to(dtype)


_GEN = torch.Generator().manual_seed(0)


# --- activations ---------------------------------------------------------------------------


def _activation_layers() -> dict[str, Callable[[], Any]]:
    from vllm.model_executor.layers import activation

    return {
        "silu_and_mul": activation.SiluAndMul,
        "gelu_and_mul": lambda: activation.GeluAndMul("none"),
        "gelu_and_mul[tanh]": lambda: activation.GeluAndMul("tanh"),
        "gelu_new": activation.NewGELU,
        "gelu_quick": activation.QuickGELU,
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "name", ["silu_and_mul", "gelu_and_mul", "gelu_and_mul[tanh]", "gelu_new", "gelu_quick"]
)
def test_activation(name: str, dtype: torch.dtype) -> None:
    layer = _activation_layers()[name]()
    op_name = name.split("[")[0]
    check_routed(layer, op_name, dtype, rand(TOKENS, 128))
    check_routed(layer, op_name, dtype, rand(2, TOKENS, 128))  # leading dims kept


# --- norms ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_rms_norm(residual: bool, dtype: torch.dtype) -> None:
    from vllm.model_executor.layers.layernorm import RMSNorm

    layer = RMSNorm(128, eps=1e-5)
    with torch.no_grad():
        layer.weight.copy_(1 + 0.1 * rand(128))
    args = (rand(TOKENS, 128), rand(TOKENS, 128)) if residual else (rand(TOKENS, 128),)
    check_routed(layer, "rms_norm", dtype, *args)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_gemma_rms_norm(residual: bool, dtype: torch.dtype) -> None:
    from vllm.model_executor.layers.layernorm import GemmaRMSNorm

    layer = GemmaRMSNorm(128)
    with torch.no_grad():
        layer.weight.copy_(0.1 * rand(128))
    args = (rand(TOKENS, 128), rand(TOKENS, 128)) if residual else (rand(TOKENS, 128),)
    check_routed(layer, "gemma_rms_norm", dtype, *args)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "options",
    [{}, {"bias": False}, {"elementwise_affine": False}],
    ids=["weight+bias", "weight", "no-affine"],
)
def test_layer_norm(options: dict[str, bool], dtype: torch.dtype) -> None:
    from vllm.model_executor.layers.layernorm import LayerNorm

    layer = LayerNorm(128, **options)
    with torch.no_grad():
        for param in layer.parameters():
            param.copy_(rand(128))
    check_routed(layer, "layer_norm", dtype, rand(3, TOKENS, 128))


def test_layer_norm_reduces_in_the_wider_dtype() -> None:
    """float32 weights with bfloat16 input: vLLM normalises in float32, and so does the bridge."""
    from vllm.model_executor.layers.layernorm import LayerNorm

    layer = LayerNorm(128, dtype=torch.float32)
    with torch.no_grad():
        layer.weight.copy_(rand(128))
    x = rand(TOKENS, 128, dtype=torch.bfloat16)
    got = layer(x.clone())
    assert layer._forward_method.sglang_fl_impl_id == "reference.layer_norm"
    assert torch.equal(got, layer.forward_native(x.clone()))


# --- rotary ---------------------------------------------------------------------------------


def _rope(kind: str, rotary_dim: int, neox: bool) -> Any:
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
    from vllm.model_executor.layers.rotary_embedding.llama3_rope import Llama3RotaryEmbedding

    common = (64, rotary_dim, 256, 10000.0, neox, torch.float32)
    if kind == "llama3":  # a subclass whose cos_sin_cache differs, whose math does not
        return Llama3RotaryEmbedding(*common, 8.0, 1.0, 4.0, 64)
    return RotaryEmbedding(*common)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    ("kind", "rotary_dim", "neox"),
    [("plain", 64, True), ("plain", 64, False), ("plain", 32, True), ("llama3", 64, True)],
    ids=["neox", "gptj", "partial", "llama3"],
)
def test_rotary_embedding(kind: str, rotary_dim: int, neox: bool, dtype: torch.dtype) -> None:
    layer = _rope(kind, rotary_dim, neox)
    positions = torch.randint(0, 256, (TOKENS,), generator=_GEN)
    query, key = rand(TOKENS, 4 * 64), rand(TOKENS, 2 * 64)
    check_routed(layer, "rotary_embedding", dtype, positions, query, key)


def test_rotary_embedding_without_key_is_handed_to_vllm(dispatch_log: Path) -> None:
    layer = _rope("plain", 64, True)
    positions, query = torch.arange(TOKENS), rand(TOKENS, 4 * 64)
    got, key = layer(positions, query.clone(), None)
    assert key is None
    assert torch.equal(got, layer.forward_native(positions, query.clone(), None)[0])
    handoffs = [r for r in read_log(dispatch_log) if r["event"] == "handoff"]
    assert any(r["op"] == "rotary_embedding" and "without key" in r["reason"] for r in handoffs)
    assert {r["runner"] for r in handoffs} == {"vllm"}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("interleaved", [False, True], ids=["sections", "interleaved"])
@pytest.mark.parametrize("three_d", [False, True], ids=["1d", "3d"])
def test_mrotary_embedding(three_d: bool, interleaved: bool, dtype: torch.dtype) -> None:
    from vllm.model_executor.layers.rotary_embedding.mrope import MRotaryEmbedding

    layer = MRotaryEmbedding(
        64, 64, 256, 10000.0, True, torch.float32, [8, 12, 12], mrope_interleaved=interleaved
    )
    shape = (3, TOKENS) if three_d else (TOKENS,)
    positions = torch.randint(0, 256, shape, generator=_GEN)
    query, key = rand(TOKENS, 4 * 64), rand(TOKENS, 2 * 64)
    check_routed(layer, "mrotary_embedding", dtype, positions, query, key)


# --- what stays with vLLM, and the report -----------------------------------------------------


def test_rms_norm_with_partial_variance_stays_with_vllm(dispatch_log: Path) -> None:
    from vllm.model_executor.layers.layernorm import RMSNorm

    layer = RMSNorm(128, var_hidden_size=64)
    x = rand(TOKENS, 128)
    assert torch.equal(layer(x), layer.forward_native(x))
    assert layer._forward_method.__name__ == "forward_native"
    refusals = [r for r in read_log(dispatch_log) if r.get("scope") == "instance"]
    assert any("var_hidden_size=64" in r["reason"] for r in refusals)


def test_subclass_overriding_forward_native_stays_with_vllm(dispatch_log: Path) -> None:
    from vllm.model_executor.layers.rotary_embedding.ernie45_vl_rope import (
        Ernie4_5_VLRotaryEmbedding,
    )

    layer = Ernie4_5_VLRotaryEmbedding(64, 64, 256, 10000.0, True, torch.float32, [8, 12, 12])
    assert layer._forward_method.__name__ == "forward_native"
    rows = [
        r
        for r in read_log(dispatch_log)
        if r.get("layer", "").endswith(".Ernie4_5_VLRotaryEmbedding")
    ]
    assert rows
    assert rows[0]["runner"] == "vllm"
    assert "overrides forward_native" in rows[0]["reason"]
    assert "left to vLLM" in rows[0]["reason"]


@pytest.mark.custom_ops("none", "-rms_norm")
def test_custom_ops_disabling_an_op_by_name_keeps_vllms_forward(dispatch_log: Path) -> None:
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm

    norm, act = RMSNorm(128), SiluAndMul()
    assert norm._forward_method.__name__ == "forward_native"
    act(rand(TOKENS, 128))
    assert act._forward_method.sglang_fl_impl_id == "reference.silu_and_mul"
    refusals = [r for r in read_log(dispatch_log) if r.get("scope") == "instance"]
    assert any("'-rms_norm'" in r["reason"] for r in refusals)


@pytest.mark.custom_ops("all")
def test_custom_ops_enabled_are_routed_too() -> None:
    from vllm.model_executor.layers.layernorm import RMSNorm

    layer = RMSNorm(128)
    check_routed(layer, "rms_norm", torch.float32, rand(TOKENS, 128))


def test_every_routed_class_is_reported_once_from_this_process(dispatch_log: Path) -> None:
    from vllm.model_executor.layers.activation import SiluAndMul

    from sglang_fl.integrations.vllm.compat import LAYER_CLASSES

    SiluAndMul()  # at least one, whichever tests ran before
    rows = [r for r in read_log(dispatch_log) if r["event"] == "layer" and "scope" not in r]
    layers = [r["layer"] for r in rows]
    assert len(layers) == len(set(layers)), "a layer class was planned twice"
    routed = {r["op"] for r in rows if r["runner"] == "sglang-fl"}
    assert "silu_and_mul" in routed
    assert routed <= set(LAYER_CLASSES)
    plugin = [r for r in read_log(dispatch_log) if r["event"] == "plugin"]
    assert len(plugin) == 1
    assert plugin[0]["engine"] == "vllm"
