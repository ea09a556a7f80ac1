"""SGLang's MoE layers and kernel functions, called the normal way, routed through sglang-fl.

``TopK`` and the experts of a real ``FusedMoE`` layer (its ``UnquantizedFusedMoEMethod``) are
compared with the same objects run with ``backend=KernelBackend.TORCH`` (SGLang's
``forward_native``): exactly in float32, within the contract's tolerance in bfloat16. SGLang
``torch.compile``s its grouped top-k helpers; compiling takes about a minute per shape on the
CPU, so these tests run them eagerly (``torch._dynamo`` disabled), which is the math they
compile.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("sglang")

from sglang.kernels.spec import KernelBackend

from sglang_fl.dispatch_report import read_log
from sglang_fl.ops import STANDARD_OPS

TORCH = KernelBackend.TORCH
BF16 = STANDARD_OPS["topk"].tolerance(torch.bfloat16)


@pytest.fixture(scope="module", autouse=True)
def _published(router: Any) -> Iterator[None]:
    """SGLang's process-wide config, as an engine publishes it, so its MoE layers can be built;
    the router is registered by SGLang's plugin loader first; torch.compile runs eagerly."""
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    reset_context()
    publish(
        ServerArgs(model_path="dummy", device="cpu"),
        role="test",
        ranks=SpawnRanks(world_rank=0, dp_rank=None),
    )
    compile_disabled = torch._dynamo.config.disable
    torch._dynamo.config.disable = True
    try:
        yield
    finally:
        torch._dynamo.config.disable = compile_disabled
        reset_context()


def routed_impl(layer: Any) -> str | None:
    return getattr(layer._forward_method, "sglang_fl_impl_id", None)


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float32).to(dtype)


def by_expert(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's experts in id order, weights in float32 (SGLang's native paths return int64
    ids, and bf16 weights without renormalization, where the op returns int32 and float32)."""
    order = ids.argsort(dim=-1)
    return weights.float().gather(-1, order), ids.to(torch.int32).gather(-1, order)


# --- TopK ------------------------------------------------------------------------------------

TOPK_CONFIGS = {
    "softmax,renormalize": ({"renormalize": True}, 8, 2),
    "softmax": ({"renormalize": False}, 60, 4),
    "sigmoid,correction_bias,scaled": (
        {
            "renormalize": True,
            "scoring_func": "sigmoid",
            "correction_bias": "bias",
            "routed_scaling_factor": 2.5,
            "apply_routed_scaling_factor_on_output": True,
        },
        16,
        4,
    ),
    "grouped,softmax": (
        {"renormalize": True, "use_grouped_topk": True, "num_expert_group": 4, "topk_group": 2},
        16,
        4,
    ),
    "grouped,sigmoid,correction_bias": (
        {
            "renormalize": True,
            "use_grouped_topk": True,
            "num_expert_group": 8,
            "topk_group": 4,
            "scoring_func": "sigmoid",
            "correction_bias": "bias",
            "routed_scaling_factor": 2.5,
        },
        64,
        8,
    ),
}


def make_topk(name: str) -> tuple[Any, int]:
    from sglang.srt.layers.moe.topk import TopK

    options, experts, top_k = TOPK_CONFIGS[name]
    options = dict(options)
    if options.get("correction_bias") == "bias":
        options["correction_bias"] = 0.1 * randn(experts, seed=11)
    return TopK(top_k, layer_id=0, **options), experts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("tokens", [1, 37])
@pytest.mark.parametrize("name", list(TOPK_CONFIGS))
def test_topk_matches_forward_native(name: str, tokens: int, dtype: torch.dtype) -> None:
    layer, experts = make_topk(name)
    hidden = randn(tokens, 32, dtype=dtype, seed=1)
    logits = randn(tokens, experts, dtype=dtype, seed=2)
    logits_before = logits.clone()
    native = layer(hidden, logits.clone(), backend=TORCH)
    routed = layer(hidden, logits)
    assert routed_impl(layer) == "reference.topk"
    assert type(routed).__name__ == "StandardTopKOutput"
    assert routed.topk_weights.dtype == torch.float32
    assert routed.topk_ids.dtype == torch.int32
    assert routed.router_logits is logits
    assert torch.equal(logits, logits_before), "topk must leave the router logits untouched"
    weights, ids = by_expert(routed.topk_weights, routed.topk_ids)
    want_weights, want_ids = by_expert(native.topk_weights, native.topk_ids)
    assert torch.equal(ids, want_ids)
    if dtype == torch.float32:
        torch.testing.assert_close(weights, want_weights, rtol=0, atol=0)
    else:
        torch.testing.assert_close(weights, want_weights, rtol=BF16.rtol, atol=BF16.atol)


def test_topk_masks_padded_rows_like_sglang() -> None:
    """SGLang's post-processing stays: rows past num_token_non_padded get expert id -1."""
    layer, experts = make_topk("softmax,renormalize")
    logits = randn(6, experts, seed=3)
    non_padded = torch.tensor(4)
    native = layer(logits, logits.clone(), num_token_non_padded=non_padded, backend=TORCH)
    routed = layer(logits, logits.clone(), num_token_non_padded=non_padded)
    assert routed_impl(layer) == "reference.topk"
    assert (routed.topk_ids[4:] == -1).all()
    assert torch.equal(routed.topk_ids, native.topk_ids.to(torch.int32))


