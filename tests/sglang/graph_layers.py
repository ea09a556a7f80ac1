"""Run each routed SGLang layer eagerly and under ``torch.compile(fullgraph=True)``; print JSON.

Started in a subprocess by ``test_graph_compile.py``, with a vendor wheel on ``PYTHONPATH``
whose kernels dynamo cannot trace. For each layer: whether the compiled outputs, and the inputs
after the call, equal the eager ones (on copies of the same inputs), the call targets
of the graph dynamo produced, and the implementation the layer is bound to. One JSON line per
layer on stdout; a layer that fails to compile reports the error instead.

Usage: ``python graph_layers.py [LAYER ...]`` (default: every layer below).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class LayerCase:
    """One routed SGLang layer: how to call it and how to make its inputs.

    ``module`` is what moves to a device (``None``: a kernel function), ``bound`` the object
    whose cached forward names the implementation, ``inputs(seed)`` fresh CPU inputs.
    """

    module: torch.nn.Module | None
    bound: Any
    call: Callable[..., Any]
    inputs: Callable[[int], tuple[Any, ...]]

    def to(self, device: str) -> LayerCase:
        if self.module is not None:
            self.module.to(device)
        return self

    def inputs_on(self, device: str, seed: int) -> tuple[Any, ...]:
        return tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in self.inputs(seed))


def randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float32).to(dtype)


def _layer(layer: torch.nn.Module, inputs: Callable[[int], tuple[Any, ...]]) -> LayerCase:
    return LayerCase(layer, layer, lambda *args: layer(*args), inputs)


def _activation(cls_name: str, *args: Any) -> LayerCase:
    from sglang.srt.layers import activation

    return _layer(getattr(activation, cls_name)(*args), lambda seed: (randn(5, 64, seed=seed),))


def _norm(cls_name: str, residual: bool) -> LayerCase:
    from sglang.srt.layers import layernorm

    layer = getattr(layernorm, cls_name)(64, eps=1e-6)
    with torch.no_grad():
        layer.weight.copy_(0.1 * randn(64, seed=7))
    if not residual:
        return _layer(layer, lambda seed: (randn(5, 64, seed=seed),))
    return _layer(layer, lambda seed: (randn(5, 64, seed=seed), randn(5, 64, seed=seed + 1)))


def _layer_norm() -> LayerCase:
    from sglang.srt.layers.layernorm import LayerNorm

    layer = LayerNorm(64, eps=1e-5, elementwise_affine=True, bias=True, dtype=torch.float32)
    return _layer(layer, lambda seed: (randn(5, 64, seed=seed),))


def _positions(shape: tuple[int, ...], limit: int, seed: int) -> torch.Tensor:
    return torch.randint(0, limit, shape, generator=torch.Generator().manual_seed(seed))


def _rope() -> LayerCase:
    from sglang.srt.layers.rotary_embedding import RotaryEmbedding

    layer = RotaryEmbedding(32, 16, 256, 10000, True, torch.float32)  # partial rotary
    return _layer(
        layer,
        lambda seed: (
            _positions((5,), 256, seed),
            randn(5, 4 * 32, seed=seed + 1),
            randn(5, 2 * 32, seed=seed + 2),
        ),
    )


def _mrope() -> LayerCase:
    from sglang.srt.layers.rotary_embedding import MRotaryEmbedding

    layer = MRotaryEmbedding(64, 64, 512, 10000, True, torch.float32, mrope_section=[8, 12, 12])
    return _layer(
        layer,
        lambda seed: (
            _positions((3, 5), 512, seed),
            randn(5, 4 * 64, seed=seed + 1),
            randn(5, 2 * 64, seed=seed + 2),
        ),
    )


def _clamp_position() -> LayerCase:
    from sglang.kernels.ops.attention.clamp_position import ClampPositionOp

    return _layer(ClampPositionOp(), lambda seed: (_positions((4,), 9, seed),))


def _publish_server_args() -> None:
    """SGLang's process-wide config, as an engine publishes it, so MoE layers can be built."""
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    publish(
        ServerArgs(model_path="dummy", device="cpu"),
        role="test",
        ranks=SpawnRanks(world_rank=0, dp_rank=None),
    )


def _topk() -> LayerCase:
    from sglang.srt.layers.moe.topk import TopK

    _publish_server_args()
    layer = TopK(2, layer_id=0, renormalize=True)

    def call(hidden: torch.Tensor, logits: torch.Tensor) -> Any:
        output = layer(hidden, logits)
        return output.topk_weights, output.topk_ids

    return LayerCase(
        layer, layer, call, lambda seed: (randn(5, 64, seed=seed), randn(5, 8, seed=seed + 1))
    )


