"""Every SGLang engine configuration the end-to-end tests use, in one place.

An engine start is the suite's main cost (see ``engines.py``), so tests share these specs
instead of starting their own; a new test joins one of them unless it truly needs another,
and then adds it here, saying what it serves. The summary at the end of a pytest run lists the
engines that were started.

Fast tier (``nox -s sglang``), the tiny Llama:

- :data:`LLAMA`: started as docs/running.md shows (no attention backend named: sglang-fl's
  platform makes it ``sglang_fl``), sglang-fl's reference kernels everywhere (fused ops and
  attention), beside an installed vendor whose chip is absent (``offline_chip``: its probe says
  no, so the report says why it was skipped), with the observers on: the hook trace and verify
  mode. Small prefill chunks, so a long prompt spans several.
- :data:`LLAMA_VENDOR`: a vendor wheel serving every fused op (``probe``, recording where its
  kernels ran) and a vendor's whole attention backend (``wholebackend``), beside two hostile
  offers (``hostile``): one whose priority is ``"high"`` (refused) and one ranked first whose
  factory calls ``sys.exit`` (a fallback: the whole backend is built next).
- :data:`LLAMA_SKEWED`: verify mode with a vendor whose ``rms_norm`` is subtly wrong.

- :data:`LLAMA_COMPILED`: SGLang's CPU graph runner (``--enable-torch-compile``) through
  sglang-fl: the decode step compiled for batches of 1 and 2.

Matrix tier (``nox -s sglang_matrix``): the other architectures, several ranks, the real model
(and the compiled decode of Qwen3, Qwen3-Next and the real model in bfloat16), the
quantized checkpoints (one engine per checkpoint format, ``test_quantization_engine.py``).
"""

from __future__ import annotations

from engines import EngineSpec
from quant_vendor import SERVED_LOG_ENV

# Tokens per prefill chunk in the attention scenarios: their long prompt spans several.
CHUNK = 16
# Two ranks on the two cores: one OpenMP thread each, bound to its own core.
TWO_RANKS = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}
VERIFY_CALLS = 3  # per layer class: the prefill and the first decode steps

# --- fast tier -----------------------------------------------------------------------------

LLAMA = EngineSpec.of(
    "llama",
    label="llama",
    chunked_prefill_size=CHUNK,
    sites=("offline_chip",),
    env={"SGLANG_FL_TRACE": "{workdir}/trace.log", "SGLANG_FL_VERIFY": str(VERIFY_CALLS)},
)
LLAMA_VENDOR = EngineSpec.of(
    "llama",
    label="llama+vendor",
    attention_backend="sglang_fl",
    chunked_prefill_size=CHUNK,
    sites=("probe", "wholebackend", "hostile"),
    env={
        "PROBE_VENDOR_CALLS": "{workdir}/probe-calls.jsonl",
        "BACKEND_VENDOR_CALLS": "{workdir}/backend-calls.txt",
        "HOSTILE_OFFER_PRIORITY": "word",
        "HOSTILE_FACTORY": "exit",
    },
)
LLAMA_SKEWED = EngineSpec.of(
    "llama",
    label="llama+skewed",
    sites=("skewed",),
    env={"SGLANG_FL_VERIFY": str(VERIFY_CALLS)},
)

# SGLang's CPU graph runner: one compiled decode step per batch size (1 and 2), each compiled at
# start-up; a batch of three decodes eagerly in the same engine.
COMPILED = {
    "attention_backend": "sglang_fl",
    "enable_torch_compile": True,
    "torch_compile_max_bs": 2,
}
LLAMA_COMPILED = EngineSpec.of("llama", label="llama-compiled", **COMPILED)

# --- matrix tier ---------------------------------------------------------------------------

