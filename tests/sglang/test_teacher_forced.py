"""The teacher-forced check of greedy answers (``teacher_forced.py``), in process, no engine.

First on logits made by hand (what passes and fails and why, at the bound, answers of another
length), then through transformers on the tiny Llama, with transformers' own top tokens standing
in for an engine's: its greedy answer, that answer with a token transformers ranks last planted
in it, and one that takes a near-tie's runner-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from real_model import greedy_with_logits, load_float32
from teacher_forced import (
    TIE_LOGITS,
    TOP_K,
    Answer,
    Breach,
    Check,
    Generated,
    SelfDisagreement,
    Verdict,
    check_answers,
    forced_logits,
    judge,
    token_decoder,
    top_ids,
    top_two_shift,
)

STOP = 0
STOPS = {STOP}
VOCAB = 16


def logits(*rows: dict[int, float]) -> torch.Tensor:
    """One row per decision: the logits of the tokens given, 0 for every other token."""
    out = torch.zeros(len(rows), VOCAB)
    for row, given in zip(out, rows, strict=True):
        for token, logit in given.items():
            row[token] = logit
    return out


EXPECTED = Answer((3, 4, 5), ended=True)  # the greedy answer of TOPS
TOPS = ({3: 10.0}, {4: 10.0}, {5: 10.0}, {STOP: 10.0})


def test_identical_answer_passes() -> None:
    rows = logits(*TOPS)
    judged = judge(EXPECTED, EXPECTED, rows, top_ids(rows), STOPS)
    assert (judged.verdict, judged.passed, judged.prefix, judged.off_top) == (
        Verdict.IDENTICAL,
        True,
        3,
        (),
    )


@pytest.mark.parametrize(
    ("gap", "verdict"),
    [
        (0.1 * TIE_LOGITS, Verdict.NEAR_TIES),
        (TIE_LOGITS, Verdict.NEAR_TIES),
        (1.01 * TIE_LOGITS, Verdict.DIVERGED),
        (2 * TIE_LOGITS, Verdict.DIVERGED),
    ],
)
def test_a_runner_up_passes_within_the_tie_bound_only(gap: float, verdict: Verdict) -> None:
    """Position 1 takes transformers' runner-up (6); the rest follows from the answer's own
    prefix (teacher-forced), where it is transformers' top again."""
    answer = Answer((3, 6, 5), ended=True)
    rows = logits(TOPS[0], {4: 10.0, 6: 10.0 - gap}, *TOPS[2:])
    judged = judge(answer, EXPECTED, rows, top_ids(rows), STOPS)
    assert (judged.verdict, judged.passed, judged.prefix) == (
        verdict,
        verdict is Verdict.NEAR_TIES,
        1,
    )
    [found] = judged.off_top
    assert (found.position, found.token, found.top, found.rank) == (1, 6, 4, 2)
    assert found.margin == pytest.approx(gap)
    assert found.breaches(TIE_LOGITS) == (() if judged.passed else (Breach.FAR,))


# Position 1's token 6 half a logit below the top; (row, the engine's own top tokens there).
NOT_AMONG_TRANSFORMERS_TOP = ({4: 10.0, **dict.fromkeys(range(7, 7 + TOP_K), 9.8), 6: 9.5}, None)
TOP_NOT_AMONG_THE_ENGINES = ({4: 10.0, 6: 9.5}, [6, *range(7, 7 + TOP_K - 1)])


@pytest.mark.parametrize(
    ("position_1", "breach"),
    [
        (NOT_AMONG_TRANSFORMERS_TOP, Breach.UNRANKED),
        (TOP_NOT_AMONG_THE_ENGINES, Breach.TOP_UNRANKED),
    ],
)
def test_a_near_tie_fails_vllms_rule_of_top_tokens(
    position_1: tuple[dict[int, float], list[int] | None], breach: Breach
) -> None:
    """Within the tie bound, but the token is not among transformers' top TOP_K, or
    transformers' top is not among the engine's own top TOP_K."""
    row, engine_row = position_1
    rows = logits(TOPS[0], row, *TOPS[2:])
    engine_top = top_ids(rows)
    if engine_row is not None:
        engine_top[1] = engine_row
    judged = judge(Answer((3, 6, 5), ended=True), EXPECTED, rows, engine_top, STOPS)
    assert judged.verdict is Verdict.DIVERGED
    assert [(o.position, o.breaches(TIE_LOGITS)) for o in judged.breached] == [(1, (breach,))]


def test_where_transformers_own_forward_agrees_with_the_answer_it_passes() -> None:
    """The answer parts from transformers' greedy (cached) answer at position 1, where
    transformers' full forward ranks the answer's token top: the demo's first question."""
    answer = Answer((3, 6, 5), ended=True)
    rows = logits(TOPS[0], {4: 9.8, 6: 10.0}, *TOPS[2:])
    judged = judge(answer, EXPECTED, rows, top_ids(rows), STOPS)
    assert (judged.verdict, judged.prefix, judged.off_top) == (Verdict.NEAR_TIES, 1, ())
    report = Check(judged, SelfDisagreement(0.0, ())).report(0, str)
    assert report[0] == (
        "question 0: differs from transformers' greedy tokens only at near-ties; exact prefix "
        "1/3 tokens (transformers' answer: 3)"
    )
    assert report[1].startswith("   at position 1, where the answers part, the answer's token")