def _fused_moe() -> LayerCase:
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    _publish_server_args()
    layer = FusedMoE(num_experts=8, hidden_size=64, intermediate_size=32, layer_id=0, top_k=2)
    with torch.no_grad():
        layer.w13_weight.copy_(randn(*layer.w13_weight.shape, seed=5) / 8)
        layer.w2_weight.copy_(randn(*layer.w2_weight.shape, seed=6) / 6)

    def call(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> Any:
        topk_output = StandardTopKOutput(weights, ids, weights)
        dispatched = layer.dispatcher.dispatch(hidden_states=x, topk_output=topk_output)
        return layer.run_moe_core(dispatched).hidden_states

    def inputs(seed: int) -> tuple[Any, ...]:
        weights = torch.rand(3, 2, generator=torch.Generator().manual_seed(seed))
        ids = torch.randperm(8, generator=torch.Generator().manual_seed(seed))[:6]
        return randn(3, 64, seed=seed), weights, ids.view(3, 2).to(torch.int32)

    return LayerCase(layer, layer.quant_method, call, inputs)


def _gate_function() -> LayerCase:
    from sglang.srt.models import qwen2_moe

    def call(hidden: torch.Tensor, gate: torch.Tensor, shared: torch.Tensor) -> Any:
        return qwen2_moe.fused_gate_sigmoid_mul(hidden, gate, shared)

    return LayerCase(
        None,
        qwen2_moe.fused_gate_sigmoid_mul,
        call,
        lambda seed: (
            randn(5, 48, seed=seed),
            randn(48, seed=seed + 1) / 7,
            randn(5, 48, seed=seed + 2),
        ),
    )


# Layer name -> (the standard op it routes to, its case).
LAYERS: dict[str, tuple[str, Callable[[], LayerCase]]] = {
    "SiluAndMul": ("silu_and_mul", lambda: _activation("SiluAndMul")),
    "GeluAndMul": ("gelu_and_mul", lambda: _activation("GeluAndMul", "tanh")),
    "NewGELU": ("gelu_new", lambda: _activation("NewGELU")),
    "QuickGELU": ("gelu_quick", lambda: _activation("QuickGELU")),
    "RMSNorm": ("rms_norm", lambda: _norm("RMSNorm", residual=False)),
    "RMSNorm+residual": ("rms_norm", lambda: _norm("RMSNorm", residual=True)),
    "GemmaRMSNorm+residual": ("gemma_rms_norm", lambda: _norm("GemmaRMSNorm", residual=True)),
    "LayerNorm": ("layer_norm", _layer_norm),
    "RotaryEmbedding": ("rotary_embedding", _rope),
    "MRotaryEmbedding": ("mrotary_embedding", _mrope),
    "ClampPositionOp": ("clamp_position", _clamp_position),
    "TopK": ("topk", _topk),
    "FusedMoE": ("fused_moe", _fused_moe),
    "fused_gate_sigmoid_mul": ("fused_gate_sigmoid_mul", _gate_function),
}


class GraphRecorder:
    """A dynamo backend keeping every graph's call targets, running it through aot_eager
    (functionalization of the custom ops' in-place writes included)."""

    def __init__(self) -> None:
        self.targets: list[str] = []
        # (custom op, its first argument: the key naming the implementation it runs)
        self.custom_op_calls: list[tuple[str, str]] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from torch._dynamo.backends.common import aot_autograd

        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            self.targets.append(str(node.target))
            if str(node.target).startswith("sglang_fl."):
                self.custom_op_calls.append((str(node.target), str(node.args[0])))
        return aot_autograd(fw_compiler=lambda graph, _: graph)(gm, example_inputs)


def tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in ``value`` (a tensor, or nested tuples and lists), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in tensors(item)]
    return []


def identical(want: list[torch.Tensor], got: list[torch.Tensor]) -> bool:
    return len(want) == len(got) and all(
        a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        for a, b in zip(want, got, strict=True)
    )


def impl_of(bound: Any) -> str | None:
    """The sglang-fl implementation a layer (or a routed kernel function) is bound to."""
    forward = getattr(bound, "_forward_method", bound)
    return getattr(forward, "sglang_fl_impl_id", None)


SEED = 1


@torch.no_grad()  # as SGLang runs its models
def run(name: str) -> dict[str, Any]:
    op_name, make = LAYERS[name]
    case = make()
    eager_inputs = case.inputs(SEED)
    eager = tensors(case.call(*eager_inputs))
    torch._dynamo.reset()
    recorder = GraphRecorder()
    result: dict[str, Any] = {"layer": name, "op": op_name, "impl_id": impl_of(case.bound)}
    compiled_inputs = case.inputs(SEED)
    try:
        compiled = torch.compile(case.call, fullgraph=True, backend=recorder)
        got = tensors(compiled(*compiled_inputs))
    except Exception as exc:  # reported to the test, which names it
        result["error_type"] = f"{type(exc).__module__}.{type(exc).__qualname__}"
        result["error"] = str(exc)[-3000:]  # the innermost frames: where dynamo stopped
        return result
    result["outputs_identical"] = identical(eager, got)
    result["inputs_identical"] = identical(tensors(eager_inputs), tensors(compiled_inputs))
    result["custom_op_calls"] = recorder.custom_op_calls
    return result


def main(names: list[str]) -> None:
    from sglang.srt.plugins import load_plugins

    load_plugins()
    for name in names or list(LAYERS):
        print(json.dumps(run(name)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
