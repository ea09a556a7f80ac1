"""Quantized tiny checkpoints made offline: compressed-tensors presets, ``fp8`` block, AWQ.

Each checkpoint is the float tiny model of ``tiny_models.py`` quantized key by key, written in
the format's own layout:

- **compressed-tensors** (``quant_method: compressed-tensors``): each quantized projection is
  compressed by compressed-tensors itself (its ``compress_module`` with the preset scheme),
  after its weight scale is computed with compressed-tensors' ``calculate_qparams`` from the
  weight's min/max per the scheme's strategy (channel, group, 128x128 block), i.e. what a
  memoryless min-max observer gives. Config groups may give different layers different
  presets (a mixed-scheme model); targets are regexes on module names, so the same config
  describes a dense and a MoE checkpoint (whose experts are per-expert projections on disk).
- **fp8** (``quant_method: fp8``, ``weight_block_size: [128, 128]``): DeepSeek-V3's layout,
  written from its documented form: ``weight`` float8_e4m3fn and ``weight_scale_inv`` float32
  ``[ceil(N/128), ceil(K/128)]`` with ``w = weight * weight_scale_inv`` per block.
- **awq** (``quant_method: awq``, GEMM version, 4 bits, zero point): AutoAWQ's layout,
  ``qweight`` int32 ``[K, N/8]`` and ``qzeros`` int32 ``[K/g, N/8]`` packed eight nibbles per
  int32 in AWQ's order ``0, 2, 4, 6, 1, 3, 5, 7``, ``scales`` ``[K/g, N]`` in float16.

Run as a script to write one: ``python quant_models.py OUT_DIR SCHEME [--arch qwen3_moe]``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiny_models import build_tiny_model

# Dimensions >= 256, never exactly 128 (hidden 512: head_dim 128, 2 key/value heads -> 256):
# compressed-tensors 0.18 reads a [1, n] block scale (a 128-row weight) as a group scale, so a
# 128-wide projection would dequantize wrongly.
HIDDEN_SIZE = 512
BLOCK = 128
AWQ_GROUP = 64
_STAMP = "sglang_fl_quant_model.json"

# Module-name regexes of the projections of each kind (the ``fp8`` and AWQ checkpoints').
ATTENTION = r"re:.*self_attn\.(q|k|v|o)_proj$"
DENSE_MLP = r"re:.*mlp\.(gate|up|down)_proj$"
EXPERTS = r"re:.*experts\.\d+\.(gate|up|down)_proj$"
# SGLang fuses the router into a plain linear layer: keep it (and the head) unquantized.
IGNORED = ("lm_head", r"re:.*mlp\.gate$")


@dataclass(frozen=True)
class Group:
    """One compressed-tensors config group: a preset applied to the modules of ``targets``."""

    preset: str
    targets: tuple[str, ...]


LINEAR = "Linear"  # compressed-tensors' class target: every linear layer (not ignored)

# Schemes the tests serve: one preset everywhere, or several presets in one model. A layer a
# regex target names takes that group, the others the ``Linear`` group (compressed-tensors and
# SGLang both prefer name matches to class matches). SGLang 0.5.23 loads block scales of fused
# linear layers by the ``Linear`` group's block size, so block FP8 linears are that group; and it
# matches a fused layer (``gate_up_proj``) by its own name, then by class, then by its parts'
# names, so a regex naming the parts names the fused layer too.
COMPRESSED_TENSORS: Mapping[str, tuple[Group, ...]] = {
    "w8a8": (Group("W8A8", (LINEAR,)),),
    "fp8_dynamic": (Group("FP8_DYNAMIC", (LINEAR,)),),
    "fp8_block": (Group("FP8_BLOCK", (LINEAR,)),),
    "w4a16": (Group("W4A16", (LINEAR,)),),
    # Every linear scheme in one dense model: attention FP8 block, the first MLP's gate/up
    # W8A8 and down FP8 per channel, the second MLP W4A16.
    "mixed_dense": (
        Group("FP8_BLOCK", (LINEAR,)),
        Group("W4A16", (r"re:.*layers\.1\.mlp\.(gate|up|gate_up|down)_proj$",)),
        Group("W8A8", (r"re:.*layers\.0\.mlp\.(gate|up|gate_up)_proj$",)),
        Group("FP8_DYNAMIC", (r"re:.*layers\.0\.mlp\.down_proj$",)),
    ),
    # MoE: W8A8 attention, FP8-block experts in layer 0, W8A8 int8 experts in layer 1.
    "mixed_moe": (
        Group("W8A8", (LINEAR,)),
        Group("FP8_BLOCK", (r"re:.*layers\.0\.mlp\.experts\.\d+\.(gate|up|down)_proj$",)),
        Group("W8A8", (r"re:.*layers\.1\.mlp\.experts\.\d+\.(gate|up|down)_proj$",)),
    ),
}
OTHER_FORMATS = ("fp8_block_native", "awq")
SCHEMES = (*COMPRESSED_TENSORS, *OTHER_FORMATS)


def _matches(name: str, patterns: Sequence[str]) -> bool:
    """Whether a module name matches a name target (exact, dotted suffix or ``re:``)."""
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], name):
                return True
        elif pattern != LINEAR and (name == pattern or name.endswith("." + pattern)):
            return True
    return False


def _group_of(module: str, schemes: Mapping[str, Any]) -> Any:
    """The scheme of a linear module: the first group naming it, else the ``Linear`` group."""
    named = next((s for s in schemes.values() if _matches(module, s.targets)), None)
    if named is not None or module.endswith("embed_tokens"):
        return named
    return next((s for s in schemes.values() if LINEAR in s.targets), None)


def _read_float(model_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    from safetensors.torch import load_file

    tensors: dict[str, Any] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors, json.loads((model_dir / "config.json").read_text())


def _copy_tokenizer(src: Path, out: Path) -> None:
    """Everything but the weights, the model config and the builders' stamps: tokenizer files,
    chat template, generation config."""
    for path in src.iterdir():
        skip = path.suffix == ".safetensors" or path.name == "config.json"
        if path.is_file() and not skip and not path.name.startswith("sglang_fl_"):
            shutil.copyfile(path, out / path.name)


def _weight_qparams(weight: Any, args: Any) -> tuple[Any, Any]:
    """compressed-tensors' scale and zero point of ``weight`` for ``args``'s strategy."""
    from compressed_tensors.quantization import QuantizationStrategy
    from compressed_tensors.quantization.utils import calculate_qparams

    strategy = args.strategy
    if strategy == QuantizationStrategy.CHANNEL:
        low, high = weight.amin(1, keepdim=True), weight.amax(1, keepdim=True)
    elif strategy == QuantizationStrategy.TENSOR:
        low, high = weight.amin().reshape(1), weight.amax().reshape(1)
    elif strategy == QuantizationStrategy.GROUP:
        groups = weight.unflatten(-1, (-1, args.group_size))
        low, high = groups.amin(-1), groups.amax(-1)
    elif strategy == QuantizationStrategy.BLOCK:
        rows, cols = args.block_structure
        n, k = weight.shape
        blocks = weight.reshape(n // rows, rows, k // cols, cols)
        low, high = blocks.amin((1, 3)), blocks.amax((1, 3))
    else:
        raise ValueError(f"no weight observer for strategy {strategy}")
    return calculate_qparams(low, high, args)


def _compress(weight: Any, scheme: Any) -> dict[str, Any]:
    """compressed-tensors' own compression of one projection: its on-disk tensors."""
    import torch
    from compressed_tensors.compressors.base import compress_module
    from compressed_tensors.quantization import initialize_module_for_quantization

    module = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    module.weight.data = weight.clone()
    initialize_module_for_quantization(module, scheme)
    scale, zero_point = _weight_qparams(weight, scheme.weights)
    module.weight_scale.data = scale.to(module.weight_scale.dtype).reshape(
        module.weight_scale.shape
    )
    if hasattr(module, "weight_zero_point"):
        module.weight_zero_point.data = zero_point.to(module.weight_zero_point.dtype).reshape(
            module.weight_zero_point.shape
        )
    compress_module(module)
    return {name: value.detach().clone() for name, value in module.state_dict().items()}


