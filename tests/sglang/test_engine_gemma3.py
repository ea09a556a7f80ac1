"""A tiny Gemma-3 text model generating on the CPU with every fused op routed through sglang-fl.

Gemma 3 uses the ops of the second set (``GeluAndMul``, ``Gemma3RMSNorm`` for the layer and
the q/k norms, ``ClampPositionOp`` in every decode step) beside plain rope. The dispatch report
of SGLang's scheduler must show each fused-op class it resolved routed to sglang-fl, none left
to SGLang for lack of an op, and the greedy tokens must equal those of the same SGLang run on
its own ``forward_native`` paths (``SGLANG_FORCE_FUSED_OP_BACKEND=torch``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_engine import run_engine, scheduler_layers
from tiny_models import build_tiny_model

from sglang_fl.dispatch_report import read_log

pytest.importorskip("sglang")

# The classes a Gemma-3 text model resolves, and the standard op each must be routed to.
GEMMA3_LAYERS = {
    "sglang.srt.layers.activation.GeluAndMul": "gelu_and_mul",
    "sglang.srt.layers.layernorm.Gemma3RMSNorm": "gemma_rms_norm",
    "sglang.kernels.ops.attention.clamp_position.ClampPositionOp": "clamp_position",
}


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "gemma3", "gemma3")


def test_gemma3_generates_with_every_fused_op_routed(gemma3: Path, tmp_path: Path) -> None:
    routed_log, torch_log = tmp_path / "routed.jsonl", tmp_path / "torch.jsonl"
    routed = run_engine(gemma3, routed_log)
    forced = run_engine(gemma3, torch_log, SGLANG_FORCE_FUSED_OP_BACKEND="torch")
    assert routed["output_ids"] == forced["output_ids"]
    assert all(len(ids) > 0 for ids in routed["output_ids"])

    layers = scheduler_layers(read_log(routed_log), routed["pid"])
    for name, op in GEMMA3_LAYERS.items():
        row = layers.get(name)
        assert row is not None, f"the scheduler never resolved {name}: {sorted(layers)}"
        assert (row["runner"], row["op"], row["impl_id"]) == ("sglang-fl", op, f"reference.{op}")
    left = {name: row["reason"] for name, row in layers.items() if row["runner"] != "sglang-fl"}
    assert left == {}, f"fused ops left to SGLang: {left}"

    forced_rows = read_log(torch_log)
    # The switch forces fused ops; the attention backend is another choice (still sglang_fl).
    assert not [
        r
        for r in forced_rows
        if r["event"] == "layer" and r["runner"] == "sglang-fl" and not r.get("attention_backend")
    ]
