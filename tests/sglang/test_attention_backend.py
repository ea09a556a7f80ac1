"""The ``sglang_fl`` backend on SGLang's real KV pools and layers, without an engine.

One forward of two ``RadixAttention`` layers (prefill with a radix-hit request, then a decode
step) through ``SglangFlAttnBackend`` and through ``TorchNativeAttnBackend`` on twin pools:
equal outputs and equal pools. In verify mode (a subprocess: the runtime reads the switch
once), every attention op is checked with a budget of its own, not one shared by the class.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from sglang_processes import ENGINE_TIMEOUT_S, clean_env

from sglang_fl.dispatch_report import read_log

pytest.importorskip("sglang")

SCRIPT = r"""
import sys, torch
from types import SimpleNamespace
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang_fl.integrations.sglang import attention_backend


def pools():
    kv = MHATokenToKVPool(size=512, page_size=1, dtype=torch.float32, head_num=2, head_dim=16,
                          layer_num=2, device="cpu", enable_memory_saver=False,
                          enable_alt_stream=False)
    req = ReqToTokenPool(size=4, max_context_len=64, device="cpu", enable_memory_saver=False)
    return kv, req


def batch(req, lens, prefixes, decode):
    slot, new = 1, []
    for row, (length, prefix) in enumerate(zip(lens, prefixes), start=1):
        req.req_to_token[row, :length] = torch.arange(slot, slot + length)
        new.append(torch.arange(slot + prefix, slot + length))
        slot += length
    return SimpleNamespace(
        forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND,
        req_pool_indices=torch.tensor([1, 2]), seq_lens=torch.tensor(lens),
        extend_prefix_lens=None if decode else torch.tensor(prefixes, dtype=torch.int32),
        extend_seq_lens=None if decode else torch.tensor(
            [n - p for n, p in zip(lens, prefixes)], dtype=torch.int32),
        out_cache_loc=torch.cat(new), encoder_lens=None)


torch.manual_seed(0)
layers = [RadixAttention(4, 16, 0.25, 2, layer_id=i) for i in range(2)]
outs = {}
for name in ("torch_native", "sglang_fl"):
    kv, req = pools()
    runner = SimpleNamespace(device="cpu", req_to_token_pool=req, token_to_kv_pool=kv, page_size=1)
    backend = (TorchNativeAttnBackend(runner) if name == "torch_native"
               else attention_backend.create_backend(runner))
    torch.manual_seed(1)
    got = []
    for decode, lens, prefixes in ((False, [9, 14], [0, 6]), (True, [10, 15], [9, 14])):
        fb = batch(req, lens, prefixes, decode)
        tokens = fb.out_cache_loc.shape[0]
        backend.init_forward_metadata(fb)
        for layer in layers:
            q, k, v = (torch.randn(tokens, 64), torch.randn(tokens, 2, 16),
                       torch.randn(tokens, 2, 16))
            run = backend.forward_decode if decode else backend.forward_extend
            got.append(run(q, k, v, layer, fb))
    outs[name] = (got, [kv.get_key_buffer(i).clone() for i in range(2)])
same = all(torch.equal(a, b) for a, b in zip(outs["torch_native"][0], outs["sglang_fl"][0]))
pools_same = all(torch.equal(a, b) for a, b in zip(outs["torch_native"][1], outs["sglang_fl"][1]))
print(same, pools_same)
"""


def _run(tmp_path, **env: str) -> tuple[str, list[dict]]:
    log = tmp_path / "dispatch.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=clean_env(SGLANG_FL_DISPATCH_LOG=str(log), **env),
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.strip().splitlines()[-1], read_log(log)


def test_outputs_and_pool_equal_torch_natives(tmp_path) -> None:
    last, rows = _run(tmp_path)
    assert last == "True True"
    layer_rows = [r for r in rows if r["event"] == "layer" and r.get("attention_backend")]
    assert len(layer_rows) == 2 * 3  # one record per layer and op, not per call


def test_verify_mode_checks_every_attention_op_with_its_own_budget(tmp_path) -> None:
    last, rows = _run(tmp_path, SGLANG_FL_VERIFY="2")
    assert last == "True True"
    checks = [r for r in rows if r["event"] == "verify"]
    per_op = {op: [r for r in checks if r["op"] == op] for op in attention_ops()}
    assert {op: len(found) for op, found in per_op.items()} == dict.fromkeys(per_op, 2)
    assert all(r["problem"] is None for r in checks), checks
    assert {r["layer"] for r in checks} == {
        f"sglang.srt.layers.radix_attention.RadixAttention[{op}]" for op in per_op
    }


def attention_ops() -> tuple[str, ...]:
    return ("store_kv_cache", "decode_attention", "extend_attention")
