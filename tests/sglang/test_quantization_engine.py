"""Quantized checkpoints served by SGLang on the CPU through sglang-fl: transformers' tokens.

Four engines (``configurations.py``), one per checkpoint format, each a tiny model made
offline (``quant_models.py``):

- ``quant-dense``: a Llama whose compressed-tensors config groups give its layers every linear
  scheme (FP8 128x128 block attention, W8A8 int8 and FP8-per-channel MLP in the first layer,
  W4A16 in the second), with the ``quantprobe`` vendor installed (``quant_vendor.py``): its
  prepared int8 kernel serves decode steps and declines prefills, its W4A16 kernel declines
  the wide layer at preparation;
- ``quant-moe``: a Qwen3-MoE, W8A8 int8 attention, FP8-block experts in layer 0 and W8A8 int8
  experts in layer 1 (compressed-tensors);
- ``quant-fp8``: the Qwen3-MoE in DeepSeek's ``fp8`` block format (linear layers and experts);
- ``quant-awq``: the Llama in AutoAWQ's 4-bit format.

Each answers short prompts, a prompt over several 32-token prefill chunks, and a prompt sharing
that one's prefix (a radix-cache hit), with the oracle's greedy tokens (``quant_oracle.py``:
transformers on the same checkpoint, with the format's own arithmetic where transformers has
none on a CPU); the scheduler's dispatch log shows every quantized layer on sglang-fl's ops and
no layer left to SGLang.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from configurations import QUANT_AWQ, QUANT_CHUNK, QUANT_DENSE, QUANT_FP8, QUANT_MOE
from engines import Engine, model_path, register_model, register_site
from quant_models import build_quant_model
from quant_oracle import quant_greedy
from quant_vendor import (
    IMPL_ID,
    PREPARE_REASON,
    TILE_REASON,
    TILE_TOKENS,
    quant_vendor_site,
)
from sglang_processes import scheduler_layers

pytest.importorskip("sglang")

MODELS = {
    "quant-dense": ("mixed_dense", "llama"),
    "quant-moe": ("mixed_moe", "qwen3_moe"),
    "quant-fp8": ("fp8_block_native", "qwen3_moe"),
    "quant-awq": ("awq", "llama"),
}


def _builder(scheme: str, arch: str) -> Callable[[Path], Path]:
    return lambda cache: build_quant_model(cache / f"quant-{scheme}-{arch}", scheme, arch)


for _name, (_scheme, _arch) in MODELS.items():
    register_model(_name, _builder(_scheme, _arch))
register_site("quantprobe", quant_vendor_site)

SPECS = {
    "quant-dense": QUANT_DENSE,
    "quant-moe": QUANT_MOE,
    "quant-fp8": QUANT_FP8,
    "quant-awq": QUANT_AWQ,
}
ENGINES = pytest.mark.parametrize("engine", list(SPECS.values()), indirect=True, ids=list(SPECS))

SHORT = ["def main():", "class Config:"]
LONG = (
    "import os\nimport sys\n\n\ndef read_config(path):\n    with open(path) as handle:\n"
    "        return handle.read().splitlines()\n\n\nclass Loader:\n    def __init__(self, root):\n"
    "        self.root = root\n        self.cache = {}\n\n    def load(self, name):\n"
)
SHARED = LONG + "        if name in self.cache:\n"
MAX_NEW_TOKENS = 8
# The quantized ops each model's layers run on.
OPS = {
    "quant-dense": {"w8a8_block_fp8_linear", "w8a8_int8_linear", "w8a8_fp8_linear", "wna16_linear"},
    "quant-moe": {"w8a8_int8_linear", "fused_moe_w8a8_fp8", "fused_moe_w8a8_int8"},
    "quant-fp8": {"w8a8_block_fp8_linear", "fused_moe_w8a8_fp8"},
    "quant-awq": {"wna16_linear"},
}

_ORACLE: dict[tuple[str, tuple[str, ...]], list[list[int]]] = {}


def oracle(model: str, prompts: list[str]) -> list[list[int]]:
    key = (model, tuple(prompts))
    if key not in _ORACLE:
        _ORACLE[key] = quant_greedy(model_path(model), prompts, MAX_NEW_TOKENS, stop_at_eos=True)
    return _ORACLE[key]


def ids(outputs: list[dict[str, Any]]) -> list[list[int]]:
    return [out["output_ids"] for out in outputs]


@ENGINES
def test_short_prompts_give_the_formats_tokens(engine: Engine) -> None:
    model = engine.spec.model
    assert ids(engine.generate(SHORT, max_new_tokens=MAX_NEW_TOKENS)) == oracle(model, SHORT)


@ENGINES
def test_a_prompt_over_several_chunks_then_a_radix_hit(engine: Engine) -> None:
    model = engine.spec.model
    assert len(engine.tokenize(LONG)) > 3 * QUANT_CHUNK
    first = engine.generate([LONG], max_new_tokens=MAX_NEW_TOKENS)
    second = engine.generate([SHARED], max_new_tokens=MAX_NEW_TOKENS)
    assert ids(first) == oracle(model, [LONG])
    assert ids(second) == oracle(model, [SHARED])
    assert second[0]["meta_info"]["cached_tokens"] >= QUANT_CHUNK, second[0]["meta_info"]


def quantized_layers(engine: Engine) -> dict[str, dict[str, Any]]:
    layers = scheduler_layers(engine.records(), engine.pid)
    return {name: row for name, row in layers.items() if row.get("op") in OPS[engine.spec.model]}


@ENGINES
def test_every_quantized_layer_runs_on_sglang_fl(engine: Engine) -> None:
    """No scheduler layer is left to SGLang (its CUDA/Triton kernels cannot run here), and each
    quantized op of the checkpoint's formats is served, with the scheme it serves reported."""
    rows = scheduler_layers(engine.records(), engine.pid)
    left = {name: row.get("reason") for name, row in rows.items() if row["runner"] != "sglang-fl"}
    assert not left, f"left to SGLang: {left}"
    quantized = quantized_layers(engine)
    assert {row["op"] for row in quantized.values()} == OPS[engine.spec.model]
    for name, row in quantized.items():
        assert re.fullmatch(r"sglang\.srt\.layers\..+\[\w+\]", name), name
        assert row["scheme"], row
        assert row["impl_id"] == expected_impl(engine, name, row["op"]), row


