"""A vendor's whole SGLang attention backend, offered through sglang-fl, serving an engine.

A throwaway vendor distribution (``backend_vendor.py``) offers a ``TorchNativeAttnBackend``
subclass through ``sglang_fl_attention_backend``. On the shared vendor engine
(:data:`~configurations.LLAMA_VENDOR`, ``--attention-backend sglang_fl``) the policy chooses it (a
vendor ranks above the reference): the tokens are transformers', it really ran in the scheduler,
and the scheduler's one ``attention_backend`` record names it. Denied, or its factory raising,
the kernel-based backend serves (and strict makes the latter an error): those are checked on
SGLang's real pools without an engine (``test_attention_selection.py``).
"""

from __future__ import annotations

from typing import Any

import pytest
from attention_scenarios import SCENARIOS, run_scenarios, transformers_scenarios
from backend_vendor import PLUGIN, VENDOR_IMPL_ID
from configurations import LLAMA_VENDOR
from engines import Engine

pytest.importorskip("sglang")


def backend_records(engine: Engine) -> list[dict[str, Any]]:
    return [
        r
        for r in engine.records()
        if r["event"] == "attention_backend"
        and str(r.get("proctitle") or "").startswith("sglang::scheduler")
    ]


@pytest.mark.engine(LLAMA_VENDOR)
def test_the_vendors_backend_serves_with_transformers_tokens(engine: Engine, oracle) -> None:
    ours = run_scenarios(engine)
    want = transformers_scenarios(oracle, "llama")
    for scenario in SCENARIOS:
        assert ours[scenario] == want[scenario], scenario
    (record,) = backend_records(engine)  # one record for the one model runner
    assert (record["impl_id"], record["vendor"], record["kind"]) == (
        VENDOR_IMPL_ID,
        PLUGIN,
        "vendor",
    )
    assert record["distribution"] == "sglang-fl-wholebackend"
    assert record["backend_class"].endswith("RecordingBackend"), record
    assert record["failed"] == []
    assert "matches vendor" in record["reason"]
    # It really ran, in the scheduler that recorded it, and no attention kernel was bound.
    calls = engine.workdir / "backend-calls.txt"
    assert calls.read_text().split() == [str(record["pid"])]
    assert not [r for r in engine.records() if r.get("attention_backend") == "sglang_fl"]
