"""Build tiny Llama, Qwen2, Gemma-3 (text) and MoE checkpoints offline (no model hub in CI).

The tokenizer is a byte-level BPE trained with ``tokenizers`` on the Python standard library's
own sources, so it needs nothing but the interpreter. Weights are random but seeded: the same
call always writes the same checkpoint. Used by the SGLang tests, the demo and the benchmark;
run as a script to build one: ``python tests/sglang/tiny_models.py OUT_DIR [--arch qwen2]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ARCHITECTURES = (
    "llama",
    "qwen2",
    "gemma3",
    "qwen3_moe",
    "mixtral",
    "qwen2_moe",
    "qwen3",
    "gemma3_swa",
    "qwen3_next",
    "qwen3_next_r3",
    "qwen3_5",
)
# MoE architectures: 8 experts, 2 per token, small expert MLPs.
NUM_EXPERTS = 8
EXPERTS_PER_TOKEN = 2
VOCAB_SIZE = 512
HIDDEN_SIZE = 64
NUM_LAYERS = 2
SEED = 1234
# Larger than the usual 0.02 so greedy argmax has clear margins: an exact token-id comparison
# between SGLang and transformers must not hinge on last-bit differences between kernels.
INITIALIZER_RANGE = 0.2
_STAMP = "sglang_fl_tiny_model.json"
_SPECIAL = ("<|endoftext|>", "<|pad|>")


def _stdlib_text(limit_bytes: int = 2_000_000) -> Iterator[str]:
    """Text to train the tokenizer on: the standard library's sources, sorted for determinism."""
    root = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="ignore")
        total += len(text)
        yield text
        if total >= limit_bytes:
            return


def build_tokenizer(out_dir: Path) -> None:
    """Train and save a byte-level BPE tokenizer that ``AutoTokenizer`` loads."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(_SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_stdlib_text(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=_SPECIAL[0],
        eos_token=_SPECIAL[0],
        pad_token=_SPECIAL[1],
    )
    fast.save_pretrained(out_dir)


def _config(
    arch: str, vocab_size: int, eos_id: int, pad_id: int, hidden_size: int
):  # -> PretrainedConfig
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen2Config

    common = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "initializer_range": INITIALIZER_RANGE,
        "rms_norm_eps": 1e-6,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    moe = {"num_experts_per_tok": EXPERTS_PER_TOKEN}
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen2":
        return Qwen2Config(**common, use_sliding_window=False)
    if arch in ("gemma3", "gemma3_swa"):
        # Gemma's GeGLU MLP, 1 + weight norms (q/k norms too), tied embeddings; the sliding
        # window is wider than any test sequence, so local and global layers see the same keys.
        # gemma3_swa: an 8-token window on the first layer, full attention on the second.
        gemma = {**common, "tie_word_embeddings": True}
        window = {"sliding_window": 512}
        if arch == "gemma3_swa":
            window = {
                "sliding_window": 8,
                "layer_types": ["sliding_attention", "full_attention"],
            }
        return Gemma3TextConfig(
            **gemma,
            head_dim=hidden_size // 4,
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=hidden_size // 4,
            **window,
        )
    if arch == "qwen3":
        from transformers import Qwen3Config

        return Qwen3Config(**common, head_dim=hidden_size // 4, use_sliding_window=False)
    if arch == "qwen3_moe":
        from transformers import Qwen3MoeConfig

        return Qwen3MoeConfig(
            **common,
            **moe,
            num_experts=NUM_EXPERTS,
            moe_intermediate_size=hidden_size,
            head_dim=hidden_size // 4,
            norm_topk_prob=True,
            use_sliding_window=False,
        )
    if arch == "mixtral":
        from transformers import MixtralConfig

        return MixtralConfig(**common, **moe, num_local_experts=NUM_EXPERTS)
    if arch == "qwen2_moe":  # with a gated shared expert
        from transformers import Qwen2MoeConfig

        return Qwen2MoeConfig(
            **common,
            **moe,
            num_experts=NUM_EXPERTS,
            moe_intermediate_size=hidden_size,
            shared_expert_intermediate_size=2 * hidden_size,
            norm_topk_prob=False,
            use_sliding_window=False,
        )
    if arch.startswith("qwen3_next"):
        # Hybrid: a gated-delta-rule (linear attention) layer, then a full attention layer.
        # Key/value heads 2/4 (ratio 2: SGLang's fused split path) or 1/3 (ratio 3: its
        # torch reshuffle path).
        from transformers import Qwen3NextConfig

        key_heads, value_heads = (1, 3) if arch == "qwen3_next_r3" else (2, 4)
        return Qwen3NextConfig(
            **common,
            **moe,
            head_dim=hidden_size // 4,
            num_experts=NUM_EXPERTS,
            moe_intermediate_size=hidden_size,
            shared_expert_intermediate_size=2 * hidden_size,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            full_attention_interval=NUM_LAYERS,
            layer_types=["linear_attention", "full_attention"],
            linear_num_key_heads=key_heads,
            linear_num_value_heads=value_heads,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
        )
    if arch == "qwen3_5":
        # Qwen3.5's dense hybrid: its non-interleaved projection split (key/value heads 2/4)
        # and a gated full-attention layer. SGLang reads full_attention_interval, which
        # transformers writes only when given (released checkpoints carry it).
        from transformers import Qwen3_5TextConfig

        return Qwen3_5TextConfig(
            **{k: v for k, v in common.items() if k != "torch_dtype"},
            dtype="float32",
            head_dim=hidden_size // 4,
            full_attention_interval=NUM_LAYERS,
            layer_types=["linear_attention", "full_attention"],
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
        )
    raise ValueError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHITECTURES)}")


def build_tiny_model(
    out_dir: str | Path, arch: str = "llama", hidden_size: int = HIDDEN_SIZE
) -> Path:
    """Write a tiny ``arch`` checkpoint with its tokenizer to ``out_dir``; reuse it if present.

    4 attention heads: ``hidden_size`` 64 gives ``head_dim`` 16, 256 gives 64 (vLLM's CPU
    attention needs ``head_dim`` 64 or more).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out_dir)
    stamp = out / _STAMP
    wanted = {
        "arch": arch,
        "hidden_size": hidden_size,
        "layers": NUM_LAYERS,
        "seed": SEED,
        "vocab_size": VOCAB_SIZE,
        "initializer_range": INITIALIZER_RANGE,
    }
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        return out
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    config = _config(
        arch, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, hidden_size
    )
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    stamp.write_text(json.dumps(wanted))
    return out


def hf_greedy(
    model_dir: str | Path,
    prompts: list[str],
    max_new_tokens: int,
    *,
    stop_at_eos: bool = False,
    prepare: Callable[[Any], None] | None = None,
) -> list[list[int]]:
    """Greedy continuation token ids from ``transformers``: the ground truth for SGLang.

    By default exactly ``max_new_tokens`` (EOS suppressed); with ``stop_at_eos`` up to and
    including the first EOS, as SGLang stops. ``prepare`` is called on the loaded model before
    it generates (an oracle's quantize-dequantize hooks).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if prepare is not None:
        prepare(model)
    results = []
    with torch.no_grad():
        for prompt in prompts:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                min_new_tokens=0 if stop_at_eos else max_new_tokens,
                do_sample=False,
            )
            results.append(out[0, ids.shape[1] :].tolist())
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--arch", choices=ARCHITECTURES, default="llama")
    args = parser.parse_args(argv)
    print(build_tiny_model(args.out_dir, args.arch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
