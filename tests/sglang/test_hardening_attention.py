"""Hardening III (issue 33): the attention selection and backends when a vendor misbehaves.

Each case runs ``backend_forward.py`` (SGLang's real KV pools and ``RadixAttention`` layers, a
prefill and a decode step through what ``attention_backend.create_backend`` builds, as SGLang's
registry calls it, beside ``torch_native`` on twin pools) in a fresh interpreter, with the
hostile vendor distribution (``hostile_vendor.py``) switched per run, and a hard timeout. The
shared ``llama+vendor`` engine carries two of the attacks live (``test_attention_vendor_backend``).
What each test guards against, as on 4ee63c2:

- an offer whose priority was NaN (or ``"high"``, ``1e400``) ended the process in the
  selection;
- a factory raising ``SystemExit`` or another ``BaseException`` ended the host; one that never
  returned hung it;
- a vendor backend that raised (``SystemExit`` too) or returned the wrong shape mid-forward
  gave an error that did not name it, or no error at all;
- a call the only allowed attention kernel declined escaped as ``Unsupported``.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from engines import EnginePool
from hostile_vendor import DECODE_DECLINE, DECODE_FAULT, FACTORY_IMPL_ID
from test_attention_selection import forward as run_forward
from test_attention_selection import result

pytest.importorskip("sglang")

KERNEL_BACKEND = "reference.sglang_fl_attention"


def forward(pool: EnginePool, tmp_path: Path, **env: str) -> Any:
    return run_forward(pool, tmp_path, "hostile", **env)


def served(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    found = result(proc)
    assert (found["same"], found["pools_same"]) == (True, True), found
    return found


@pytest.mark.parametrize(
    ("priority", "named"),
    [
        ("nan", "priority=nan; expected an int"),
        ("inf", "priority=inf; expected an int"),
        ("word", "priority='high'; expected an int"),
        ("bool", "priority=True; expected an int"),
    ],
)
def test_an_offer_with_a_wrong_priority_is_refused_and_the_kernels_serve(
    engine_pool: EnginePool, tmp_path: Path, priority: str, named: str
) -> None:
    proc, rows = forward(engine_pool, tmp_path, HOSTILE_OFFER_PRIORITY=priority)
    assert served(proc)["backend_class"] == "SglangFlAttnBackend"
    (record,) = [r for r in rows if r["event"] == "attention_backend"]
    assert record["impl_id"] == KERNEL_BACKEND
    assert (
        "plugin 'hostile_offer': sglang_fl_attention_backend returned an unusable offer: "
        f"its {named}"
    ) in proc.stderr


@pytest.mark.parametrize(
    ("how", "named"),
    [
        ("exit", "its factory raised SystemExit: 3"),
        ("baseexc", "its factory raised PluginBaseError: not an Exception"),
        ("hang", "its factory did not return within 2 s (SGLANG_FL_PLUGIN_TIMEOUT); abandoned"),
    ],
)
def test_a_factory_that_exits_or_hangs_is_a_fallback_and_the_next_candidate_serves(
    engine_pool: EnginePool, tmp_path: Path, how: str, named: str
) -> None:
    started = time.monotonic()
    proc, rows = forward(engine_pool, tmp_path, HOSTILE_FACTORY=how, SGLANG_FL_PLUGIN_TIMEOUT="2")
    assert served(proc)["backend_class"] == "SglangFlAttnBackend"
    assert time.monotonic() - started < 200
    (fallback,) = [r for r in rows if r["event"] == "fallback"]
    assert (fallback["op"], fallback["impl_id"], fallback["next_impl_id"]) == (
        "sglang_attention_backend",
        FACTORY_IMPL_ID,
        KERNEL_BACKEND,
    )
    assert fallback["reason"] == named
    (record,) = [r for r in rows if r["event"] == "attention_backend"]
    assert (record["impl_id"], record["failed"]) == (KERNEL_BACKEND, [FACTORY_IMPL_ID])


def test_a_vendor_backend_that_raises_mid_forward_is_named_in_the_error(
    engine_pool: EnginePool, tmp_path: Path
) -> None:
    """Nothing is re-run (the forward may have written the KV cache): the error propagates,
    marked as the vendor's."""
    proc, rows = forward(engine_pool, tmp_path, HOSTILE_FACTORY="raise")
    assert proc.returncode != 0
    assert f"RuntimeError: {DECODE_FAULT}" in proc.stderr
    assert (
        f"sglang-fl: raised by the attention backend {FACTORY_IMPL_ID} (hostile_factory "
        "(sglang-fl-hostile 0.0.1)) in forward_decode"
    ) in proc.stderr, proc.stderr[-3000:]
    (record,) = [r for r in rows if r["event"] == "attention_backend"]
    assert record["impl_id"] == FACTORY_IMPL_ID  # it served: the report says so


