"""The documented start, ``sglang.Engine(model_path=..., device="cpu")``: what an engine gets on
sglang-fl's platform, and what its dispatch report says about it.

Two shared engines (``configurations.py``), no engine of their own:

- :data:`~configurations.LLAMA`, started as docs/running.md shows (no attention backend named),
  beside an installed vendor whose availability probe says no (``offline_vendor``: kernels for
  ``rms_norm`` and the attention ops). sglang-fl's attention backend serves, its ops run on
  sglang-fl's kernels and the tokens are transformers'; every record names its process's role,
  the records a scheduler writes before SGLang names it included; the first record of each op in
  a process lists the candidates that never run there, the vendor with its probe's reason.
- :data:`~configurations.GEMMA3_SGLANG` (matrix tier), ``attention_backend="torch_native"``: the
  explicit choice wins, and the scheduler's ``attention_backend`` record names it and why.
"""

from __future__ import annotations

from typing import Any

import pytest
from configurations import GEMMA3_SGLANG, LLAMA
from engines import Engine
from offline_vendor import OFFLINE_DISTRIBUTION, OFFLINE_OPS, OFFLINE_REASON

pytest.importorskip("sglang")

PROMPTS = ["def main():", "import os\nimport sys\n", "class Config:"]
MAX_NEW_TOKENS = 12
ATTENTION_OPS = ("store_kv_cache", "decode_attention", "extend_attention")


def _scheduler(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["role"] == "scheduler"]


@pytest.mark.engine(LLAMA)
def test_the_documented_start_runs_attention_through_sglang_fl(engine: Engine, oracle) -> None:
    outputs = engine.generate(PROMPTS, max_new_tokens=MAX_NEW_TOKENS)
    assert [o["output_ids"] for o in outputs] == oracle("llama", PROMPTS, MAX_NEW_TOKENS)
    records = _scheduler(engine.records())
    (backend,) = [r for r in records if r["event"] == "attention_backend"]
    assert (backend["backend"], backend["runner"]) == ("sglang_fl", "sglang-fl")
    assert backend["impl_id"] == "reference.sglang_fl_attention"
    served = {
        (r["layer_id"], r["op"]): r["impl_id"]
        for r in records
        if r["event"] == "layer" and r.get("attention_backend") == "sglang_fl"
    }
    assert served, "no attention layer ran through sglang-fl's backend"
    assert {op for _, op in served} == set(ATTENTION_OPS)
    assert set(served.values()) == {f"reference.{op}" for op in ATTENTION_OPS}
    assert not [r for r in records if r["event"] == "handoff"], "nothing is handed to SGLang"


@pytest.mark.engine(LLAMA)
def test_every_record_names_its_role_even_before_sglang_names_the_process(
    engine: Engine,
) -> None:
    """SGLang loads the plugins in its scheduler before it sets the process title: the
    scheduler's ``plugin`` record has Python's title and still says ``scheduler``."""
    records = engine.records()
    plugins = {r["role"]: r for r in records if r["event"] == "plugin"}
    assert set(plugins) == {"main", "scheduler", "detokenizer"}
    assert plugins["main"]["pid"] == engine.pid
    early = plugins["scheduler"]
    assert not str(early["proctitle"] or "").startswith("sglang::"), early
    layers = [r for r in records if r["event"] == "layer"]
    assert {r["role"] for r in layers} == {"scheduler"}
    assert all(r["proctitle"].startswith("sglang::scheduler") for r in layers)
    assert {r["pid"] for r in layers} == {early["pid"]}


@pytest.mark.engine(LLAMA)
def test_records_say_why_the_vendor_was_skipped_once_per_op_and_process(
    engine: Engine,
) -> None:
    records = [r for r in _scheduler(engine.records()) if r["event"] in ("layer", "function")]
    for op in OFFLINE_OPS:
        of_op = [r for r in records if r["op"] == op]
        assert of_op, f"no record of {op}"
        carrying = [r for r in of_op if "rejected" in r]
        assert carrying == of_op[:1], f"{op}: rejected candidates once, in its first record"
        (rejected,) = carrying[0]["rejected"]
        assert rejected["impl_id"] == f"vendor.offline_chip.{op}"
        assert (rejected["plugin"], rejected["distribution"]) == (
            "offline_chip",
            OFFLINE_DISTRIBUTION,
        )
        assert rejected["available"] is False
        assert rejected["availability_reason"] == OFFLINE_REASON
        assert rejected["reason"] == f"unavailable: {OFFLINE_REASON}"
        assert carrying[0]["impl_id"] == f"reference.{op}"
    # An op with no rejected candidate says so too, once.
    silu = [r for r in records if r["op"] == "silu_and_mul"]
    assert silu[0]["rejected"] == []
    assert all("rejected" not in r for r in silu[1:])


@pytest.mark.engine(GEMMA3_SGLANG)
def test_an_explicit_attention_backend_wins_and_the_report_says_why(engine: Engine) -> None:
    records = _scheduler(engine.records())
    (backend,) = [r for r in records if r["event"] == "attention_backend"]
    assert (backend["backend"], backend["runner"]) == ("torch_native", "sglang")
    assert backend["phases"] == ["prefill", "decode"]
    assert backend["backend_class"].endswith("TorchNativeAttnBackend")
    assert backend["reason"] == "chosen explicitly (attention_backend='torch_native')"
    assert not [r for r in records if r.get("attention_backend") == "sglang_fl"]