def test_topk_option_outside_the_contract_stays_with_sglang(dispatch_log: Path) -> None:
    from sglang.srt.layers.moe.topk import TopK

    def first_two(hidden_states, gating_output, topk, renormalize):  # type: ignore[no-untyped-def]
        ids = torch.arange(topk, dtype=torch.int32).expand(gating_output.shape[0], -1)
        return torch.ones(ids.shape, dtype=torch.float32), ids.contiguous()

    layer = TopK(2, layer_id=0, custom_routing_function=first_two)
    logits = randn(3, 8, seed=4)
    out = layer(logits, logits)
    assert routed_impl(layer) is None
    assert out.topk_ids.tolist() == [[0, 1]] * 3
    refusals = [
        r
        for r in read_log(dispatch_log)
        if r["event"] == "layer" and r.get("scope") == "instance" and r["op"] == "topk"
    ]
    assert any("custom_routing_function" in r["reason"] for r in refusals), refusals


# --- FusedMoE experts (UnquantizedFusedMoEMethod) ------------------------------------------


def make_experts(experts: int, top_k: int, dtype: torch.dtype, activation: str) -> Any:
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    layer = FusedMoE(
        num_experts=experts,
        hidden_size=64,
        intermediate_size=32,
        layer_id=0,
        top_k=top_k,
        params_dtype=dtype,
        activation=activation,
    )
    with torch.no_grad():
        layer.w13_weight.copy_(randn(*layer.w13_weight.shape, seed=5) / 8)
        layer.w2_weight.copy_(randn(*layer.w2_weight.shape, seed=6) / 6)
    return layer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("tokens", [1, 29])
@pytest.mark.parametrize(("experts", "top_k", "activation"), [(8, 2, "silu"), (60, 4, "gelu")])
def test_fused_moe_matches_forward_native(
    experts: int, top_k: int, activation: str, tokens: int, dtype: torch.dtype
) -> None:
    from sglang.srt.layers.moe.topk import TopK

    layer = make_experts(experts, top_k, dtype, activation)
    router = TopK(top_k, layer_id=0, renormalize=True)
    x = randn(tokens, 64, dtype=dtype, seed=7)
    x_before = x.clone()
    topk_output = router(x, randn(tokens, experts, dtype=dtype, seed=8))
    dispatched = layer.dispatcher.dispatch(hidden_states=x, topk_output=topk_output)
    native = layer.quant_method.forward(layer=layer, dispatch_output=dispatched, backend=TORCH)
    routed = layer.run_moe_core(dispatched)  # FusedMoE's own call into its method
    assert routed_impl(layer.quant_method) == "reference.fused_moe"
    assert type(routed).__name__ == "StandardCombineInput"
    assert routed.hidden_states.dtype == dtype
    assert torch.equal(x, x_before), "fused_moe must leave its input untouched"
    tolerance = (0.0, 0.0) if dtype == torch.float32 else (BF16.rtol, BF16.atol)
    torch.testing.assert_close(
        routed.hidden_states, native.hidden_states, rtol=tolerance[0], atol=tolerance[1]
    )


# --- kernel functions ------------------------------------------------------------------------


def test_shared_expert_gate_functions_run_where_triton_cannot() -> None:
    """Qwen2-MoE's Triton-only gate functions, as its model module binds them, run here."""
    from sglang.srt.models import qwen2_moe

    hidden, gate, shared, final = (randn(5, 48, seed=s) for s in (9, 10, 11, 12))
    gate = gate[0] / 7
    want_gated = torch.sigmoid(F.linear(hidden, gate.unsqueeze(0))) * shared
    gated = qwen2_moe.fused_gate_sigmoid_mul(hidden, gate, shared)
    torch.testing.assert_close(gated, want_gated)

    expected = final + want_gated
    assert qwen2_moe.fused_gate_sigmoid_mul_add(hidden, gate, shared, final) is None
    torch.testing.assert_close(final, expected)  # added in place, as SGLang's kernel does


def test_kernel_function_routes_are_reported(dispatch_log: Path) -> None:
    rows = [r for r in read_log(dispatch_log) if r["event"] == "function"]
    functions = {r["function"]: r for r in rows}
    for name in ("fused_gate_sigmoid_mul", "fused_gate_sigmoid_mul_add"):
        row = functions[f"sglang.kernels.ops.elementwise.elementwise.{name}"]
        assert row["runner"] == "sglang-fl"
        assert row["op"] == "fused_gate_sigmoid_mul"
        assert row["impl_id"] == "reference.fused_gate_sigmoid_mul"


def test_a_specialised_moe_method_stays_with_sglang(dispatch_log: Path) -> None:
    from sglang.srt.layers.moe.topk import TopK
    from sglang.srt.layers.quantization.unquant import UnquantizedFusedMoEMethod

    class ModelSpecificMoEMethod(UnquantizedFusedMoEMethod):
        """Like SGLang's model-specific methods: same forwards, its own weight handling."""

    layer = make_experts(8, 2, torch.float32, "silu")
    layer.quant_method.__class__ = ModelSpecificMoEMethod
    x = randn(3, 64, seed=13)
    topk_output = TopK(2, layer_id=0)(x, randn(3, 8, seed=14))
    dispatched = layer.dispatcher.dispatch(hidden_states=x, topk_output=topk_output)
    out = layer.run_moe_core(dispatched)
    assert routed_impl(layer.quant_method) is None
    assert out.hidden_states.shape == (3, 64)
    rows = [
        r
        for r in read_log(dispatch_log)
        if r["event"] == "layer" and r["layer"].endswith("ModelSpecificMoEMethod")
    ]
    assert [(r["op"], r["runner"]) for r in rows] == [("fused_moe", "sglang")]
    assert "specialises UnquantizedFusedMoEMethod" in rows[0]["reason"]
