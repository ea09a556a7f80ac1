"""A vendor's whole SGLang attention backend, offered through sglang-fl, serving an engine.

A throwaway vendor distribution (``backend_vendor.py``) offers a ``TorchNativeAttnBackend``
subclass through ``sglang_fl_attention_backend``. On the shared vendor engine
(:data:`~configurations.LLAMA_VENDOR`, ``--attention-backend sglang_fl``) the policy chooses it (a
vendor ranks above the reference): the tokens are transformers', it really ran in the scheduler,
and the scheduler's one ``attention_backend`` record names it. Denied, or its factory raising,
the kernel-based backend serves (and strict makes the latter an error): those are checked on
SGLang's real pools without an engine (``test_attention_selection.py``).

The same engine carries two hostile offers (``hostile_vendor.py``, issue 33): one whose
priority is ``"high"`` (on 4ee63c2 it killed the scheduler at start-up; now refused, named in
the log) and one ranked above every vendor whose factory calls ``sys.exit(3)`` (on 4ee63c2 it
ended the scheduler; now a ``fallback`` record, and the whole backend is built next).
"""

from __future__ import annotations

from typing import Any

import pytest
from attention_scenarios import SCENARIOS, run_scenarios, transformers_scenarios
from backend_vendor import PLUGIN, VENDOR_IMPL_ID
from configurations import LLAMA_VENDOR
from engines import Engine
from hostile_vendor import FACTORY_IMPL_ID

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
    # The hostile factory ranked first and exited: reported, and this one built next.
    assert record["failed"] == [FACTORY_IMPL_ID]
    assert record["reason"].startswith(f"{FACTORY_IMPL_ID} failed to build (its factory raised")
    # It really ran, in the scheduler that recorded it, and no attention kernel was bound.
    calls = engine.workdir / "backend-calls.txt"
    assert calls.read_text().split() == [str(record["pid"])]
    assert not [r for r in engine.records() if r.get("attention_backend") == "sglang_fl"]


@pytest.mark.engine(LLAMA_VENDOR)
def test_a_refused_offer_and_an_exiting_factory_leave_the_engine_serving(engine: Engine) -> None:
    """The engine came up and serves (the other tests' tokens); the refusal and the fallback
    are in its output and its scheduler's records."""
    schedulers = {r["pid"] for r in backend_records(engine)}
    fallbacks = [
        r
        for r in engine.records()
        if r["event"] == "fallback" and r["op"] == "sglang_attention_backend"
    ]
    assert {r["pid"] for r in fallbacks} == schedulers
    assert {(r["impl_id"], r["next_impl_id"], r["reason"]) for r in fallbacks} == {
        (FACTORY_IMPL_ID, VENDOR_IMPL_ID, "its factory raised SystemExit: 3")
    }
    assert (
        "plugin 'hostile_offer': sglang_fl_attention_backend returned an unusable offer: its "
        "priority='high'; expected an int (see BackendPriority)"
    ) in engine.output.read_text(errors="replace")