QWEN2 = EngineSpec.of("qwen2", label="qwen2")
QWEN3 = EngineSpec.of(
    "qwen3", label="qwen3", attention_backend="sglang_fl", chunked_prefill_size=CHUNK
)
# Gemma-3 with an 8-token sliding window on one layer, routed (fused ops and attention), and
# on SGLang's own paths (forward_native, torch_native): the window's translation is subtle, so
# SGLang's own run is the oracle here.
GEMMA3 = EngineSpec.of(
    "gemma3_swa", label="gemma3", attention_backend="sglang_fl", chunked_prefill_size=CHUNK
)
GEMMA3_SGLANG = EngineSpec.of(
    "gemma3_swa",
    label="gemma3-sglang-own",
    attention_backend="torch_native",
    chunked_prefill_size=CHUNK,
    env={"SGLANG_FORCE_FUSED_OP_BACKEND": "torch"},
)
# Several ranks with a third-party collective library (cvendor) serving on every rank.
_CVENDOR = {"COLLECTIVE_VENDOR_OUT": "{workdir}/vendor.jsonl", **TWO_RANKS}
LLAMA_TP2 = EngineSpec.of(
    "llama",
    label="llama-tp2",
    tp_size=2,
    attention_backend="sglang_fl",
    chunked_prefill_size=CHUNK,
    sites=("cvendor",),
    env=_CVENDOR,
)
LLAMA_PP2 = EngineSpec.of("llama", label="llama-pp2", pp_size=2, sites=("cvendor",), env=_CVENDOR)
QWEN3_MOE_TP2 = EngineSpec.of(
    "qwen3_moe", label="qwen3-moe-tp2", tp_size=2, sites=("cvendor",), env=_CVENDOR
)
MIXTRAL = EngineSpec.of("mixtral", label="mixtral")
QWEN2_MOE = EngineSpec.of("qwen2_moe", label="qwen2-moe")
# Hybrid linear attention: 64-token prefill chunks (the long prompt spans several). No
# SGLANG_MAMBA_CONV_DTYPE, as docs/running.md starts them: on sglang-fl's platform the conv
# states take the model's dtype (SGLang's own bfloat16 failed a float32 model's first prefill),
# so the float32 comparison with transformers is like for like.
GDN_CHUNK = 64
QWEN3_NEXT = EngineSpec.of("qwen3_next", label="qwen3-next", chunked_prefill_size=GDN_CHUNK)
# Ratio 3 (SGLang's torch reshuffle), with a vendor whose chunked delta rule declines long calls.
QWEN3_NEXT_R3 = EngineSpec.of(
    "qwen3_next_r3",
    label="qwen3-next-r3+gdndecline",
    chunked_prefill_size=GDN_CHUNK,
    sites=("gdndecline",),
    env={"GDN_DECLINE_SERVED_LOG": "{workdir}/served.txt"},
)
QWEN3_5 = EngineSpec.of("qwen3_5", label="qwen3.5", chunked_prefill_size=GDN_CHUNK)
QWEN3_NEXT_BF16 = EngineSpec.of(
    "qwen3_next", label="qwen3-next-bf16", dtype="bfloat16", chunked_prefill_size=GDN_CHUNK
)
SMOLLM2_BF16 = EngineSpec.of("smollm2", label="smollm2-bf16", dtype="bfloat16")
QWEN3_COMPILED = EngineSpec.of("qwen3", label="qwen3-compiled", **COMPILED)
QWEN3_NEXT_COMPILED = EngineSpec.of("qwen3_next", label="qwen3-next-compiled", **COMPILED)
SMOLLM2_BF16_COMPILED = EngineSpec.of(
    "smollm2", label="smollm2-bf16-compiled", dtype="bfloat16", **COMPILED
)
# SGLang's forward_native paths for the fused ops; attention stays on the platform's default
# (sglang_fl), as in SMOLLM2_BF16, so the two compare the fused ops alone.
SMOLLM2_BF16_SGLANG = EngineSpec.of(
    "smollm2",
    label="smollm2-bf16-sglang-own",
    dtype="bfloat16",
    env={"SGLANG_FORCE_FUSED_OP_BACKEND": "torch"},
)

# Quantized checkpoints (models registered by test_quantization_engine.py), one per format;
# 32-token prefill chunks, so the long prompt spans several.
QUANT_CHUNK = 32
# compressed-tensors Llama mixing every linear scheme, with the quantprobe vendor: its prepared
# int8 kernel serves decode steps and declines prefills, its W4A16 kernel declines wide layers.
QUANT_DENSE = EngineSpec.of(
    "quant-dense",
    label="quant-dense+quantprobe",
    chunked_prefill_size=QUANT_CHUNK,
    sites=("quantprobe",),
    env={SERVED_LOG_ENV: "{workdir}/quantprobe.log"},
)
# compressed-tensors Qwen3-MoE: W8A8 int8 attention, FP8-block and W8A8 int8 experts.
QUANT_MOE = EngineSpec.of("quant-moe", label="quant-moe", chunked_prefill_size=QUANT_CHUNK)
# The Qwen3-MoE in DeepSeek's `fp8` block format, linear layers and experts.
QUANT_FP8 = EngineSpec.of("quant-fp8", label="quant-fp8", chunked_prefill_size=QUANT_CHUNK)
# The Llama in AutoAWQ's 4-bit format.
QUANT_AWQ = EngineSpec.of("quant-awq", label="quant-awq", chunked_prefill_size=QUANT_CHUNK)
