"""GDN through sglang-fl inside a live engine: a vendor declining per call, and bfloat16.

Two shared engines (``configurations.py``), the prompts of ``test_qwen3_next_engine`` (short
ones, one spanning several 64-token chunks with 64-token chunked prefill, two sharing its
prefix):

- the float32 ratio-3 Qwen3-Next with a probe vendor installed (``decline_vendor``): its
  ``chunk_gated_delta_rule`` is chosen over the reference and declines every prefill call of
  more than 32 tokens, serving the shorter ones. The report names it as chosen, carries the
  decline with its reason and the reference as the one that served; the tokens are still
  transformers' greedy tokens.
- the ratio-2 Qwen3-Next in bfloat16 (SGLang's own default bfloat16 conv states): each token
  the engine generates has the probability float32 transformers gives it, teacher-forced on the
  same tokens, within the GDN contracts' bfloat16 tolerance (``delta_rule.TOLERANCES``: atol +
  rtol * |ref|), and the first token of every prompt is transformers' greedy one.
  Probabilities, not log-probabilities: a bounded quantity like the ops' outputs, so an
  absolute tolerance means the same for a likely token and an unlikely one (a log-probability
  of -3.4 off by 0.5 is a probability off by 0.02).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from configurations import QWEN3_NEXT_BF16, QWEN3_NEXT_R3
from decline_vendor import GDN_DECLINE_IMPL_ID, GDN_DECLINE_REASON, GDN_TILE_TOKENS
from engines import Engine, model_path
from sglang_processes import scheduler_layers
from test_qwen3_next_engine import CHUNKED_PREFILL, MAX_NEW_TOKENS, PROMPTS, run_prompts

from sglang_fl.ops.linear_attention.delta_rule import TOLERANCES

pytest.importorskip("sglang")

OP = "chunk_gated_delta_rule"


def _scheduler_functions(engine: Engine) -> list[dict[str, Any]]:
    rows = engine.records()
    scheduler = {r["pid"] for r in scheduler_layers(rows, engine.pid).values()}
    return [r for r in rows if r["event"] == "function" and r["pid"] in scheduler]


@pytest.mark.engine(QWEN3_NEXT_R3)
def test_a_declining_gdn_kernel_hands_its_calls_to_the_reference(engine: Engine, oracle) -> None:
    got = run_prompts(engine)["output_ids"]
    want = oracle(engine.spec.model, PROMPTS, MAX_NEW_TOKENS, stop_at_eos=True)
    served_log = engine.workdir / "served.txt"
    served = [int(n) for n in served_log.read_text().split()] if served_log.exists() else []
    functions = [r for r in _scheduler_functions(engine) if r["op"] == OP]
    chosen = [r for r in functions if "declined_by" not in r]
    assert chosen, functions
    assert {r["impl_id"] for r in chosen} == {GDN_DECLINE_IMPL_ID}  # it ranks first
    assert all(r["fallbacks"] == [f"reference.{OP}"] for r in chosen), chosen
    declines = [r for r in functions if "declined_by" in r]
    assert {(r["declined_by"], r["served_by"], r["reason"]) for r in declines} == {
        (GDN_DECLINE_IMPL_ID, f"reference.{OP}", GDN_DECLINE_REASON)
    }
    assert len(declines) == len({r["pid"] for r in declines})  # the first per process only
    # Per call, by shape: the long prompt's 64-token chunks are declined, the short prompts
    # (and the cached-prefix requests' short tails) are served by the vendor itself.
    assert CHUNKED_PREFILL > GDN_TILE_TOKENS
    assert served, "the vendor served no call"
    assert all(0 < n <= GDN_TILE_TOKENS for n in served), served
    for prompt, ids, expected in zip(PROMPTS, got, want, strict=True):
        assert ids == expected, f"prompt {prompt[-30:]!r}: sglang {ids} != transformers {expected}"


def _fp32_logprobs(model: Path, prompt: str, generated: list[int]) -> list[float]:
    """float32 transformers' log-probability of each generated token, teacher-forced."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = AutoTokenizer.from_pretrained(model)(prompt, return_tensors="pt").input_ids
    full = torch.cat((ids, torch.tensor([generated])), dim=1)
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(full).logits[0, ids.shape[1] - 1 : -1].float()
    picked = logits.log_softmax(-1).gather(-1, torch.tensor(generated)[:, None])
    return picked[:, 0].tolist()


@pytest.mark.engine(QWEN3_NEXT_BF16)
def test_bfloat16_token_probabilities_stay_within_the_contracts_tolerance(
    engine: Engine, oracle
) -> None:
    tolerance = TOLERANCES[torch.bfloat16]
    bf16 = run_prompts(engine)
    want = oracle("qwen3_next", PROMPTS, MAX_NEW_TOKENS, stop_at_eos=True)
    model = model_path("qwen3_next")
    functions = [r for r in _scheduler_functions(engine) if "declined_by" not in r]
    assert {r["runner"] for r in functions} == {"sglang-fl"}, functions
    for prompt, ids, logprobs, expected in zip(
        PROMPTS, bf16["output_ids"], bf16["logprobs"], want, strict=True
    ):
        assert ids[0] == expected[0], f"prompt {prompt[-30:]!r}: first token {ids} vs {expected}"
        reference = torch.tensor(_fp32_logprobs(model, prompt, ids)).exp()
        torch.testing.assert_close(
            torch.tensor(logprobs, dtype=torch.float32).exp(),
            reference,
            atol=tolerance.atol,
            rtol=tolerance.rtol,
            msg=lambda m, p=prompt: f"prompt {p[-30:]!r}: {m}",
        )
