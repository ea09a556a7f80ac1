"""SGLang's ``sglang_fl`` attention backend end to end: transformers' tokens, and why.

On the shared engines of the tiny Llama and Qwen3 (``configurations.py``), the scenarios of
``attention_scenarios.py`` (short prompts, a prompt spanning several prefill chunks, requests
sharing a long prefix that hit the radix cache) must give exactly transformers' greedy tokens,
and the scheduler's dispatch report must name the implementation of each op in every attention
layer. Gemma-3's 8-token sliding window is the subtle translation: there SGLang's own run
(``torch_native`` attention, ``forward_native`` layers) is the oracle. TP=2 gives each rank its
own kernels for its heads. An unknown backend name gets SGLang's own error. What happens when a
kernel declines (the next candidate serves, or ``SGLANG_FL_STRICT=1`` makes it an error) is
tested on SGLang's real pools without an engine (``test_attention_selection.py``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from attention_scenarios import SCENARIOS, run_scenarios, transformers_scenarios
from configurations import CHUNK, GEMMA3, GEMMA3_SGLANG, LLAMA, LLAMA_TP2, QWEN3
from engines import Engine, EngineSpec
from sglang_processes import ENGINE_TIMEOUT_S, clean_env

pytest.importorskip("sglang")

ATTENTION_OPS = ("store_kv_cache", "decode_attention", "extend_attention")
NUM_LAYERS = 2
# Scenario results per engine spec: the Gemma-3 comparison needs both of its engines' runs.
# Scenario results per running engine (spec, scheduler's parent pid): an engine the pool
# restarted (another spec ran in between) runs them again, so its report has the records.
_RUNS: dict[tuple[EngineSpec, int], dict[str, Any]] = {}


def scenarios_of(engine: Engine) -> dict[str, Any]:
    key = (engine.spec, engine.pid)
    if key not in _RUNS:
        _RUNS[key] = run_scenarios(engine)
    return _RUNS[key]


def attention_rows(engine: Engine) -> list[dict[str, Any]]:
    """The attention backend's layer records, from the scheduler process(es) only."""
    return [
        r
        for r in engine.records()
        if r["event"] == "layer"
        and r.get("attention_backend") == "sglang_fl"
        and str(r.get("proctitle") or "").startswith("sglang::scheduler")
    ]


def assert_real_scenarios(ours: dict[str, Any]) -> None:
    """The long prompt really spans several chunks; the shared prefix really hit the cache."""
    assert ours["long_prompt_tokens"] > 3 * CHUNK
    assert ours["shared_cached_tokens"][0] == 0
    assert all(cached >= 2 * CHUNK for cached in ours["shared_cached_tokens"][1:])
    for scenario in SCENARIOS:
        assert all(len(ids) > 0 for ids in ours[scenario])


@pytest.mark.parametrize("engine", [LLAMA, QWEN3], indirect=True, ids=["llama", "qwen3"])
def test_sglang_fl_gives_transformers_tokens(engine: Engine, oracle) -> None:
    ours = scenarios_of(engine)
    want = transformers_scenarios(oracle, engine.spec.model)
    for scenario in SCENARIOS:
        assert ours[scenario] == want[scenario], f"{engine.spec.id}: {scenario} prompts differ"
    assert_real_scenarios(ours)


@pytest.mark.engine(GEMMA3_SGLANG)
def test_gemma3_sglangs_own_run(engine: Engine) -> None:
    """SGLang's own paths on Gemma-3: the oracle of the routed run, and nothing routed."""
    scenarios_of(engine)
    rows = engine.records()
    assert [r for r in rows if r["event"] == "plugin"], "the plugin still loads"
    routed = [r for r in rows if r["event"] == "layer" and r["runner"] == "sglang-fl"]
    assert routed == [], "SGLang's forced backend and torch_native win over sglang-fl's route"


@pytest.mark.engine(GEMMA3, also=(GEMMA3_SGLANG,))
def test_sglang_fl_gives_sglangs_own_tokens_with_a_sliding_window(
    engine: Engine, engine_pool: Any
) -> None:
    ours = scenarios_of(engine)
    earlier = [runs for (spec, _), runs in _RUNS.items() if spec == GEMMA3_SGLANG]
    own = earlier[0] if earlier else scenarios_of(engine_pool.get(GEMMA3_SGLANG))
    for scenario in SCENARIOS:
        assert ours[scenario] == own[scenario], f"gemma3: {scenario} prompts differ"
    assert_real_scenarios(ours)


@pytest.mark.parametrize(
    "engine", [LLAMA, QWEN3, GEMMA3], indirect=True, ids=["llama", "qwen3", "gemma3"]
)
def test_report_names_the_kernels_of_every_attention_layer(engine: Engine) -> None:
    scenarios_of(engine)
    rows = attention_rows(engine)
    served = {(r["layer_id"], r["op"]): r for r in rows}
    assert len(served) == len(rows), f"{engine.spec.id}: more than one record per layer and op"
    assert set(served) == {(i, op) for i in range(NUM_LAYERS) for op in ATTENTION_OPS}
    for (_, op), row in served.items():
        assert (row["runner"], row["impl_id"]) == ("sglang-fl", f"reference.{op}"), row
        assert row["layer"] == f"sglang.srt.layers.radix_attention.RadixAttention[{op}]"
        assert isinstance(row["pid"], int)
    handoffs = [
        r for r in engine.records() if r["event"] == "handoff" and r.get("attention_backend")
    ]
    assert handoffs == []


@pytest.mark.engine(LLAMA_TP2)
def test_tensor_parallel_ranks_give_transformers_tokens(engine: Engine, oracle) -> None:
    """TP=2 on the CPU (one NUMA node, a core per rank): each rank's backend binds its own
    kernels for its heads, and the tokens are transformers'."""
    ours = scenarios_of(engine)
    want = transformers_scenarios(oracle, "llama")
    for scenario in SCENARIOS:
        assert ours[scenario] == want[scenario], scenario
    rows = attention_rows(engine)
    ranks = {r["proctitle"] for r in rows}
    assert ranks == {"sglang::scheduler_TP0", "sglang::scheduler_TP1"}
    for rank in ranks:
        served = {(r["layer_id"], r["op"]) for r in rows if r["proctitle"] == rank}
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
