"""``check_state_indices``: the pooled-state index check shared by the GDN references and the
vendor adapters (``sglang_fl.ops.linear_attention``)."""

from __future__ import annotations

import pytest
import torch

from sglang_fl import Unsupported
from sglang_fl.ops import OpContract
from sglang_fl.ops.linear_attention import LINEAR_ATTENTION_OPS, PAD_SLOT_ID, check_state_indices


@pytest.mark.parametrize(
    "indices",
    [
        torch.tensor([0, 3, 1], dtype=torch.int32),
        torch.tensor([[2, 0], [1, 3]]),  # any shape: every element is an index
        torch.tensor([], dtype=torch.int64),
        torch.tensor([PAD_SLOT_ID, 2]),  # padding allowed by default
    ],
)
def test_indices_inside_the_pool_pass(indices: torch.Tensor) -> None:
    check_state_indices("op", indices, 4)


@pytest.mark.parametrize(
    ("indices", "pad", "value", "position", "allowed"),
    [
        (torch.tensor([0, 4, 9]), PAD_SLOT_ID, 4, 1, "0..3, or -1 for a padding row"),
        (torch.tensor([1, -2]), PAD_SLOT_ID, -2, 1, "0..3, or -1 for a padding row"),
        (torch.tensor([-1, 0]), None, -1, 0, "0..3)"),
        (torch.tensor([3, -5], dtype=torch.int32), 9, -5, 1, "0..3, or 9 for a padding row"),
    ],
)
def test_the_first_index_outside_is_named_with_what_is_allowed(
    indices: torch.Tensor, pad: int | None, value: int, position: int, allowed: str
) -> None:
    with pytest.raises(IndexError) as info:
        check_state_indices("my_op", indices, 4, pad_slot_id=pad)
    assert str(info.value).startswith(
        f"my_op: state index {value} at position {position} is outside the state pool of 4 slots"
    )
    assert f"(allowed: {allowed}" in str(info.value)


def test_the_caller_names_its_padding_value() -> None:
    check_state_indices("op", torch.tensor([[0, 1], [2, 7]]), 4, pad_slot_id=7)


def test_the_caller_chooses_the_exception_and_adds_the_consequence() -> None:
    with pytest.raises(Unsupported, match=r"outside the state pool of 2 slots .*; would write"):
        check_state_indices("op", torch.tensor([2]), 2, error=Unsupported, why="would write past")


def test_an_empty_pool_allows_only_padding() -> None:
    check_state_indices("op", torch.tensor([PAD_SLOT_ID]), 0)
    with pytest.raises(IndexError, match=r"allowed: none \(the pool is empty\)"):
        check_state_indices("op", torch.tensor([0]), 0)


def test_one_verdict_is_read_not_one_value_per_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """Vectorised: a valid batch costs one host read (``bool`` of the reduction), never a
    ``tolist`` or ``item`` per element."""
    reads: list[str] = []
    real_bool, real_tolist = torch.Tensor.__bool__, torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "__bool__", lambda t: reads.append("bool") or real_bool(t))
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append("tolist") or real_tolist(t))
    check_state_indices("op", torch.arange(4096) % 64, 64)
    assert reads == ["bool"]


@pytest.mark.parametrize("contract", LINEAR_ATTENTION_OPS, ids=lambda c: c.name)
def test_every_case_gives_its_live_rows_distinct_slots(contract: OpContract) -> None:
    """Kernels run a batch's rows at once: two live rows on one slot would race, so no case
    asks for it (SGLang gives each request its own slot)."""
    names = list(contract.signature.parameters)[1:]  # after obj
    for case in contract.cases:
        inputs = contract.make_inputs(
            case, torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0)
        )
        arguments = {**dict(zip(names, inputs.args, strict=False)), **inputs.kwargs}
        for name, value in arguments.items():
            if name.endswith("indices") and isinstance(value, torch.Tensor):
                live = [i for i in value.reshape(-1).tolist() if i != PAD_SLOT_ID]
                assert len(set(live)) == len(live), f"{case.name}: {name} {live}"
