"""SGLang's quantized layers built by sglang-fl's configs, in this process, against the format.

Each test builds SGLang's own linear or MoE layer the way a model does (``quant_config`` and
``prefix``; the config is the class sglang-fl's platform gives SGLang for the checkpoint's
``quant_method``), loads a tiny checkpoint's tensors through the layer's own weight loaders, runs
``process_weights_after_loading`` and a forward, and compares with the format's own arithmetic:
compressed-tensors decompressing each projection and quantize-dequantizing its input
(``quant_oracle.compressed_tensors_qdq``), the ``fp8`` and AWQ layouts by their definitions.
Float32: the only differences left are the order of float sums.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("sglang")

from installed_dists import ENTRY_POINT_GROUP, install_dist
from quant_models import AWQ_GROUP, BLOCK, HIDDEN_SIZE, build_quant_model
from quant_oracle import compressed_tensors_qdq, deepseek_act_qdq
from sglang_processes import persistent_cache

from sglang_fl import StrictModeError
from sglang_fl.config import Settings
from sglang_fl.dispatch_report import DispatchReport, ReportEvent, read_log
from sglang_fl.integrations.sglang.quantization import SERVED, quantization_config
from sglang_fl.integrations.sglang.quantization.methods import (
    BOUND_ATTR,
    QuantizationNotServed,
    QuantRouting,
)
from sglang_fl.ops import get_contract
from sglang_fl.ops.quantization.numerics import dequantize_block
from sglang_fl.runtime import Runtime
from sglang_fl.verify import Verifier

HEAD_DIM, HEADS, KV_HEADS = 128, 4, 2
INTERMEDIATE = 2 * HIDDEN_SIZE  # the dense tiny model's MLP
MOE_INTERMEDIATE = HIDDEN_SIZE
EXPERTS = 8
PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
EXACT = {"rtol": 2e-5, "atol": 2e-5}
# Two chained projections: the oracle sums gate and up apart, the op as one projection, so an
# intermediate activation sitting at a rounding boundary of its quantization (an fp8 step is
# 6-12% of the value) may land one step apart; a few such elements move an output by ~1e-4.
CHAINED = {"rtol": 2e-3, "atol": 3e-4}


@pytest.fixture(scope="module", autouse=True)
def _published(router: Any) -> Iterator[None]:
    """SGLang's process-wide config, as an engine publishes it, so its layers can be built."""
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    reset_context()
    publish(
        ServerArgs(model_path="dummy", device="cpu"),
        role="test",
        ranks=SpawnRanks(world_rank=0, dp_rank=None),
    )
    try:
        yield
    finally:
        reset_context()


def checkpoint(scheme: str, arch: str = "llama") -> Path:
    return build_quant_model(persistent_cache("models") / f"quant-{scheme}-{arch}", scheme, arch)


