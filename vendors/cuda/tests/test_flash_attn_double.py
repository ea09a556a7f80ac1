"""The ``sgl_kernel.flash_attn`` double rejects what FlashAttention-3 rejects, one constraint at a
time (sources in ``flash_attn_double.py``), and computes FlashAttention's documented masks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from flash_attn_double import FlashAttnDouble

from sglang_fl.testing.doubles import constraint_tests

D = FlashAttnDouble
Call = Callable[[FlashAttnDouble], object]


def fa(**parts: Any) -> Call:
    """A valid paged varlen call (2 requests of 3 and 6 tokens, 1 and 2 new; 4 q heads over 2
    kv heads, head size 64, pages of 4) with ``parts`` replaced."""
    g = torch.Generator().manual_seed(0)
    args: dict[str, Any] = {
        "q": torch.randn(3, 4, 64, generator=g).half(),
        "k_cache": torch.randn(6, 4, 2, 64, generator=g).half(),
        "v_cache": torch.randn(6, 4, 2, 64, generator=g).half(),
        "page_table": torch.tensor([[5, 0], [2, 3]], dtype=torch.int32),
        "cache_seqlens": torch.tensor([3, 6], dtype=torch.int32),
        "cu_seqlens_q": torch.tensor([0, 1, 3], dtype=torch.int32),
        "max_seqlen_q": 2,
        "softmax_scale": 0.125,
        "causal": True,
    }
    args.update(parts)
    return lambda sdk: sdk.flash_attn_with_kvcache(**args)


def on(capability: tuple[int, int], call: Call, cuda: str = "12.4") -> Call:
    """``call`` on a double emulating another GPU (or toolkit)."""

    def run(sdk: FlashAttnDouble) -> object:
        sdk.capability, sdk.cuda = capability, cuda
        return call(sdk)

    return run


def heads(d: int, dv: int, pages: int = 6) -> dict[str, torch.Tensor]:
    return {
        "q": torch.randn(3, 4, d).half(),
        "k_cache": torch.randn(pages, 4, 2, d).half(),
        "v_cache": torch.randn(pages, 4, 2, dv).half(),
    }


VALID: list[Call] = [
    fa(),
    on((8, 0), fa()),  # A100: is_fa3_supported holds for 8.x
    on((8, 9), fa()),  # L40S
    fa(**heads(192, 128)),  # FA3's DeepSeek pair, on Hopper
    fa(**heads(64, 512)),
    fa(**heads(256, 256)),
    fa(
        q=torch.randn(3, 4, 64).bfloat16(),
        k_cache=torch.randn(6, 4, 2, 64).bfloat16(),
        v_cache=torch.randn(6, 4, 2, 64).bfloat16(),
    ),
    fa(window_size=(2, 0), softcap=30.0),
    fa(q=torch.randn(3, 8, 64).half()[:, ::2]),  # strided heads: the kernel takes row strides
]
REJECTED: dict[Any, Call] = {
    D.FA3_DEVICE: on((10, 0), fa()),  # B200: no FA3 kernel image
    D.DTYPE: fa(q=torch.randn(3, 4, 64)),
    D.LAST_DIM: fa(k_cache=torch.randn(6, 4, 2, 128).half()[..., ::2]),
    D.PAGED_SHAPES: fa(k_cache=torch.randn(24, 2, 64).half()),
    D.PAGE_TABLE: fa(page_table=torch.tensor([[5, 0], [2, 3]], dtype=torch.int64)),
    D.PAGES_COVER: fa(page_table=torch.tensor([[5], [2]], dtype=torch.int32)),
    D.VARLEN_Q: fa(cu_seqlens_q=torch.tensor([0, 1, 3], dtype=torch.int64)),
    D.CACHE_SEQLENS: fa(cache_seqlens=torch.tensor([3, 6])),
    D.HEAD_DIM: fa(**heads(320, 320)),
    D.V_HEAD_DIM: fa(**heads(96, 64)),
    D.V_HEAD_DIM_HOPPER: on((8, 0), fa(**heads(192, 128))),
    D.GQA: fa(k_cache=torch.randn(6, 4, 3, 64).half(), v_cache=torch.randn(6, 4, 3, 64).half()),
}

test_valid_calls_pass, test_rejects_what_fa3_rejects, test_every_constraint_is_covered = (
    constraint_tests(FlashAttnDouble, VALID, REJECTED)
)


@pytest.mark.parametrize(
    ("capability", "cuda", "supported"),
    [
        ((9, 0), "12.4", True),
        ((8, 6), "12.3", True),
        ((12, 0), "12.8", False),  # RTX 5090 / RTX PRO 6000: Blackwell, no FA3 kernel
        ((10, 0), "12.8", False),
        ((7, 5), "12.4", False),
        ((9, 0), "12.2", False),
    ],
)
def test_is_fa3_supported_answers_as_sgl_kernel_does(
    capability: tuple[int, int], cuda: str, supported: bool
) -> None:
    assert FlashAttnDouble(capability=capability, cuda=cuda).is_fa3_supported() is supported


def test_a_different_v_head_dim_is_refused_off_hopper() -> None:
    """sm80 and sm120 both refuse 192/128, each for its own reason (sm120 has no FA3 at all)."""
    for capability, constraint in (((8, 0), D.V_HEAD_DIM_HOPPER), ((12, 0), D.FA3_DEVICE)):
        with pytest.raises(RuntimeError) as info:
            fa(**heads(192, 128))(FlashAttnDouble(capability=capability))
        assert constraint.rule in str(info.value)


def test_a_page_id_outside_the_pool_is_refused() -> None:
    with pytest.raises(RuntimeError, match="page ids inside the pool"):
        fa(page_table=torch.tensor([[6, 0], [2, 3]], dtype=torch.int32))(FlashAttnDouble())


def test_the_causal_mask_is_bottom_right_aligned_and_the_window_inclusive() -> None:
    """2 new tokens at the end of 6: row 0 (position 4) sees keys 0..4, row 1 all six; with
    window (1, 0) row 0 sees keys 3 and 4 only."""
    keys = torch.zeros(2, 4, 1, 8)
    values = torch.arange(8, dtype=torch.float32).view(2, 4, 1, 1).expand(2, 4, 1, 8).clone()
    call = {
        "q": torch.zeros(2, 1, 8).half(),
        "k_cache": keys.half(),
        "v_cache": values.half(),
        "page_table": torch.tensor([[0, 1]], dtype=torch.int32),
        "cache_seqlens": torch.tensor([6], dtype=torch.int32),
        "cu_seqlens_q": torch.tensor([0, 2], dtype=torch.int32),
        "max_seqlen_q": 2,
        "causal": True,
    }
    sdk = FlashAttnDouble()
    full = sdk.flash_attn_with_kvcache(**call)  # equal scores: the mean of the visible values
    assert full[:, 0, 0].tolist() == [2.0, 2.5]  # mean(0..4), mean(0..5)
    local = sdk.flash_attn_with_kvcache(**call, window_size=(1, 0))
    assert local[:, 0, 0].tolist() == [3.5, 4.5]  # mean(3, 4), mean(4, 5)


def test_the_double_refuses_what_it_does_not_model() -> None:
    with pytest.raises(NotImplementedError, match="new K/V"):
        fa(k=torch.randn(3, 2, 64).half(), v=torch.randn(3, 2, 64).half())(FlashAttnDouble())
    with pytest.raises(NotImplementedError, match="LSE"):
        fa(return_softmax_lse=True)(FlashAttnDouble())