def test_a_vendor_backend_exiting_mid_forward_is_an_error_naming_it(
    engine_pool: EnginePool, tmp_path: Path
) -> None:
    """Before: ``sys.exit(3)`` in a vendor's forward ended SGLang's scheduler with exit code 3
    and no trace of whose code it was; now it is an Exception (SGLang logs it) naming it."""
    proc, _ = forward(engine_pool, tmp_path, HOSTILE_FACTORY="exit_decode")
    assert proc.returncode != 0
    assert (
        f"ContractViolationError: the attention backend {FACTORY_IMPL_ID} (hostile_factory "
        "(sglang-fl-hostile 0.0.1)) raised SystemExit: 3 in forward_decode; a forward must "
        "return its output or raise an Exception"
    ) in proc.stderr, proc.stderr[-3000:]


def test_a_vendor_backend_returning_the_wrong_shape_is_stopped_naming_it(
    engine_pool: EnginePool, tmp_path: Path
) -> None:
    """Before: the half-width output went on (here, compared unequal; in a model, into the
    next projection's shape error far from the vendor)."""
    proc, _ = forward(engine_pool, tmp_path, HOSTILE_FACTORY="wrong_shape")
    assert proc.returncode != 0
    assert (
        f"ContractViolationError: the attention backend {FACTORY_IMPL_ID} (hostile_factory "
        "(sglang-fl-hostile 0.0.1)) returned a [2, 32] output from forward_decode; SGLang's "
        "attention layer takes [2, 64] (tokens, q_heads * v_head_dim)"
    ) in proc.stderr, proc.stderr[-3000:]


def test_a_call_the_only_allowed_kernel_declines_is_run_by_torch_native_reported(
    engine_pool: EnginePool, tmp_path: Path
) -> None:
    proc, rows = forward(
        engine_pool,
        tmp_path,
        HOSTILE_DECODE="decline",
        SGLANG_FL_PER_OP="decode_attention=vendor:hostile_kernels",
    )
    served(proc)  # torch_native's outputs, on both pools
    decode = [r for r in rows if r["event"] == "layer" and r.get("op") == "decode_attention"]
    assert {(r["impl_id"], tuple(r["fallbacks"])) for r in decode} == {
        ("vendor.hostile_kernels.decode_attention", ())
    }
    (handoff,) = [r for r in rows if r["event"] == "handoff"]  # once, not per call or layer
    assert handoff["reason"] == (
        "every candidate the policy allows for decode_attention declined a call (the last: "
        f"{DECODE_DECLINE}); SGLang's own code ran it"
    )
    assert handoff["sglang_forward"] == "TorchNativeAttnBackend"


def test_under_strict_the_only_allowed_kernel_declining_is_an_error(
    engine_pool: EnginePool, tmp_path: Path
) -> None:
    proc, _ = forward(
        engine_pool,
        tmp_path,
        HOSTILE_DECODE="decline",
        SGLANG_FL_PER_OP="decode_attention=vendor:hostile_kernels",
        SGLANG_FL_STRICT="1",
    )
    assert proc.returncode != 0
    assert (
        "StrictModeError: SGLANG_FL_STRICT=1: every candidate the policy allows for "
        f"decode_attention declined a call (the last: {DECODE_DECLINE})"
    ) in proc.stderr, proc.stderr[-3000:]