def test_every_position_is_judged_not_only_the_first_difference() -> None:
    """A near-tie at position 0, then a token far below the top at position 2: vLLM's check
    stops at position 0, where the two answers part."""
    answer = Answer((6, 4, 7), ended=True)
    rows = logits({3: 10.0, 6: 9.5}, TOPS[1], {5: 10.0, 7: 10.0 - 2 * TIE_LOGITS}, TOPS[3])
    judged = judge(answer, EXPECTED, rows, top_ids(rows), STOPS)
    assert judged.verdict is Verdict.DIVERGED
    assert [o.position for o in judged.off_top] == [0, 2]
    assert [o.position for o in judged.breached] == [2]


@pytest.mark.parametrize(
    ("ids", "max_new_tokens", "answer"),
    [
        ([3, 4, STOP, 5], 16, Answer((3, 4), ended=True)),  # the end of turn reported
        ([3, 4], 16, Answer((3, 4), ended=True)),  # or left out
        ([3, 4], 2, Answer((3, 4), ended=False)),  # out of tokens
        ([STOP], 16, Answer((), ended=True)),
    ],
)
def test_an_answer_is_what_was_said_until_the_end_of_turn(
    ids: list[int], max_new_tokens: int, answer: Answer
) -> None:
    assert Answer.of(ids, STOPS, max_new_tokens) == answer


@pytest.mark.parametrize(
    ("answer", "rows", "found", "verdict"),
    [
        pytest.param(
            Answer((3, 4), ended=True),
            (*TOPS[:2], {5: 10.0, STOP: 10.0 - 0.5 * TIE_LOGITS}),
            (2, STOP, 5, 0.5 * TIE_LOGITS),
            Verdict.NEAR_TIES,
            id="ends-early-at-a-near-tie",
        ),
        pytest.param(
            Answer((3, 4), ended=True),
            (*TOPS[:2], {5: 10.0, STOP: 10.0 - 2 * TIE_LOGITS}),
            (2, STOP, 5, 2 * TIE_LOGITS),
            Verdict.DIVERGED,
            id="ends-early-far-below-the-top",
        ),
        pytest.param(
            Answer((), ended=True),
            ({3: 10.0, STOP: 10.0 - 2 * TIE_LOGITS},),
            (0, STOP, 3, 2 * TIE_LOGITS),
            Verdict.DIVERGED,
            id="empty",
        ),
        pytest.param(
            Answer((3, 4, 5, 7), ended=False),
            (*TOPS[:3], {STOP: 10.0, 7: 10.0 - 2 * TIE_LOGITS}),
            (3, 7, STOP, 2 * TIE_LOGITS),
            Verdict.DIVERGED,
            id="goes-on-past-the-end-of-turn",
        ),
    ],
)
def test_answers_of_another_length_are_judged_on_their_end_of_turn(
    answer: Answer,
    rows: tuple[dict[int, float], ...],
    found: tuple[int, int, int, float],
    verdict: Verdict,
) -> None:
    forced = logits(*rows)
    judged = judge(answer, EXPECTED, forced, top_ids(forced), STOPS)
    assert judged.verdict is verdict
    assert [(o.position, o.token, o.top, o.margin) for o in judged.off_top] == [found]


def test_logits_and_the_engines_tops_must_cover_every_decision() -> None:
    rows = logits(*TOPS)
    with pytest.raises(ValueError, match="3 rows of logits and 4 of the engine's top tokens"):
        judge(EXPECTED, EXPECTED, rows[:3], top_ids(rows), STOPS)
    with pytest.raises(ValueError, match="4 rows of logits and 3 of the engine's top tokens"):
        judge(EXPECTED, EXPECTED, rows, top_ids(rows)[:3], STOPS)


def test_sglangs_output_gives_its_ids_and_top_tokens() -> None:
    """``Engine.generate``'s output with ``return_logprob`` and ``top_logprobs_num``."""
    output = {
        "output_ids": [5, STOP],
        "meta_info": {
            "output_top_logprobs": [
                [[-0.1, 5, None], [-2.5, 7, None]],
                [[-0.2, STOP, None], [-1.9, 9, None]],
            ]
        },
    }
    assert Generated.from_sglang(output) == Generated([5, STOP], [[5, 7], [STOP, 9]])


def test_top_two_shift_measures_what_decides_a_near_tie() -> None:
    a = logits({3: 10.0, 4: 9.5, 5: 2.0})
    assert top_two_shift(a, a + 7.0) == 0.0  # every logit alike: no margin moves
    assert top_two_shift(a, logits({3: 10.0, 4: 9.5, 5: 7.0})) == 0.0  # far from the top
    assert top_two_shift(a, logits({3: 10.0, 4: 10.2, 5: 2.0})) == pytest.approx(0.7)


# --- through transformers, on the tiny Llama -------------------------------------------------