WIDE_W4A16 = "sglang.srt.layers.linear.MergedColumnParallelLinear[wna16_linear]"


def expected_impl(engine: Engine, name: str, op: str) -> str:
    """Who serves a layer: the probe vendor where it is installed and took the layer (its
    W4A16 kernel declines the wide fused gate/up projection at preparation), else the
    reference."""
    if "quantprobe" in engine.spec.sites and op in ("w8a8_int8_linear", "wna16_linear"):
        return f"reference.{op}" if name == WIDE_W4A16 else IMPL_ID
    return f"reference.{op}"


@pytest.mark.engine(QUANT_DENSE)
def test_a_vendor_kernel_serves_with_its_own_layout_and_declines_are_reported(
    engine: Engine,
) -> None:
    """The probe's prepared int8 kernel serves decode steps; prefills it declines reach the
    reference with the checkpoint's layout (the tokens above are the format's); its W4A16
    kernel declined the wide layer at preparation. Both kinds of decline are reported."""
    engine.generate(SHORT, max_new_tokens=MAX_NEW_TOKENS)
    served = (engine.workdir / "quantprobe.log").read_text().split()
    sizes = [int(n) for n in served[1::2]]
    assert sizes
    assert max(sizes) <= TILE_TOKENS, sizes
    assert 1 in sizes  # decode
    fallbacks = [r for r in engine.records() if r["event"] == "fallback"]
    declined = {(r["op"], r["impl_id"], r.get("stage"), r["reason"]) for r in fallbacks}
    assert ("w8a8_int8_linear", IMPL_ID, None, TILE_REASON) in declined, fallbacks
    assert ("wna16_linear", IMPL_ID, "prepare", PREPARE_REASON) in declined, fallbacks
    served_by = {r["next_impl_id"] for r in fallbacks}
    assert served_by == {"reference.w8a8_int8_linear", "reference.wna16_linear"}