def _write(out: Path, tensors: dict[str, Any], config: dict[str, Any], src: Path) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    _copy_tokenizer(src, out)


def _compressed_tensors(
    tensors: dict[str, Any], groups: Sequence[Group]
) -> tuple[dict[str, Any], dict[str, Any]]:
    import compressed_tensors
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    schemes = {
        f"group_{index}": preset_name_to_scheme(group.preset, list(group.targets))
        for index, group in enumerate(groups)
    }
    out: dict[str, Any] = {}
    formats = set()
    for key, value in tensors.items():
        module = key.removesuffix(".weight")
        scheme = None
        if key.endswith(".weight") and value.dim() == 2 and not _matches(module, IGNORED):
            scheme = _group_of(module, schemes)
        if scheme is None:
            out[key] = value
            continue
        for name, tensor in _compress(value, scheme).items():
            out[f"{module}.{name}"] = tensor
        formats.add(scheme.format)
    config = QuantizationConfig(
        config_groups=schemes,
        ignore=list(IGNORED),
        format=formats.pop() if len(formats) == 1 else "mixed-precision",
        quantization_status="compressed",
    )
    quantization = {
        **config.model_dump(exclude={"quant_method"}),
        "quant_method": "compressed-tensors",
        "version": compressed_tensors.__version__,
        "sparsity_config": {},
        "transform_config": {},
    }
    return out, quantization


def _is_projection(key: str, value: Any) -> bool:
    module = key.removesuffix(".weight")
    targets = (ATTENTION, DENSE_MLP, EXPERTS)
    return key.endswith(".weight") and value.dim() == 2 and _matches(module, targets)


