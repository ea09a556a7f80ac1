"""transformers' greedy tokens for the quantized tiny checkpoints: the oracle of the quant tests.

- compressed-tensors, dense: transformers loads the checkpoint itself (compressed-tensors
  decompresses the weights and quantize-dequantizes each quantized linear's input per token).
- compressed-tensors, MoE: transformers 5.19 merges the experts into 3-D tensors, and its
  ``DecompressExperts`` reads neither block nor int8 expert scales. The oracle checkpoint is the
  same checkpoint with each expert projection decompressed by compressed-tensors itself
  (``decompress_module`` with that projection's scheme) and its group left out of the config;
  the experts then run through an experts implementation registered in transformers'
  ``ExpertsInterface`` that quantize-dequantizes each projection's input with
  compressed-tensors' own ``compute_dynamic_scales_and_zp`` + ``fake_quantize``, as
  compressed-tensors does for every quantized linear layer. Non-expert layers stay compressed.
- ``fp8`` (block): transformers dequantizes FP8 checkpoints only to bfloat16 on a CPU and does
  not quantize activations there; the oracle is the checkpoint dequantized to float32 by the
  format's definition (``weight * weight_scale_inv`` per 128x128 block), every projection's
  input quantize-dequantized by DeepSeek-V3's documented rule (``inference/kernel.py``
  ``act_quant``: per token and group of 128 channels, ``s = amax / 448``, float32).
- ``awq``: transformers needs ``gptqmodel`` for AWQ (not installed); the oracle is the
  checkpoint dequantized by AutoAWQ's layout (unpacked in its reverse order
  ``[0, 4, 1, 5, 2, 6, 3, 7]``, ``(q - zero) * scale``) into a float checkpoint.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quant_models import AWQ_GROUP, BLOCK
from tiny_models import hf_greedy

_ORACLE_STAMP = "sglang_fl_quant_oracle.json"
_EXPERT = re.compile(r"(.*\.experts)\.(\d+)\.(gate|up|down)_proj$")
_LAYER = re.compile(r"\.layers\.(\d+)\.")


def _load(model_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    from safetensors.torch import load_file

    return load_file(model_dir / "model.safetensors"), json.loads(
        (model_dir / "config.json").read_text()
    )


def _write_oracle(model_dir: Path, tensors: dict[str, Any], config: dict[str, Any]) -> Path:
    from safetensors.torch import save_file

    out = model_dir.parent / f"{model_dir.name}-oracle"
    stamp = {"source": str(model_dir), "mtime": (model_dir / "model.safetensors").stat().st_mtime}
    if (out / _ORACLE_STAMP).is_file() and json.loads((out / _ORACLE_STAMP).read_text()) == stamp:
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for path in model_dir.iterdir():
        if path.name not in ("model.safetensors", "config.json") and path.is_file():
            shutil.copyfile(path, out / path.name)
    save_file({k: v.contiguous() for k, v in tensors.items()}, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / _ORACLE_STAMP).write_text(json.dumps(stamp))
    return out


# --- quantize-dequantize of a projection's input --------------------------------------------

Qdq = Callable[[Any], Any]


def compressed_tensors_qdq(args: Any) -> Qdq:
    """compressed-tensors' dynamic quantize-dequantize of a ``[tokens, K]`` input (per token:
    the input is given to it as ``[1, tokens, K]``, the shape a linear layer sees)."""
    import torch
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp

    holder = torch.nn.Module()

    def qdq(x: Any) -> Any:
        if x.numel() == 0:
            return x
        value = x.unsqueeze(0)
        scale, zero_point = compute_dynamic_scales_and_zp(value=value, args=args, module=holder)
        return fake_quantize(value, scale, zero_point, args)[0]

    return qdq


def deepseek_act_qdq(x: Any) -> Any:
    """DeepSeek-V3's ``act_quant`` then back: per token and group of 128, ``s = amax / 448``."""
    import torch

    shape = x.shape
    groups = x.float().reshape(-1, shape[-1] // BLOCK, BLOCK)
    scale = groups.abs().amax(dim=-1, keepdim=True).clamp(min=1e-10) / 448.0
    q = (groups / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    return (q.float() * scale).reshape(shape).to(x.dtype)


_EXPERT_QDQ = "sglang_fl_qdq"


def _register_experts_implementation() -> None:
    """An experts forward (Qwen3-MoE's eager loop) that quantize-dequantizes each expert
    projection's input with the module's ``qdq_gate_up`` / ``qdq_down``."""
    import torch
    from torch import nn
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    def forward(self: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
        final = torch.zeros_like(hidden_states)
        mask = nn.functional.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)
        for expert in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()[:, 0].tolist():
            if expert == self.num_experts:
                continue
            top_k_pos, token_idx = torch.where(mask[expert])
            state = self.qdq_gate_up(hidden_states[token_idx])
            gate, up = nn.functional.linear(state, self.gate_up_proj[expert]).chunk(2, dim=-1)
            hidden = self.qdq_down(self.act_fn(gate) * up)
            out = nn.functional.linear(hidden, self.down_proj[expert])
            out = out * top_k_weights[token_idx, top_k_pos, None]
            final.index_add_(0, token_idx, out.to(final.dtype))
        return final

    ALL_EXPERTS_FUNCTIONS.register(_EXPERT_QDQ, forward)


def _experts_modules(model: Any) -> dict[int, Any]:
    return {
        index: layer.mlp.experts
        for index, layer in enumerate(model.model.layers)
        if hasattr(layer.mlp, "experts")
    }


# --- compressed-tensors MoE --------------------------------------------------------------------


def _ct_moe_oracle(model_dir: Path) -> tuple[Path, dict[int, Any]]:
    """The oracle checkpoint (experts decompressed) and each MoE layer's input args."""
    import torch
    from compressed_tensors.compressors.base import decompress_module
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme

    tensors, config = _load(model_dir)
    quantization = config["quantization_config"]
    parsed = QuantizationConfig.model_validate(quantization)

    def scheme_of(module: str) -> tuple[str, QuantizationScheme] | None:
        for name, scheme in parsed.config_groups.items():
            for target in scheme.targets:
                if target.startswith("re:") and re.match(target[3:], module):
                    return name, scheme
        return None

    modules = sorted({k.rsplit(".", 1)[0] for k in tensors if _EXPERT.match(k.rsplit(".", 1)[0])})
    expert_groups: set[str] = set()
    layer_args: dict[int, Any] = {}
    for module in modules:
        found = scheme_of(module)
        if found is None:
            continue
        group, scheme = found
        expert_groups.add(group)
        layer_args[int(_LAYER.search(module).group(1))] = scheme.input_activations  # type: ignore[union-attr]
        state = {
            k.rsplit(".", 1)[1]: tensors.pop(k)
            for k in list(tensors)
            if k.rsplit(".", 1)[0] == module
        }
        linear = torch.nn.Linear(1, 1, bias=False)
        del linear.weight
        for name, value in state.items():
            linear.register_parameter(name, torch.nn.Parameter(value, requires_grad=False))
        linear.quantization_scheme = scheme
        decompress_module(linear)
        tensors[f"{module}.weight"] = linear.weight.detach().to(torch.float32)
    for group in expert_groups:
        del quantization["config_groups"][group]
    return _write_oracle(model_dir, _merged_experts(tensors), config), layer_args


def _merged_experts(tensors: dict[str, Any]) -> dict[str, Any]:
    """Per-expert dense projections as transformers' merged ``experts.gate_up_proj``
    ``[E, 2I, H]`` and ``experts.down_proj`` ``[E, H, I]`` (its own parameter layout, which it
    loads as is: its checkpoint conversion would treat per-expert keys as quantized ones)."""
    import torch

    per_expert: dict[str, dict[int, dict[str, Any]]] = {}
    for key in [k for k in tensors if k.endswith(".weight") and _EXPERT.match(k[:-7])]:
        prefix, expert, proj = _EXPERT.match(key[:-7]).groups()  # type: ignore[union-attr]
        per_expert.setdefault(prefix, {}).setdefault(int(expert), {})[proj] = tensors.pop(key)
    for prefix, experts in per_expert.items():
        order = sorted(experts)
        tensors[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat([experts[e]["gate"], experts[e]["up"]]) for e in order]
        )
        tensors[f"{prefix}.down_proj"] = torch.stack([experts[e]["down"] for e in order])
    return tensors


def _ct_moe_greedy(model_dir: Path, prompts: list[str], n: int, stop_at_eos: bool) -> Any:
    oracle, layer_args = _ct_moe_oracle(model_dir)
    _register_experts_implementation()

    def prepare(model: Any) -> None:
        model.config._experts_implementation = _EXPERT_QDQ
        for index, experts in _experts_modules(model).items():
            qdq = compressed_tensors_qdq(layer_args[index])
            experts.qdq_gate_up = experts.qdq_down = qdq

    return hf_greedy(oracle, prompts, n, stop_at_eos=stop_at_eos, prepare=prepare)


# --- fp8 (block) and awq: dense oracles -------------------------------------------------------


def _fp8_dense(model_dir: Path) -> Path:
    import torch

    from sglang_fl.ops.quantization.numerics import dequantize_block

    tensors, config = _load(model_dir)
    for key in [k for k in tensors if k.endswith(".weight_scale_inv")]:
        weight_key = key.removesuffix("_scale_inv")
        scale = tensors.pop(key)
        tensors[weight_key] = dequantize_block(tensors[weight_key], scale, (BLOCK, BLOCK))
    del config["quantization_config"]
    config["torch_dtype"] = "float32"
    return _write_oracle(model_dir, {k: v.to(torch.float32) for k, v in tensors.items()}, config)


def _fp8_greedy(model_dir: Path, prompts: list[str], n: int, stop_at_eos: bool) -> Any:
    import torch

    dense = _fp8_dense(model_dir)
    _register_experts_implementation()
    quantized = re.compile(r".*(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)$")

    def prepare(model: Any) -> None:
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and quantized.match(name):
                module.register_forward_pre_hook(lambda m, args: (deepseek_act_qdq(args[0]),))
        if _experts_modules(model):
            model.config._experts_implementation = _EXPERT_QDQ
        for experts in _experts_modules(model).values():
            experts.qdq_gate_up = experts.qdq_down = deepseek_act_qdq

    return hf_greedy(dense, prompts, n, stop_at_eos=stop_at_eos, prepare=prepare)


_AWQ_REVERSE = (0, 4, 1, 5, 2, 6, 3, 7)  # column i of 8 sits in nibble _AWQ_REVERSE[i]


def _awq_unpack(packed: Any) -> Any:
    import torch

    columns = [(packed >> (4 * _AWQ_REVERSE[i])) & 0xF for i in range(8)]
    return torch.stack(columns, dim=-1).reshape(packed.shape[0], -1)


def _awq_dense(model_dir: Path) -> Path:
    import torch

    tensors, config = _load(model_dir)
    for key in [k for k in tensors if k.endswith(".qweight")]:
        module = key.removesuffix(".qweight")
        q = _awq_unpack(tensors.pop(key)).float()  # [K, N]
        zeros = _awq_unpack(tensors.pop(f"{module}.qzeros")).float()  # [K/g, N]
        scales = tensors.pop(f"{module}.scales").float()  # [K/g, N]
        expand = lambda t: t.repeat_interleave(AWQ_GROUP, dim=0)  # noqa: E731
        tensors[f"{module}.weight"] = ((q - expand(zeros)) * expand(scales)).t().contiguous()
    del config["quantization_config"]
    config["torch_dtype"] = "float32"
    return _write_oracle(model_dir, {k: v.to(torch.float32) for k, v in tensors.items()}, config)


def quant_greedy(
    model_dir: str | Path, prompts: list[str], max_new_tokens: int, *, stop_at_eos: bool = False
) -> list[list[int]]:
    """The oracle's greedy continuations of ``prompts`` for one quantized tiny checkpoint."""
    model_dir = Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    method = config["quantization_config"]["quant_method"]
    moe = "num_experts" in config or "num_local_experts" in config
    if method == "compressed-tensors":
        if not moe:
            return hf_greedy(model_dir, prompts, max_new_tokens, stop_at_eos=stop_at_eos)
        return _ct_moe_greedy(model_dir, prompts, max_new_tokens, stop_at_eos)
    if method == "fp8":
        return _fp8_greedy(model_dir, prompts, max_new_tokens, stop_at_eos)
    if method == "awq":
        return hf_greedy(_awq_dense(model_dir), prompts, max_new_tokens, stop_at_eos=stop_at_eos)
    raise ValueError(f"no oracle for quant_method {method!r}")
