"""A real chat model (SmolLM2-135M-Instruct) through SGLang and sglang-fl on the CPU.

Accuracy: in float32 SGLang's greedy answers are token for token transformers'; in bfloat16
they are token for token those of SGLang's own ``forward_native`` paths
(``SGLANG_FORCE_FUSED_OP_BACKEND=torch``). Serving: SGLang's own ``launch_server`` answers the
real ``openai`` client, plainly and streamed. Every run checks from the dispatch log that the
scheduler process routed the standard layers through sglang-fl. Engine start-up dominates the
cost on 2 cores, so one engine per configuration serves all questions: a float32 server (token
ids through SGLang's native ``/generate``, chat through the OpenAI API) and two bfloat16
engines.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from real_model import chat_input_ids, end_of_turn_ids, hf_greedy_chat, until_end_of_turn
from sglang_processes import (
    STANDARD_LAYERS,
    Server,
    clean_env,
    launch_server,
    post_json,
    run_engine,
    scheduler_layers,
)

from sglang_fl.dispatch_report import read_log

pytest.importorskip("sglang")
# The first test also prepares the model (a 93 MB download and a conversion, on a clean clone)
# and runs two engines: above nox's 900 s per-test limit on a busy 2-core machine.
pytestmark = pytest.mark.timeout(1800)

# The first question's answer is checked by content too (it names Paris).
QUESTIONS = [
    "What is the capital of France?",
    "Name the three primary colors.",
    "Write one sentence about the sea.",
]
MAX_NEW_TOKENS = 24


ATTENTION_OPS = ("store_kv_cache", "decode_attention", "extend_attention")


def assert_scheduler_routed(log: Path, main_pid: int) -> None:
    """The scheduler process ran every standard layer through sglang-fl, and its attention
    layers' ops through sglang-fl's attention backend (the default on its platform)."""
    layers = scheduler_layers(read_log(log), main_pid)
    for op_name, layer in STANDARD_LAYERS.items():
        row = layers.get(layer)
        assert row is not None, f"the scheduler never resolved {layer}: {sorted(layers)}"
        assert (row["runner"], row["op"]) == ("sglang-fl", op_name), row
    radix = "sglang.srt.layers.radix_attention.RadixAttention"
    for op_name in ATTENTION_OPS:
        row = layers.get(f"{radix}[{op_name}]")
        assert row is not None, f"the scheduler's attention never ran {op_name}: {sorted(layers)}"
        assert (row["runner"], row["impl_id"]) == ("sglang-fl", f"reference.{op_name}"), row


def chat_engine(model: Path, log: Path, dtype: str, **env: str) -> dict[str, Any]:
    """All ``QUESTIONS`` answered by one engine subprocess, logging its dispatch to ``log``."""
    return run_engine(
        model,
        MAX_NEW_TOKENS,
        QUESTIONS,
        clean_env(SGLANG_FL_DISPATCH_LOG=str(log), **env),
        "--chat",
        "--dtype",
        dtype,
    )


@pytest.fixture(scope="module")
def stops(real_model: Path) -> set[int]:
    return end_of_turn_ids(real_model)


@pytest.fixture(scope="module")
def transformers_answers(real_model: Path) -> list[list[int]]:
    """transformers' float32 greedy answers to ``QUESTIONS``: the ground truth."""
    return hf_greedy_chat(real_model, chat_input_ids(real_model, QUESTIONS), MAX_NEW_TOKENS)


def test_bfloat16_answers_are_those_of_sglang_forward_native(
    real_model: Path, stops: set[int], tmp_path: Path
) -> None:
    routed_log, native_log = tmp_path / "routed.jsonl", tmp_path / "native.jsonl"
    routed = chat_engine(real_model, routed_log, "bfloat16")
    native = chat_engine(real_model, native_log, "bfloat16", SGLANG_FORCE_FUSED_OP_BACKEND="torch")
    assert all(until_end_of_turn(ids, stops) for ids in routed["output_ids"])
    assert routed["output_ids"] == native["output_ids"]
    assert_scheduler_routed(routed_log, routed["pid"])
    native_rows = read_log(native_log)
    assert [r for r in native_rows if r["event"] == "plugin"], "the plugin still loads"
    # The switch forces fused ops; the attention backend is another choice (still sglang_fl).
    fused = [r for r in native_rows if r["event"] == "layer" and not r.get("attention_backend")]
    assert not [r for r in fused if r["runner"] == "sglang-fl"], (
        "SGLang's forced backend wins over sglang-fl's route"
    )


@pytest.fixture(scope="module")
def float32_server(
    real_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, Path]]:
    """SGLang's own server on the real model in float32, and its dispatch log.

    The tests using it come last in this module: an idle SGLang scheduler polls, and it would
    take CPU from the bfloat16 engines while it stays up until the module ends.
    """
    workdir = tmp_path_factory.mktemp("float32-server")
    log = workdir / "dispatch.jsonl"
    with launch_server(real_model, workdir, clean_env(SGLANG_FL_DISPATCH_LOG=str(log))) as server:
        yield server, log


def test_float32_answers_are_transformers_greedy_answers(
    real_model: Path,
    transformers_answers: list[list[int]],
    stops: set[int],
    float32_server: tuple[Server, Path],
) -> None:
    server, log = float32_server
    sampling = {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS}
    body = {"input_ids": chat_input_ids(real_model, QUESTIONS), "sampling_params": sampling}
    outputs = post_json(f"{server.base_url}/generate", body)
    got = [until_end_of_turn(out["output_ids"], stops) for out in outputs]
    want = [until_end_of_turn(ids, stops) for ids in transformers_answers]
    assert all(want), f"transformers gave an empty answer: {transformers_answers}"
    assert got == want
    assert "Paris" in outputs[0]["text"]
    assert_scheduler_routed(log, server.proc.pid)


def test_openai_client_chats_with_sglang_server(
    real_model: Path,
    transformers_answers: list[list[int]],
    stops: set[int],
    float32_server: tuple[Server, Path],
) -> None:
    from openai import OpenAI
    from transformers import AutoTokenizer

    expected = AutoTokenizer.from_pretrained(real_model).decode(
        until_end_of_turn(transformers_answers[0], stops), skip_special_tokens=True
    )
    server, log = float32_server
    client = OpenAI(base_url=f"{server.base_url}/v1", api_key="none", timeout=300, max_retries=0)
    request: dict[str, Any] = {
        "model": "default",  # SGLang serves one model whatever the name
        "messages": [{"role": "user", "content": QUESTIONS[0]}],
        "temperature": 0,
        "max_tokens": MAX_NEW_TOKENS,
    }
    reply = client.chat.completions.create(**request)
    answer = reply.choices[0].message.content
    chunks = [
        chunk.choices[0].delta.content
        for chunk in client.chat.completions.create(**request, stream=True)
        if chunk.choices and chunk.choices[0].delta.content
    ]
    assert answer is not None
    assert "Paris" in answer
    assert answer.strip() == expected.strip(), "the server answers what transformers answers"
    assert len(chunks) > 1, f"the answer came in one piece, not streamed: {chunks}"
    assert "".join(chunks) == answer
    assert_scheduler_routed(log, server.proc.pid)