def tensors_of(model: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(model / "model.safetensors")


def config_of(model: Path) -> Any:
    """The config SGLang gets from sglang-fl's platform, built as SGLang builds it."""
    quantization = dict(json.loads((model / "config.json").read_text())["quantization_config"])
    quantization["packed_modules_mapping"] = PACKED
    cls = quantization_config(quantization["quant_method"])
    assert cls is not None
    return cls.from_config(quantization)


def linear(kind: str, prefix: str, config: Any, **sizes: int) -> Any:
    from sglang.srt.layers import linear as sglang_linear

    common = {"bias": False, "quant_config": config, "prefix": prefix}
    if kind == "qkv":
        return sglang_linear.QKVParallelLinear(
            HIDDEN_SIZE, HEAD_DIM, HEADS, KV_HEADS, params_dtype=torch.float32, **common
        )
    if kind == "gate_up":
        width = sizes.get("intermediate", INTERMEDIATE)
        return sglang_linear.MergedColumnParallelLinear(
            HIDDEN_SIZE, [width, width], params_dtype=torch.float32, **common
        )
    width = sizes.get("intermediate", INTERMEDIATE) if kind == "down" else HIDDEN_SIZE
    return sglang_linear.RowParallelLinear(width, HIDDEN_SIZE, params_dtype=torch.float32, **common)


SHARDS = {
    "qkv": [("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v")],
    "gate_up": [("gate_proj", 0), ("up_proj", 1)],
    "down": [("down_proj", None)],
    "o": [("o_proj", None)],
}


def load_linear(layer: Any, kind: str, prefix: str, tensors: dict[str, torch.Tensor]) -> None:
    """Each checkpoint tensor through its parameter's own weight loader (as models load)."""
    parent = prefix.rsplit(".", 1)[0]
    for projection, shard in SHARDS[kind]:
        stem = f"{parent}.{projection}."
        for key, value in tensors.items():
            if not key.startswith(stem):
                continue
            param = getattr(layer, key[len(stem) :])
            if shard is None:
                param.weight_loader(param, value)
            else:
                param.weight_loader(param, value, shard)
    layer.quant_method.process_weights_after_loading(layer)


def ct_projection(
    tensors: dict[str, torch.Tensor], config: Any, module: str, x: torch.Tensor
) -> torch.Tensor:
    """compressed-tensors' own computation of one projection: decompressed weight, input
    quantize-dequantized per its scheme (what transformers runs)."""
    from compressed_tensors.compressors.base import decompress_module

    scheme_dict = config.get_scheme_dict(torch.nn.Linear(1, 1), module)
    state = {k.rsplit(".", 1)[1]: v for k, v in tensors.items() if k.rsplit(".", 1)[0] == module}
    if scheme_dict is None:
        return F.linear(x, state["weight"])
    holder = torch.nn.Linear(1, 1, bias=False)
    del holder.weight
    for name, value in state.items():
        holder.register_parameter(name, torch.nn.Parameter(value.clone(), requires_grad=False))
    holder.quantization_scheme = _scheme(config, module)
    decompress_module(holder)
    inputs = scheme_dict["input_activations"]
    x = compressed_tensors_qdq(inputs)(x) if inputs is not None else x
    return F.linear(x, holder.weight.float())


def _scheme(config: Any, module: str) -> Any:
    """The module's group as compressed-tensors matches it: a name match, else ``Linear``."""
    from compressed_tensors.quantization import QuantizationConfig
    from compressed_tensors.utils import match_targets

    groups = QuantizationConfig.model_validate(config.config).config_groups.values()
    linear = torch.nn.Linear(1, 1)
    matches = [(match_targets(module, linear, s.targets), s) for s in groups]
    ranked = sorted((m for m in matches if m[0]), key=lambda m: "re:" not in m[0][0])
    assert ranked, f"no group targets {module}"
    return ranked[0][1]


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# The mixed dense checkpoint: every compressed-tensors linear scheme, one layer each.
DENSE = [
    ("qkv", "model.layers.0.self_attn.qkv_proj", "w8a8_block_fp8_linear"),
    ("o", "model.layers.0.self_attn.o_proj", "w8a8_block_fp8_linear"),
    ("gate_up", "model.layers.0.mlp.gate_up_proj", "w8a8_int8_linear"),
    ("down", "model.layers.0.mlp.down_proj", "w8a8_fp8_linear"),
    ("gate_up", "model.layers.1.mlp.gate_up_proj", "wna16_linear"),
    ("down", "model.layers.1.mlp.down_proj", "wna16_linear"),
]


@pytest.mark.parametrize("tokens", [1, 19])
@pytest.mark.parametrize(
    ("kind", "prefix", "op"), DENSE, ids=[d[1].split("layers.")[1] for d in DENSE]
)
def test_compressed_tensors_linear_is_the_formats_arithmetic(
    kind: str, prefix: str, op: str, tokens: int, dispatch_log: Path
) -> None:
    model = checkpoint("mixed_dense")
    tensors, config = tensors_of(model), config_of(model)
    layer = linear(kind, prefix, config)
    load_linear(layer, kind, prefix, tensors)
    assert getattr(layer, BOUND_ATTR).op == op
    x = randn(tokens, layer.input_size, seed=tokens)
    x_before = x.clone()
    got = layer.quant_method.apply(layer, x)  # what the layer's forward calls at TP=1
    parent = prefix.rsplit(".", 1)[0]
    want = torch.cat(
        [ct_projection(tensors, config, f"{parent}.{p}", x) for p, _ in SHARDS[kind]], dim=-1
    )
    assert torch.equal(x, x_before)
    torch.testing.assert_close(got, want, **EXACT)
    # a 3-D input (batch, tokens, hidden) is served row-wise
    got_3d = layer.quant_method.apply(layer, x.reshape(1, tokens, -1))
    torch.testing.assert_close(got_3d.reshape(tokens, -1), got, rtol=0, atol=0)
    rows = [r for r in read_log(dispatch_log) if r["event"] == "layer" and r["op"] == op]
    assert rows
    assert all(r["runner"] == "sglang-fl" for r in rows)
    assert {r["impl_id"] for r in rows} == {f"reference.{op}"}
    assert all(r["sglang_forward"] == "CompressedTensorsLinearMethod" for r in rows)


def load_experts(layer: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> None:
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    mapping = FusedMoE.make_expert_params_mapping("gate_proj", "down_proj", "up_proj", EXPERTS)
    params = dict(layer.named_parameters())
    for key, value in tensors.items():
        if not key.startswith(prefix + "."):
            continue
        name = "experts." + key[len(prefix) + 1 :]
        for param_name, weight_name, expert_id, shard_id in mapping:
            if weight_name in name:
                local = name.replace(weight_name, param_name).removeprefix("experts.")
                param = params[local]
                param.weight_loader(param, value, local, shard_id=shard_id, expert_id=expert_id)
                break
    layer.quant_method.process_weights_after_loading(layer)


def experts_layer(config: Any, prefix: str) -> Any:
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    return FusedMoE(
        num_experts=EXPERTS,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=MOE_INTERMEDIATE,
        layer_id=int(prefix.split(".")[2]),
        top_k=2,
        params_dtype=torch.float32,
        quant_config=config,
        prefix=prefix,
    )


def moe_oracle(
    project: Any, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """Each token's experts one by one: ``project(expert, name, rows)`` per projection."""
    out = torch.zeros_like(x)
    for token in range(x.shape[0]):
        for slot in range(ids.shape[1]):
            e = int(ids[token, slot])
            row = x[token : token + 1]
            hidden = F.silu(project(e, "gate_proj", row)) * project(e, "up_proj", row)
            out[token] += weights[token, slot] * project(e, "down_proj", hidden)[0]
    return out


def run_experts(layer: Any, x: torch.Tensor) -> tuple[Any, torch.Tensor, torch.Tensor]:
    from sglang.srt.layers.moe.topk import TopK

    topk_output = TopK(2, layer_id=layer.layer_id, renormalize=True)(
        x, randn(x.shape[0], EXPERTS, seed=3)
    )
    dispatched = layer.dispatcher.dispatch(hidden_states=x, topk_output=topk_output)
    out = layer.run_moe_core(dispatched).hidden_states
    return out, topk_output.topk_weights, topk_output.topk_ids


@pytest.mark.parametrize(
    ("layer_index", "op"),
    [(0, "fused_moe_w8a8_fp8"), (1, "fused_moe_w8a8_int8")],
    ids=["fp8-block", "w8a8-int8"],
)
def test_compressed_tensors_experts_are_the_formats_arithmetic(layer_index: int, op: str) -> None:
    model = checkpoint("mixed_moe", "qwen3_moe")
    tensors, config = tensors_of(model), config_of(model)
    prefix = f"model.layers.{layer_index}.mlp.experts"
    layer = experts_layer(config, prefix)
    load_experts(layer, prefix, tensors)
    assert getattr(layer, BOUND_ATTR).op == op
    x = randn(13, HIDDEN_SIZE, seed=5)
    got, weights, ids = run_experts(layer, x)

    def project(e: int, name: str, rows: torch.Tensor) -> torch.Tensor:
        return ct_projection(tensors, config, f"{prefix}.{e}.{name}", rows)

    torch.testing.assert_close(got, moe_oracle(project, x, weights, ids), **CHAINED)


def test_fp8_block_checkpoint_linear_and_experts() -> None:
    """``quant_method: fp8`` with 128x128 blocks: DeepSeek's activation rule (``ABSMAX``)."""
    model = checkpoint("fp8_block_native", "qwen3_moe")
    tensors, config = tensors_of(model), config_of(model)

    def dense(module: str) -> torch.Tensor:
        return dequantize_block(tensors[f"{module}.weight"], tensors[f"{module}.weight_scale_inv"],
                                (BLOCK, BLOCK))  # fmt: skip

    prefix = "model.layers.0.self_attn.qkv_proj"
    layer = linear("qkv", prefix, config)
    load_linear(layer, "qkv", prefix, tensors)
    x = randn(9, HIDDEN_SIZE, seed=7)
    got = layer.quant_method.apply(layer, x)
    parent = "model.layers.0.self_attn"
    want = torch.cat(
        [
            F.linear(deepseek_act_qdq(x), dense(f"{parent}.{p}"))
            for p in ("q_proj", "k_proj", "v_proj")
        ],
        -1,
    )
    torch.testing.assert_close(got, want, **EXACT)

    experts = "model.layers.1.mlp.experts"
    moe = experts_layer(config, experts)
    load_experts(moe, experts, tensors)
    out, weights, ids = run_experts(moe, x)

    def project(e: int, name: str, rows: torch.Tensor) -> torch.Tensor:
        return F.linear(deepseek_act_qdq(rows), dense(f"{experts}.{e}.{name}"))

    torch.testing.assert_close(out, moe_oracle(project, x, weights, ids), **CHAINED)


def test_awq_layer_is_the_dequantized_checkpoint() -> None:
    from quant_oracle import _awq_unpack

    model = checkpoint("awq")
    tensors, config = tensors_of(model), config_of(model)
    prefix = "model.layers.0.mlp.gate_up_proj"
    layer = linear("gate_up", prefix, config)
    load_linear(layer, "gate_up", prefix, tensors)
    assert layer.qweight.numel() == 0, "the AWQ layout is released once repacked"
    x = randn(6, HIDDEN_SIZE, seed=8)
    got = layer.quant_method.apply(layer, x)

    def dense(module: str) -> torch.Tensor:
        q = _awq_unpack(tensors[f"{module}.qweight"]).float()
        zero = _awq_unpack(tensors[f"{module}.qzeros"]).float().repeat_interleave(AWQ_GROUP, 0)
        scale = tensors[f"{module}.scales"].float().repeat_interleave(AWQ_GROUP, 0)
        return ((q - zero) * scale).t()

    want = torch.cat(
        [F.linear(x, dense(f"model.layers.0.mlp.{p}")) for p in ("gate_proj", "up_proj")], -1
    )
    torch.testing.assert_close(got, want, **EXACT)
    layer.quant_method.restore_weights_before_loading(layer)
    assert layer.qweight.shape == (HIDDEN_SIZE, 2 * INTERMEDIATE // 8)


def test_w8a8_int8_checkpoint_format() -> None:
    """``quant_method: w8a8_int8`` (SGLang's own, channel weights): the kernels' ``ABSMAX``."""
    from sglang.srt.layers.quantization.w8a8_int8 import W8A8Int8LinearMethod

    cls = quantization_config("w8a8_int8")
    config = cls.from_config({"quant_method": "w8a8_int8", "packed_modules_mapping": PACKED,
                              "model.layers.0.mlp.down_proj.weight": "W8A8_DYNAMIC"})  # fmt: skip
    layer = linear("down", "model.layers.0.mlp.down_proj", config)
    assert isinstance(layer.quant_method.delegate, W8A8Int8LinearMethod)
    weight = torch.randint(-127, 128, (HIDDEN_SIZE, INTERMEDIATE), dtype=torch.int8)
    scale = torch.rand(HIDDEN_SIZE, 1) / 1000
    layer.weight.weight_loader(layer.weight, weight)
    layer.weight_scale.weight_loader(layer.weight_scale, scale)
    layer.quant_method.process_weights_after_loading(layer)
    x = randn(4, INTERMEDIATE, seed=9)
    got = layer.quant_method.apply(layer, x)
    x_scale = x.abs().amax(-1, keepdim=True) / 127
    want = F.linear((x / x_scale).round() * x_scale, weight.float() * scale)
    torch.testing.assert_close(got, want, **EXACT)


def test_a_scheme_no_op_serves_is_a_clear_error_at_construction() -> None:
    model = checkpoint("mixed_dense")
    quantization = dict(json.loads((model / "config.json").read_text())["quantization_config"])
    group = quantization["config_groups"]["group_2"]  # W8A8 on layer 0's gate/up
    group["input_activations"]["dynamic"] = False  # static per-tensor activation scales
    group["input_activations"]["strategy"] = "tensor"
    quantization["packed_modules_mapping"] = PACKED
    config = quantization_config("compressed-tensors").from_config(quantization)
    with pytest.raises(QuantizationNotServed) as info:
        linear("gate_up", "model.layers.0.mlp.gate_up_proj", config)
    message = str(info.value)
    assert message.startswith("model.layers.0.mlp.gate_up_proj: compressed-tensors W8A8 int8")
    assert "static or asymmetric activation scales" in message
    assert "sglang-fl serves compressed-tensors W8A8 int8" in message


def test_the_platform_answers_for_the_served_names_only() -> None:
    from sglang.srt.platforms import current_platform

    for name in SERVED:
        config = current_platform.get_quantization_config(name)
        assert config is quantization_config(name)
        assert config is not None
        assert torch.float32 in config.get_supported_act_dtypes()
    assert current_platform.get_quantization_config("gguf") is None


# -- a vendor's prepared kernels under verify mode, strict mode and the report -----------------

# A throwaway vendor (installed as a distribution, discovered through its entry point) whose int8
# kernel reads the weight it prepared (transposed) with a scale 1% off, and declines calls of
# more than 16 tokens; its W4A16 kernel declines every layer when the weights are prepared.
ACME = """
from sglang_fl import PreparedKernel, Unsupported, hookimpl
from sglang_fl.ops import get_contract
from sglang_fl.types import Backend

_INT8 = get_contract("w8a8_int8_linear").reference


class Acme(Backend):
    name = "acmequant"

    def is_available(self):
        return True


def prepare_int8(obj, weight, weight_scale):
    return weight.t(), weight_scale * 1.01


def int8_linear(obj, x, weight_t, scale, bias=None):
    if x.shape[0] > 16:
        raise Unsupported("acmequant serves at most 16 tokens per call")
    return _INT8(obj, x, weight_t.t(), scale, bias)


def prepare_wna16(obj, weight, weight_scale, weight_zero_point):
    raise Unsupported("acmequant has no 4-bit kernel")


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register_many(
        Acme().implementations(
            {
                "w8a8_int8_linear": PreparedKernel(int8_linear, prepare_int8),
                "wna16_linear": PreparedKernel(
                    get_contract("wna16_linear").reference, prepare_wna16
                ),
            }
        )
    )
"""
ACME_ID = "vendor.acmequant"
INT8_PREFIX = "model.layers.0.mlp.gate_up_proj"  # W8A8 int8 in the mixed checkpoint
W4_PREFIX = "model.layers.1.mlp.gate_up_proj"  # W4A16


@pytest.fixture
def acme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = install_dist(
        tmp_path / "site",
        "sglang-fl-acmequant",
        "0.0.1",
        files={"sglang_fl_acmequant/__init__.py": ACME},
        entry_points={ENTRY_POINT_GROUP: {"acmequant": "sglang_fl_acmequant"}},
        dedent=False,
    )
    monkeypatch.syspath_prepend(str(site))


def acme_routing(log: Path, **env: str) -> QuantRouting:
    """A process's quantized-layer routing over a runtime that loads the installed plugins."""
    settings = Settings.from_environment({f"SGLANG_FL_{k.upper()}": v for k, v in env.items()})
    report = DispatchReport(log)
    verifier = Verifier(
        settings.verify, settings.verify_ops, lambda r: report.emit(ReportEvent.VERIFY, **r)
    )
    return QuantRouting(Runtime(settings), report, verifier)


def loaded(kind: str, prefix: str) -> Any:
    model = checkpoint("mixed_dense")
    layer = linear(kind, prefix, config_of(model))
    load_linear(layer, kind, prefix, tensors_of(model))
    return layer


@pytest.mark.usefixtures("acme")
def test_verify_mode_checks_the_kernel_on_its_layout_and_declines_are_reported(
    tmp_path: Path,
) -> None:
    log = tmp_path / "dispatch.jsonl"
    routing = acme_routing(log, verify="4")
    layer = loaded("gate_up", INT8_PREFIX)
    bound = routing.bind(layer, layer.quant_method.served, "CompressedTensorsLinearMethod")
    assert bound.impl_id == ACME_ID
    reference = get_contract("w8a8_int8_linear").reference
    decode, prefill = randn(1, HIDDEN_SIZE, seed=1), randn(19, HIDDEN_SIZE, seed=2)
    # The vendor's result is what the layer gets (verify observes, never corrects) ...
    got = bound.fn(bound.obj, decode, *bound.weights, None)
    torch.testing.assert_close(got, reference(bound.obj, decode, *bound.weights) * 1.01)
    # ... and a call it declines is the reference's, computed from the checkpoint's layout.
    got = bound.fn(bound.obj, prefill, *bound.weights, None)
    torch.testing.assert_close(got, reference(bound.obj, prefill, *bound.weights), **EXACT)
    records = read_log(log)
    (layer_row,) = [r for r in records if r["event"] == "layer"]
    assert (
        layer_row["layer"]
        == "sglang.srt.layers.linear.MergedColumnParallelLinear[w8a8_int8_linear]"
    )
    assert layer_row["impl_id"] == ACME_ID
    assert layer_row["distribution"] == "sglang-fl-acmequant"
    assert layer_row["fallbacks"] == ["reference.w8a8_int8_linear"]
    assert layer_row["scheme"].startswith("compressed-tensors W8A8 int8")
    verdicts = [(r["impl_id"], r["verdict"]) for r in records if r["event"] == "verify"]
    assert verdicts == [(ACME_ID, "fail"), ("reference.w8a8_int8_linear", "pass")]
    fallbacks = [r for r in records if r["event"] == "fallback"]
    assert [(r["impl_id"], r["next_impl_id"], r["reason"], r.get("stage")) for r in fallbacks] == [
        (ACME_ID, "reference.w8a8_int8_linear", "acmequant serves at most 16 tokens per call", None)
    ]


@pytest.mark.usefixtures("acme")
def test_a_layer_declined_at_preparation_runs_on_the_next_candidate_reported(
    tmp_path: Path,
) -> None:
    log = tmp_path / "dispatch.jsonl"
    routing = acme_routing(log)
    for _ in range(2):  # a second layer of the kind: no second record
        layer = loaded("gate_up", W4_PREFIX)
        bound = routing.bind(layer, layer.quant_method.served, "CompressedTensorsLinearMethod")
        assert bound.impl_id == "reference.wna16_linear"
    records = read_log(log)
    fallbacks = [r for r in records if r["event"] == "fallback"]
    assert [
        (r["op"], r["impl_id"], r["next_impl_id"], r["reason"], r["stage"]) for r in fallbacks
    ] == [
        (
            "wna16_linear",
            ACME_ID,
            "reference.wna16_linear",
            "acmequant has no 4-bit kernel",
            "prepare",
        )
    ]
    (layer_row,) = [r for r in records if r["event"] == "layer"]
    assert (layer_row["impl_id"], layer_row["fallbacks"]) == ("reference.wna16_linear", [])


@pytest.mark.usefixtures("acme")
def test_strict_mode_turns_either_decline_into_an_error_naming_the_vendor(tmp_path: Path) -> None:
    routing = acme_routing(tmp_path / "dispatch.jsonl", strict="1")
    layer = loaded("gate_up", W4_PREFIX)
    with pytest.raises(StrictModeError, match=r"vendor\.acmequant"):
        routing.bind(layer, layer.quant_method.served, "CompressedTensorsLinearMethod")
    layer = loaded("gate_up", INT8_PREFIX)
    bound = routing.bind(layer, layer.quant_method.served, "CompressedTensorsLinearMethod")
    bound.fn(bound.obj, randn(1, HIDDEN_SIZE, seed=1), *bound.weights, None)  # accepted: runs
    with pytest.raises(StrictModeError, match=r"vendor\.acmequant declined a call"):
        bound.fn(bound.obj, randn(19, HIDDEN_SIZE, seed=2), *bound.weights, None)
