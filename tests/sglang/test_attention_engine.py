"""SGLang's ``sglang_fl`` attention backend end to end: the tokens of ``torch_native``, and why.

Per tiny model (Llama, Qwen3, Gemma-3 with an 8-token sliding window on one layer), one
subprocess starts one engine per backend in turn (``attention_run.py``) and generates short
prompts, a prompt spanning several prefill chunks and requests sharing a long prefix sent one
after another (radix-cache hits); ``sglang_fl`` must give exactly ``torch_native``'s greedy
tokens in every scenario, and the scheduler's dispatch report must name the implementation of
each op in every attention layer. Then the bad inputs: an unknown backend name gets SGLang's
own error; a vendor kernel that declines is replaced by the next candidate and the report says
why; ``SGLANG_FL_STRICT=1`` makes that decline an error naming the op and the implementation.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from attention_run import CHUNK
from decline_vendor import DECLINE_IMPL_ID, DECLINE_REASON, decline_vendor_site
from sglang_processes import ENGINE_TIMEOUT_S, HERE, clean_env
from tiny_models import build_tiny_model

from sglang_fl.dispatch_report import read_log

pytest.importorskip("sglang")

BACKENDS = ("torch_native", "sglang_fl")
ATTENTION_OPS = ("store_kv_cache", "decode_attention", "extend_attention")
NUM_LAYERS = 2
SCENARIOS = ("short", "long", "shared")
# torch_native's results per architecture, from the runs fixture (one engine per backend).
_NATIVE: dict[str, dict[str, Any]] = {}


def _run(model: Path, log: Path, *backends: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``attention_run.py`` in a clean environment, with a hard timeout."""
    return subprocess.run(
        [sys.executable, str(HERE / "attention_run.py"), str(model), *backends],
        env=clean_env(SGLANG_FL_DISPATCH_LOG=str(log), **env),
        capture_output=True,
        text=True,
        timeout=2 * ENGINE_TIMEOUT_S,
    )


