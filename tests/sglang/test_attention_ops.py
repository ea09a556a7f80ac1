"""The attention references compute what SGLang's ``torch_native`` backend computes, bit for bit.

Every case of ``decode_attention`` and ``extend_attention`` (but the soft-capped ones:
torch_native ignores ``logit_cap``) runs through the reference and through
``TorchNativeAttnBackend._run_sdpa_forward_decode``/``_extend`` of the installed SGLang on
the same pool; the outputs must be equal, so greedy tokens of the two backends are too. And
``store_kv_cache`` writes what ``MHATokenToKVPool.set_kv_buffer``'s portable path writes.
"""

from __future__ import annotations

import pytest
import torch

from sglang_fl.ops import STANDARD_OPS
from sglang_fl.ops.attention.cases import Option

pytestmark = pytest.mark.timeout(300)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _cases(op_name: str):
    return [
        pytest.param(case, dtype, id=f"{case.name}-{str(dtype).removeprefix('torch.')}")
        for case in STANDARD_OPS[op_name].cases
        if case.params["option"] is not Option.SOFTCAP
        for dtype in DTYPES
    ]


def _torch_native():
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    # The two SDPA runners read no state of the backend: no model runner is needed.
    return TorchNativeAttnBackend.__new__(TorchNativeAttnBackend)


def _make(op_name, case, dtype):
    generator = torch.Generator().manual_seed(99)
    return STANDARD_OPS[op_name].make_inputs(case, dtype, torch.device("cpu"), generator)


def _window(obj):
    return obj.sliding_window_size if obj.sliding_window_size > -1 else None


@pytest.mark.parametrize(("case", "dtype"), _cases("decode_attention"))
def test_decode_reference_equals_torch_native(case, dtype):
    inputs = _make("decode_attention", case, dtype)
    obj = inputs.obj
    q, k_cache, v_cache, _plan = inputs.args
    batch = inputs.batch
    got = STANDARD_OPS["decode_attention"].reference(obj, *inputs.args)
    want = q.new_empty(got.shape)
    _torch_native()._run_sdpa_forward_decode(
        q.contiguous(),  # torch_native's forward_decode reshapes q first
        want,
        k_cache,
        v_cache,
        batch.req_to_token,
        batch.req_pool_indices,
        batch.seq_lens,
        scaling=obj.scaling,
        enable_gqa=q.shape[1] != k_cache.shape[1],
        causal=False,
        sliding_window_size=_window(obj),
    )
    assert torch.equal(got, want)


@pytest.mark.parametrize(("case", "dtype"), _cases("extend_attention"))
def test_extend_reference_equals_torch_native(case, dtype):
    inputs = _make("extend_attention", case, dtype)
    obj = inputs.obj
    q, k_cache, v_cache, _plan = inputs.args
    batch = inputs.batch
    got = STANDARD_OPS["extend_attention"].reference(obj, *inputs.args)
    want = q.new_empty(got.shape)
    if q.shape[0]:
        _torch_native()._run_sdpa_forward_extend(
            q,
            want,
            k_cache,
            v_cache,
            batch.req_to_token,
            batch.req_pool_indices,
            batch.seq_lens,
            batch.extend_prefix_lens,
            batch.extend_seq_lens,
            scaling=obj.scaling,
            enable_gqa=q.shape[1] != k_cache.shape[1],
            causal=obj.is_causal,
            sliding_window_size=_window(obj) if obj.is_causal else None,
        )
    assert torch.equal(got, want)


@pytest.mark.parametrize(
    ("case", "dtype"),
    [
        pytest.param(c, d, id=f"{c.name}-{str(d).removeprefix('torch.')}")
        for c in STANDARD_OPS["store_kv_cache"].cases
        for d in DTYPES
    ],
)
def test_store_reference_equals_sglang_pool_write(case, dtype):
    from sglang.srt.mem_cache import memory_pool

    inputs = _make("store_kv_cache", case, dtype)
    k_cache, v_cache, loc, k, v = inputs.args
    want_k, want_v = k_cache.clone(), v_cache.clone()
    memory_pool._set_kv_buffer_impl(
        k,
        v,
        want_k,
        want_v,
        loc,
        row_dim=k.shape[1] * k.shape[2],
        store_dtype=dtype,
        device_module=torch.cpu,
        size_limit=k_cache.shape[0],
        v_row_dim=v.shape[1] * v.shape[2],
    )
    got_k, got_v = STANDARD_OPS["store_kv_cache"].reference(inputs.obj, *inputs.args)
    assert got_k is k_cache
    assert got_v is v_cache
    assert torch.equal(got_k, want_k)
    assert torch.equal(got_v, want_v)
