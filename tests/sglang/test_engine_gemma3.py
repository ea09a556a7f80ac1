"""A tiny Gemma-3 text model generating on the CPU with every fused op routed through sglang-fl.

Gemma 3 uses the ops of the second set (``GeluAndMul``, ``Gemma3RMSNorm`` for the layer and
the q/k norms, ``ClampPositionOp`` in every decode step) beside plain rope. On the shared
Gemma-3 engine (:data:`~configurations.GEMMA3`, an 8-token sliding window on one layer), the
dispatch report of SGLang's scheduler must show each fused-op class it resolved routed to
sglang-fl, none left to SGLang for lack of an op. Its greedy tokens equal those of the same
model on SGLang's own paths (``forward_native``, ``torch_native``): ``test_attention_engine.py``.
"""

from __future__ import annotations

import pytest
from configurations import GEMMA3
from engines import Engine
from sglang_processes import scheduler_layers

pytest.importorskip("sglang")

# The classes a Gemma-3 text model resolves, and the standard op each must be routed to.
GEMMA3_LAYERS = {
    "sglang.srt.layers.activation.GeluAndMul": "gelu_and_mul",
    "sglang.srt.layers.layernorm.Gemma3RMSNorm": "gemma_rms_norm",
    "sglang.kernels.ops.attention.clamp_position.ClampPositionOp": "clamp_position",
}


@pytest.mark.engine(GEMMA3)
def test_gemma3_generates_with_every_fused_op_routed(engine: Engine) -> None:
    outputs = engine.generate(["def main():", "class Config:"], max_new_tokens=8)
    assert all(len(out["output_ids"]) > 0 for out in outputs)

    layers = scheduler_layers(engine.records(), engine.pid)
    for name, op in GEMMA3_LAYERS.items():
        row = layers.get(name)
        assert row is not None, f"the scheduler never resolved {name}: {sorted(layers)}"
        assert (row["runner"], row["op"], row["impl_id"]) == ("sglang-fl", op, f"reference.{op}")
    left = {name: row["reason"] for name, row in layers.items() if row["runner"] != "sglang-fl"}
    assert left == {}, f"fused ops left to SGLang: {left}"
