"""GDN through sglang-fl inside a live engine: a vendor declining per call, and bfloat16.

Two engines, one after another, each a subprocess with a hard timeout, on the tiny Qwen3-Next
with value/key head ratio 2 (``tiny_models``), the prompts of ``test_qwen3_next_engine``
(short ones, one spanning several 64-token chunks with 64-token chunked prefill, two sharing
its prefix):

- float32 with a probe vendor wheel built and installed for real (``decline_vendor``): its
  ``chunk_gated_delta_rule`` is chosen over the reference and declines every prefill call of
  more than 32 tokens, serving the shorter ones. The report names it as chosen, carries the
  decline with its reason and the reference as the one that served; the tokens are still
  transformers' greedy tokens.
- bfloat16 (SGLang's own default bfloat16 conv states): each token the engine generates has
  the probability float32 transformers gives it, teacher-forced on the same tokens, within the
  GDN contracts' bfloat16 tolerance (``delta_rule.TOLERANCES``: atol + rtol * |ref|), and the
  first token of every prompt is transformers' greedy one. Probabilities, not log-probabilities:
  a bounded quantity like the ops' outputs, so an absolute tolerance means the same for a likely
  token and an unlikely one (a log-probability of -3.4 off by 0.5 is a probability off by 0.02).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from decline_vendor import (
    GDN_DECLINE_IMPL_ID,
    GDN_DECLINE_REASON,
    GDN_SERVED_LOG_ENV,
    GDN_TILE_TOKENS,
    gdn_decline_vendor_site,
)
from sglang_processes import ENGINE_TIMEOUT_S, HERE, clean_env, scheduler_layers
from test_qwen3_next_engine import CHUNKED_PREFILL, MAX_NEW_TOKENS, PROMPTS
from tiny_models import build_tiny_model, hf_greedy

from sglang_fl.dispatch_report import read_log
from sglang_fl.ops.linear_attention.delta_rule import TOLERANCES

pytest.importorskip("sglang")

OP = "chunk_gated_delta_rule"


def _engine(model: Path, log: Path, *options: str, **env: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(HERE / "hybrid_run.py"), str(model), str(MAX_NEW_TOKENS),
         str(CHUNKED_PREFILL), *PROMPTS, *options],
        env=clean_env(SGLANG_FL_DISPATCH_LOG=str(log), **env),
        capture_output=True, text=True, timeout=ENGINE_TIMEOUT_S,
    )  # fmt: skip
    if proc.returncode != 0:
        pytest.fail(f"engine failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["rows"] = read_log(log)
    return result


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("qwen3-next") / "model", "qwen3_next")


@pytest.fixture(scope="module")
def want(model: Path) -> list[list[int]]:
    return hf_greedy(model, PROMPTS, MAX_NEW_TOKENS, stop_at_eos=True)


@pytest.fixture(scope="module")
def declined(model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("gdn-decline")
    site = gdn_decline_vendor_site(root / "vendor")
    import os

    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    served = root / "served.txt"
    env = {
        "PYTHONPATH": path,
        GDN_SERVED_LOG_ENV: str(served),
    }
    result = _engine(model, root / "dispatch.jsonl", **env)
    result["served"] = [int(n) for n in served.read_text().split()] if served.exists() else []
    return result


def _scheduler_functions(run: dict[str, Any]) -> list[dict[str, Any]]:
    rows = run["rows"]
    scheduler = {r["pid"] for r in scheduler_layers(rows, run["pid"]).values()}
    return [r for r in rows if r["event"] == "function" and r["pid"] in scheduler]


def test_a_declining_gdn_kernel_hands_its_calls_to_the_reference(
    declined: dict[str, Any], want: list[list[int]]
) -> None:
    functions = [r for r in _scheduler_functions(declined) if r["op"] == OP]
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
    assert declined["served"], "the vendor served no call"
    assert all(0 < n <= GDN_TILE_TOKENS for n in declined["served"]), declined["served"]
    for prompt, got, expected in zip(PROMPTS, declined["output_ids"], want, strict=True):
        assert got == expected, f"prompt {prompt[-30:]!r}: sglang {got} != transformers {expected}"


@pytest.fixture(scope="module")
def bf16(model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("gdn-bf16")
    return _engine(model, root / "dispatch.jsonl", "--dtype", "bfloat16")


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


def test_bfloat16_token_probabilities_stay_within_the_contracts_tolerance(
    bf16: dict[str, Any], model: Path, want: list[list[int]]
) -> None:
    tolerance = TOLERANCES[torch.bfloat16]
    functions = [r for r in _scheduler_functions(bf16) if "declined_by" not in r]
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