MAX_NEW_TOKENS = 16
PROMPTS = ["def main():", "import os\n", "class Point:"]


@pytest.fixture(scope="module")
def llama(models: dict[str, Path]) -> Path:
    return models["llama"]


@pytest.fixture(scope="module")
def model(llama: Path) -> Any:
    return load_float32(llama)


@pytest.fixture(scope="module")
def prompts(llama: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(llama)
    return [tokenizer(prompt).input_ids for prompt in PROMPTS]


@pytest.fixture(scope="module")
def greedy(model: Any, prompts: list[list[int]]) -> list[list[int]]:
    """transformers' greedy answers, each ``MAX_NEW_TOKENS`` long (checked: no end of turn)."""
    answers = [greedy_with_logits(model, prompt, MAX_NEW_TOKENS)[0] for prompt in prompts]
    assert [len(a) for a in answers] == [MAX_NEW_TOKENS] * len(PROMPTS), answers
    return answers


def as_engine(model: Any, prompt: list[int], ids: list[int]) -> Generated:
    """``ids`` as an engine's output whose own top tokens are transformers' over them."""
    forced = forced_logits(model, prompt, Answer(tuple(ids), ended=False))
    return Generated(ids, top_ids(forced))


def test_transformers_own_answers_are_identical(
    llama: Path, model: Any, prompts: list[list[int]], greedy: list[list[int]]
) -> None:
    outputs = [as_engine(model, p, ids) for p, ids in zip(prompts, greedy, strict=True)]
    checks = check_answers(llama, prompts, outputs, MAX_NEW_TOKENS)
    assert [c.judgement.verdict for c in checks] == [Verdict.IDENTICAL] * len(PROMPTS)
    # float32 without quantization: the cached and the full forward agree but for rounding
    assert max(c.itself.top_two_shift for c in checks) < 1e-3
    assert [c.failure(i, str) for i, c in enumerate(checks)] == [None] * len(PROMPTS)


def test_a_token_far_below_the_top_fails_naming_it(
    llama: Path, model: Any, prompts: list[list[int]], greedy: list[list[int]]
) -> None:
    """Position 3 of the first answer replaced by the token transformers ranks last there."""
    last = int(forced_logits(model, prompts[0], Answer(tuple(greedy[0]), False))[3].argmin())
    planted = [*greedy[0][:3], last, *greedy[0][4:]]
    (check,) = check_answers(
        llama, prompts[:1], [as_engine(model, prompts[0], planted)], MAX_NEW_TOKENS
    )
    first = check.judgement.breached[0]
    assert (check.judgement.verdict, first.position, first.token) == (Verdict.DIVERGED, 3, last)
    assert first.margin > 2 * TIE_LOGITS
    assert first.breaches(TIE_LOGITS) == (Breach.FAR, Breach.UNRANKED)
    decode = token_decoder(llama)
    failure = check.failure(0, decode)
    assert failure is not None
    assert failure.startswith(
        f"question 0, position 3: {decode(last)} where transformers' top is "
        f"{decode(greedy[0][3])}, {first.margin:.2f} logits above it"
    )
    assert f"{Breach.FAR.value}; {Breach.UNRANKED.value} (tie bound {TIE_LOGITS:.2f})" in failure


def test_a_near_ties_runner_up_passes(
    llama: Path, model: Any, prompts: list[list[int]], greedy: list[list[int]]
) -> None:
    """The narrowest top two over these answers: the runner-up taken there, transformers
    continuing greedily from it, is what a kernel that flipped that near-tie answers."""
    gaps = []
    for index, (prompt, ids) in enumerate(zip(prompts, greedy, strict=True)):
        top_two = forced_logits(model, prompt, Answer(tuple(ids), ended=False)).topk(2)
        for position, (values, tokens) in enumerate(zip(*top_two, strict=True)):
            gaps.append((float(values[0] - values[1]), index, position, int(tokens[1])))
    gap, index, position, runner_up = min(gaps)
    assert gap <= TIE_LOGITS, f"no near-tie in the tiny model's answers: the narrowest is {gap}"
    prefix = [*greedy[index][:position], runner_up]
    rest, _ = greedy_with_logits(model, [*prompts[index], *prefix], MAX_NEW_TOKENS)
    flipped = as_engine(model, prompts[index], [*prefix, *rest][:MAX_NEW_TOKENS])
    (check,) = check_answers(llama, prompts[index : index + 1], [flipped], MAX_NEW_TOKENS)
    judged = check.judgement
    assert (judged.verdict, judged.prefix) == (Verdict.NEAR_TIES, position)
    assert [(o.position, o.token) for o in judged.off_top] == [(position, runner_up)]
    assert judged.off_top[0].margin == pytest.approx(gap, abs=1e-4)
    decode = token_decoder(llama)
    report = check.report(index, decode)
    assert f"exact prefix {position}/{MAX_NEW_TOKENS} tokens" in report[0]
    assert report[1] == f"   off transformers' top at {judged.off_top[0].describe(decode)}"
    assert report[-1].startswith("   transformers against itself (cached generate vs one full")
