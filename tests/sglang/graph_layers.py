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
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

# A case: (the layer, the call on given inputs, inputs factory); the call returns the outputs.
Case = tuple[Any, Callable[..., Any], Callable[[], tuple[Any, ...]]]


def randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float32).to(dtype)


def _call(layer: Any) -> Callable[..., Any]:
    return lambda *inputs: layer(*inputs)


def _activation(cls_name: str, *args: Any) -> Case:
    from sglang.srt.layers import activation

    layer = getattr(activation, cls_name)(*args)
    return layer, _call(layer), lambda: (randn(5, 64, seed=1),)


def _norm(cls_name: str) -> Case:
    from sglang.srt.layers import layernorm

    layer = getattr(layernorm, cls_name)(64, eps=1e-6)
    with torch.no_grad():
        layer.weight.copy_(0.1 * randn(64, seed=7))
    return layer, _call(layer), lambda: (randn(5, 64, seed=1), randn(5, 64, seed=2))


def _plain_norm() -> Case:
    layer, call, _ = _norm("RMSNorm")
    return layer, call, lambda: (randn(5, 64, seed=1),)


def _layer_norm() -> Case:
    from sglang.srt.layers.layernorm import LayerNorm

    layer = LayerNorm(64, eps=1e-5, elementwise_affine=True, bias=True, dtype=torch.float32)
    return layer, _call(layer), lambda: (randn(5, 64, seed=1),)


def _rope() -> Case:
    from sglang.srt.layers.rotary_embedding import RotaryEmbedding

    layer = RotaryEmbedding(32, 16, 256, 10000, True, torch.float32)  # partial rotary
    return (
        layer,
        _call(layer),
        lambda: (torch.tensor([0, 3, 9, 200, 7]), randn(5, 4 * 32, seed=3), randn(5, 2 * 32, seed=4)),
    )


def _mrope() -> Case:
    from sglang.srt.layers.rotary_embedding import MRotaryEmbedding

    layer = MRotaryEmbedding(
        64, 64, 512, 10000, True, torch.float32, mrope_section=[8, 12, 12]
    )
    positions = torch.randint(0, 500, (3, 5), generator=torch.Generator().manual_seed(5))
    return (
        layer,
        _call(layer),
        lambda: (positions.clone(), randn(5, 4 * 64, seed=3), randn(5, 2 * 64, seed=4)),
    )


def _clamp_position() -> Case:
    from sglang.kernels.ops.attention.clamp_position import ClampPositionOp

    layer = ClampPositionOp()
    return layer, _call(layer), lambda: (torch.tensor([0, 1, 5, 17], dtype=torch.int64),)


def _publish_server_args() -> None:
    """SGLang's process-wide config, as an engine publishes it, so MoE layers can be built."""
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    publish(
        ServerArgs(model_path="dummy", device="cpu"),
        role="test",
        ranks=SpawnRanks(world_rank=0, dp_rank=None),
    )


def _topk() -> Case:
    from sglang.srt.layers.moe.topk import TopK

    _publish_server_args()
    layer = TopK(2, layer_id=0, renormalize=True)

    def call(hidden: torch.Tensor, logits: torch.Tensor) -> Any:
        output = layer(hidden, logits)
        return output.topk_weights, output.topk_ids

    return layer, call, lambda: (randn(5, 64, seed=1), randn(5, 8, seed=2))


def _fused_moe() -> Case:
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    _publish_server_args()
    layer = FusedMoE(
        num_experts=8, hidden_size=64, intermediate_size=32, layer_id=0, top_k=2
    )
    with torch.no_grad():
        layer.w13_weight.copy_(randn(*layer.w13_weight.shape, seed=5) / 8)
        layer.w2_weight.copy_(randn(*layer.w2_weight.shape, seed=6) / 6)
    weights = torch.tensor([[0.75, 0.25], [0.5, 0.5], [1.0, 0.0]])
    ids = torch.tensor([[0, 3], [7, 3], [1, 2]], dtype=torch.int32)

    def call(x: torch.Tensor) -> Any:
        topk_output = StandardTopKOutput(weights, ids, torch.zeros(3, 8))
        dispatched = layer.dispatcher.dispatch(hidden_states=x, topk_output=topk_output)
        return layer.run_moe_core(dispatched).hidden_states

    return layer.quant_method, call, lambda: (randn(3, 64, seed=1),)


def _gate_function() -> Case:
    from sglang.srt.models import qwen2_moe

    def call(hidden: torch.Tensor, gate: torch.Tensor, shared: torch.Tensor) -> Any:
        return qwen2_moe.fused_gate_sigmoid_mul(hidden, gate, shared)

    return (
        qwen2_moe.fused_gate_sigmoid_mul,
        call,
        lambda: (randn(5, 48, seed=1), randn(48, seed=2) / 7, randn(5, 48, seed=3)),
    )


LAYERS: dict[str, tuple[str, Callable[[], Case]]] = {
    "SiluAndMul": ("silu_and_mul", lambda: _activation("SiluAndMul")),
    "GeluAndMul": ("gelu_and_mul", lambda: _activation("GeluAndMul", "tanh")),
    "NewGELU": ("gelu_new", lambda: _activation("NewGELU")),
    "QuickGELU": ("gelu_quick", lambda: _activation("QuickGELU")),
    "RMSNorm": ("rms_norm", _plain_norm),
    "RMSNorm+residual": ("rms_norm", lambda: _norm("RMSNorm")),
    "GemmaRMSNorm+residual": ("gemma_rms_norm", lambda: _norm("GemmaRMSNorm")),
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


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


def _identical(want: list[torch.Tensor], got: list[torch.Tensor]) -> bool:
    return len(want) == len(got) and all(
        a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        for a, b in zip(want, got, strict=True)
    )


def _impl_of(bound: Any) -> str | None:
    forward = getattr(bound, "_forward_method", bound)
    return getattr(forward, "sglang_fl_impl_id", None)


@torch.no_grad()  # as SGLang runs its models
def run(name: str) -> dict[str, Any]:
    op_name, make = LAYERS[name]
    layer, call, make_inputs = make()
    eager_inputs = make_inputs()
    eager = _tensors(call(*eager_inputs))
    torch._dynamo.reset()
    recorder = GraphRecorder()
    result: dict[str, Any] = {"layer": name, "op": op_name, "impl_id": _impl_of(layer)}
    compiled_inputs = make_inputs()
    try:
        compiled = torch.compile(call, fullgraph=True, backend=recorder)
        got = _tensors(compiled(*compiled_inputs))
    except Exception as exc:  # reported to the test, which names it
        result["error_type"] = f"{type(exc).__module__}.{type(exc).__qualname__}"
        result["error"] = str(exc)[-3000:]  # the innermost frames: where dynamo stopped
        return result
    result["outputs_identical"] = _identical(eager, got)
    result["inputs_identical"] = _identical(_tensors(eager_inputs), _tensors(compiled_inputs))
    result["custom_op_calls"] = recorder.custom_op_calls
    return result


def main(names: list[str]) -> None:
    from sglang.srt.plugins import load_plugins

    load_plugins()
    for name in names or list(LAYERS):
        print(json.dumps(run(name)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