def _result(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    if proc.returncode != 0:
        raise AssertionError(f"engine failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _attention_rows(log: Path) -> list[dict[str, Any]]:
    """The attention backend's layer records, from the scheduler process(es) only."""
    return [
        r
        for r in read_log(log)
        if r["event"] == "layer"
        and r.get("attention_backend") == "sglang_fl"
        and str(r.get("proctitle") or "").startswith("sglang::scheduler")
    ]


@pytest.fixture(scope="module", params=["llama", "qwen3", "gemma3_swa"])
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, dict[str, Any], Path]:
    arch = request.param
    root = tmp_path_factory.mktemp(arch)
    model = build_tiny_model(root / "model", arch)
    log = root / "dispatch.jsonl"
    result = _result(_run(model, log, *BACKENDS))
    _NATIVE[arch] = result["backends"]["torch_native"]
    return arch, result, log


def test_sglang_fl_gives_torch_natives_tokens(runs: tuple[str, dict[str, Any], Path]) -> None:
    arch, result, _ = runs
    native, ours = result["backends"]["torch_native"], result["backends"]["sglang_fl"]
    for scenario in SCENARIOS:
        assert ours[scenario] == native[scenario], f"{arch}: {scenario} prompts differ"
        assert all(len(ids) > 0 for ids in ours[scenario])
    # The long prompt really spans several chunks, and the shared prefix really hit the cache.
    assert ours["long_prompt_tokens"] > 3 * CHUNK
    assert ours["shared_cached_tokens"][0] == 0
    assert all(cached >= 2 * CHUNK for cached in ours["shared_cached_tokens"][1:])


def test_report_names_the_kernels_of_every_attention_layer(
    runs: tuple[str, dict[str, Any], Path],
) -> None:
    arch, _, log = runs
    rows = _attention_rows(log)
    served = {(r["layer_id"], r["op"]): r for r in rows}
    assert len(served) == len(rows), f"{arch}: more than one record per layer and op: {rows}"
    assert set(served) == {(i, op) for i in range(NUM_LAYERS) for op in ATTENTION_OPS}
    for (_, op), row in served.items():
        assert (row["runner"], row["impl_id"]) == ("sglang-fl", f"reference.{op}"), row
        assert row["layer"] == f"sglang.srt.layers.radix_attention.RadixAttention[{op}]"
        assert isinstance(row["pid"], int)
    handoffs = [r for r in read_log(log) if r["event"] == "handoff" and r.get("attention_backend")]
    assert handoffs == []


def test_tensor_parallel_ranks_give_torch_natives_tokens(llama: Path, tmp_path: Path) -> None:
    """TP=2 on the CPU (one NUMA node, a core per rank): each rank's backend binds its own
    kernels for its heads, and the tokens are torch_native's at TP=2."""
    log = tmp_path / "dispatch.jsonl"
    proc = _run(llama, log, *BACKENDS, "--tp", "2", SGLANG_CPU_OMP_THREADS_BIND="0|1")
    result = _result(proc)["backends"]
    for scenario in SCENARIOS:
        assert result["sglang_fl"][scenario] == result["torch_native"][scenario], scenario
    ranks = {r["proctitle"] for r in _attention_rows(log)}
    assert ranks == {"sglang::scheduler_TP0", "sglang::scheduler_TP1"}
    for rank in ranks:
        served = {(r["layer_id"], r["op"]) for r in _attention_rows(log) if r["proctitle"] == rank}
        assert served == {(i, op) for i in range(NUM_LAYERS) for op in ATTENTION_OPS}


def test_unknown_backend_name_gets_sglangs_own_error(tmp_path: Path) -> None:
    """SGLang's argument parser refuses the name and lists its choices, ``sglang_fl`` among
    them (the plugins load before the arguments are parsed)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(tmp_path),
            "--attention-backend",
            "sglang_fll",
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT_S,
    )
    assert proc.returncode != 0
    assert "invalid choice: 'sglang_fll'" in proc.stderr, proc.stderr[-3000:]
    assert "'sglang_fl'" in proc.stderr


@pytest.fixture(scope="module")
def decline_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return decline_vendor_site(tmp_path_factory.mktemp("decline"))


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("llama") / "model", "llama")


def test_a_declining_vendor_kernel_falls_back_and_the_report_says_why(
    decline_site: Path, llama: Path, tmp_path: Path
) -> None:
    log = tmp_path / "dispatch.jsonl"
    declined = _result(_run(llama, log, "sglang_fl", PYTHONPATH=_path(decline_site)))
    native = _NATIVE.get("llama")
    if native is None:  # run alone (-k): one more engine
        native = _result(_run(llama, tmp_path / "native.jsonl", "torch_native"))["backends"]
        native = native["torch_native"]
    for scenario in SCENARIOS:
        assert declined["backends"]["sglang_fl"][scenario] == native[scenario], scenario
    rows = _attention_rows(log)
    decode = [r for r in rows if r["op"] == "decode_attention"]
    assert {r["impl_id"] for r in decode} == {DECLINE_IMPL_ID}  # chosen: it ranks first
    assert all(r["fallbacks"] == ["reference.decode_attention"] for r in decode)
    fallbacks = [r for r in read_log(log) if r["event"] == "fallback"]
    assert fallbacks, "the decline was not reported"
    assert {(r["op"], r["impl_id"], r["next_impl_id"], r["reason"]) for r in fallbacks} == {
        ("decode_attention", DECLINE_IMPL_ID, "reference.decode_attention", DECLINE_REASON)
    }


def test_strict_mode_makes_a_decline_an_error_naming_op_and_impl(
    decline_site: Path, llama: Path, tmp_path: Path
) -> None:
    proc = _run(
        llama,
        tmp_path / "dispatch.jsonl",
        "sglang_fl",
        PYTHONPATH=_path(decline_site),
        SGLANG_FL_STRICT="1",
    )
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "StrictModeError" in text, text[-4000:]
    assert f"{DECLINE_IMPL_ID} declined a call of decode_attention" in text
    assert DECLINE_REASON in text


def _path(site: Path) -> str:
    import os

    return os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