def _fp8_block_native(tensors: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """DeepSeek-V3's ``fp8`` layout: per 128x128 block ``scale = amax / 448`` (float32)."""
    import torch

    fp8_max = torch.finfo(torch.float8_e4m3fn).max
    out: dict[str, Any] = {}
    for key, value in tensors.items():
        if not _is_projection(key, value):
            out[key] = value
            continue
        n, k = value.shape
        blocks = value.float().reshape(n // BLOCK, BLOCK, k // BLOCK, BLOCK)
        scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / fp8_max
        quantized = (blocks / scale[:, None, :, None]).clamp(-fp8_max, fp8_max)
        out[key] = quantized.reshape(n, k).to(torch.float8_e4m3fn)
        out[key.removesuffix(".weight") + ".weight_scale_inv"] = scale
    quantization = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "weight_block_size": [BLOCK, BLOCK],
        "modules_to_not_convert": ["lm_head"],
    }
    return out, quantization


AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an int32 holds column AWQ_ORDER[i]


def _awq_pack(values: Any) -> Any:
    """``[rows, cols]`` of 4-bit values -> ``[rows, cols / 8]`` int32 in AWQ's nibble order."""
    import torch

    rows, cols = values.shape
    grouped = values.to(torch.int64).reshape(rows, cols // 8, 8)
    packed = torch.zeros(rows, cols // 8, dtype=torch.int64)
    for nibble, column in enumerate(AWQ_ORDER):
        packed |= grouped[..., column] << (4 * nibble)
    return torch.where(packed >= 1 << 31, packed - (1 << 32), packed).to(torch.int32)


def _awq(tensors: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """AutoAWQ GEMM: asymmetric 4-bit per group of ``AWQ_GROUP`` input channels."""
    import torch

    out: dict[str, Any] = {}
    for key, value in tensors.items():
        if not _is_projection(key, value):
            out[key] = value.to(torch.float16)
            continue
        module = key.removesuffix(".weight")
        w = value.float().t()  # [K, N]: AWQ stores the input dimension first
        k, n = w.shape
        groups = w.reshape(k // AWQ_GROUP, AWQ_GROUP, n)
        low, high = groups.amin(1), groups.amax(1)
        scale = ((high - low).clamp(min=1e-5) / 15).to(torch.float16)
        zero = (-low / scale.float()).round().clamp(0, 15)
        q = (groups / scale.float()[:, None, :] + zero[:, None, :]).round().clamp(0, 15)
        out[f"{module}.qweight"] = _awq_pack(q.reshape(k, n).to(torch.int32))
        out[f"{module}.qzeros"] = _awq_pack(zero.to(torch.int32))
        out[f"{module}.scales"] = scale
    quantization = {
        "quant_method": "awq",
        "bits": 4,
        "group_size": AWQ_GROUP,
        "zero_point": True,
        "version": "gemm",
        "modules_to_not_convert": None,
    }
    return out, quantization


def quantize_checkpoint(src: Path, out: Path, scheme: str) -> Path:
    """Write ``src`` (a float safetensors checkpoint) quantized by ``scheme`` to ``out``."""
    tensors, config = _read_float(src)
    if scheme in COMPRESSED_TENSORS:
        tensors, quantization = _compressed_tensors(tensors, COMPRESSED_TENSORS[scheme])
    elif scheme == "fp8_block_native":
        tensors, quantization = _fp8_block_native(tensors)
    else:
        tensors, quantization = _awq(tensors)
        config["torch_dtype"] = "float16"
    config["quantization_config"] = quantization
    _write(out, tensors, config, src)
    return out


def build_quant_model(out_dir: str | Path, scheme: str, arch: str = "llama") -> Path:
    """Write the ``scheme`` checkpoint of the tiny ``arch`` model to ``out_dir`` (cached)."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    out = Path(out_dir)
    stamp = out / _STAMP
    wanted = {"scheme": scheme, "arch": arch, "hidden_size": HIDDEN_SIZE, "version": 3}
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        return out
    src = build_tiny_model(out.parent / f"float-{arch}-{HIDDEN_SIZE}", arch, HIDDEN_SIZE)
    quantize_checkpoint(src, out, scheme)
    stamp.write_text(json.dumps(wanted))
    return out


def quantized_copy(src: str | Path, scheme: str = "w8a8") -> Path:
    """``src`` (a float checkpoint, e.g. the real model) quantized by ``scheme`` beside it, as
    ``<src>-<scheme>``; made once, reused while the source and the scheme are unchanged."""
    src = Path(src)
    out = src.parent / f"{src.name}-{scheme}"
    wanted = {"source": str(src), "scheme": scheme, "version": 2}
    stamp = out / _STAMP
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        return out
    shutil.rmtree(out, ignore_errors=True)
    quantize_checkpoint(src, out, scheme)
    stamp.write_text(json.dumps(wanted))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("scheme", choices=SCHEMES)
    parser.add_argument("--arch", default="llama")
    args = parser.parse_args(argv)
    print(build_quant_model(args.out_dir, args.scheme, args.arch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
