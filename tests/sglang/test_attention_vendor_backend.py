"""A vendor's whole SGLang attention backend, offered through sglang-fl, end to end.

A real wheel (``backend_vendor.py``) offers a ``TorchNativeAttnBackend`` subclass through
``sglang_fl_attention_backend``. With ``--attention-backend sglang_fl`` the policy chooses it
(a vendor ranks above the reference): the tokens are torch_native's, it really ran in the
scheduler, and the scheduler's one ``attention_backend`` record names it. Denied
(``SGLANG_FL_DENY_VENDORS``), the kernel-based backend serves. A factory that raises falls
back to the kernel-based backend, reported; under ``SGLANG_FL_STRICT=1`` it is an error naming
the vendor. Four engine starts in all (the first run holds two engines).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from backend_vendor import PLUGIN, RAISE_MESSAGE, VENDOR_IMPL_ID, backend_vendor_site
from test_attention_engine import SCENARIOS, _path, _result, _run
from tiny_models import build_tiny_model

from sglang_fl.dispatch_report import read_log

pytest.importorskip("sglang")

KERNEL_BACKEND = "reference.sglang_fl_attention"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return backend_vendor_site(tmp_path_factory.mktemp("wholebackend"))


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("llama") / "model", "llama")


@pytest.fixture(scope="module")
def native(site: Path, llama: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """torch_native's tokens and the vendor-served run, in one subprocess (two engines)."""
    root = tmp_path_factory.mktemp("served")
    calls = root / "calls.txt"
    log = root / "dispatch.jsonl"
    result = _result(
        _run(
            llama,
            log,
            "torch_native",
            "sglang_fl",
            PYTHONPATH=_path(site),
            BACKEND_VENDOR_CALLS=str(calls),
        )
    )
    return {"result": result["backends"], "log": log, "calls": calls}


def _backend_records(log: Path) -> list[dict[str, Any]]:
    return [
        r
        for r in read_log(log)
        if r["event"] == "attention_backend"
        and str(r.get("proctitle") or "").startswith("sglang::scheduler")
    ]


def test_the_vendors_backend_serves_with_torch_natives_tokens(native: dict[str, Any]) -> None:
    ours, reference = native["result"]["sglang_fl"], native["result"]["torch_native"]
    for scenario in SCENARIOS:
        assert ours[scenario] == reference[scenario], scenario
    (record,) = _backend_records(native["log"])  # one record for the one model runner
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
    assert native["calls"].read_text().split() == [str(record["pid"])]
    assert not [r for r in read_log(native["log"]) if r.get("attention_backend") == "sglang_fl"]


def test_denied_the_kernel_based_backend_serves(
    site: Path, llama: Path, native: dict[str, Any], tmp_path: Path
) -> None:
    log, calls = tmp_path / "dispatch.jsonl", tmp_path / "calls.txt"
    result = _result(
        _run(
            llama,
            log,
            "sglang_fl",
            PYTHONPATH=_path(site),
            BACKEND_VENDOR_CALLS=str(calls),
            SGLANG_FL_DENY_VENDORS=PLUGIN,
        )
    )["backends"]["sglang_fl"]
    for scenario in SCENARIOS:
        assert result[scenario] == native["result"]["torch_native"][scenario], scenario
    (record,) = _backend_records(log)
    assert record["impl_id"] == KERNEL_BACKEND
    assert record["backend_class"].endswith("SglangFlAttnBackend")
    assert not calls.exists()
    assert any(r["event"] == "layer" and r.get("attention_backend") for r in read_log(log))


def test_a_factory_that_raises_falls_back_reported(
    site: Path, llama: Path, native: dict[str, Any], tmp_path: Path
) -> None:
    log = tmp_path / "dispatch.jsonl"
    env = {"PYTHONPATH": _path(site), "BACKEND_VENDOR_RAISE": "1"}
    result = _result(_run(llama, log, "sglang_fl", **env))["backends"]["sglang_fl"]
    for scenario in SCENARIOS:
        assert result[scenario] == native["result"]["torch_native"][scenario], scenario
    (record,) = _backend_records(log)
    assert record["impl_id"] == KERNEL_BACKEND
    assert record["failed"] == [VENDOR_IMPL_ID]
    fallbacks = [
        r
        for r in read_log(log)
        if r["event"] == "fallback" and r["op"] == "sglang_attention_backend"
    ]
    assert fallbacks
    assert {(r["impl_id"], r["next_impl_id"]) for r in fallbacks} == {
        (VENDOR_IMPL_ID, KERNEL_BACKEND)
    }
    assert all(RAISE_MESSAGE in r["reason"] for r in fallbacks)


def test_strict_makes_a_failing_factory_an_error_naming_the_vendor(
    site: Path, llama: Path, tmp_path: Path
) -> None:
    proc = _run(
        llama,
        tmp_path / "dispatch.jsonl",
        "sglang_fl",
        PYTHONPATH=_path(site),
        BACKEND_VENDOR_RAISE="1",
        SGLANG_FL_STRICT="1",
    )
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "StrictModeError" in text, text[-4000:]
    assert f"vendor {PLUGIN!r}: attention backend {VENDOR_IMPL_ID}" in text
    assert RAISE_MESSAGE in text
