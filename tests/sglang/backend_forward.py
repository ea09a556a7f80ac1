"""One forward through the ``sglang_fl`` attention backend on SGLang's real pools, no engine.

``python backend_forward.py`` builds twin KV pools and two ``RadixAttention`` layers, runs a
prefill (with a radix-hit request) and a decode step through SGLang's ``TorchNativeAttnBackend``
and through what ``attention_backend.create_backend`` builds (the policy's choice: the
kernel-based backend or a vendor's whole backend), and prints one JSON line: whether the
outputs and the pools are equal, and the class that served. Run in a subprocess of its own, so
that the environment (``SGLANG_FL_*``, vendor distributions on ``PYTHONPATH``) is read fresh.
"""

import json
from types import SimpleNamespace

import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from sglang_fl.integrations.sglang import attention_backend


def pools():
    kv = MHATokenToKVPool(
        size=512,
        page_size=1,
        dtype=torch.float32,
        head_num=2,
        head_dim=16,
        layer_num=2,
        device="cpu",
        enable_memory_saver=False,
        enable_alt_stream=False,
    )
    req = ReqToTokenPool(size=4, max_context_len=64, device="cpu", enable_memory_saver=False)
    return kv, req


def batch(req, lens, prefixes, decode):
    slot, new = 1, []
    for row, (length, prefix) in enumerate(zip(lens, prefixes, strict=True), start=1):
        req.req_to_token[row, :length] = torch.arange(slot, slot + length)
        new.append(torch.arange(slot + prefix, slot + length))
        slot += length
    return SimpleNamespace(
        forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND,
        req_pool_indices=torch.tensor([1, 2]),
        seq_lens=torch.tensor(lens),
        extend_prefix_lens=None if decode else torch.tensor(prefixes, dtype=torch.int32),
        extend_seq_lens=None
        if decode
        else torch.tensor([n - p for n, p in zip(lens, prefixes, strict=True)], dtype=torch.int32),
        out_cache_loc=torch.cat(new),
        encoder_lens=None,
    )


def forward(backend, kv, req, layers):
    """A prefill (the second request a radix hit), then a decode step; outputs and pools."""
    torch.manual_seed(1)
    got = []
    for decode, lens, prefixes in ((False, [9, 14], [0, 6]), (True, [10, 15], [9, 14])):
        fb = batch(req, lens, prefixes, decode)
        tokens = fb.out_cache_loc.shape[0]
        backend.init_forward_metadata(fb)
        for layer in layers:
            q, k, v = (
                torch.randn(tokens, 64),
                torch.randn(tokens, 2, 16),
                torch.randn(tokens, 2, 16),
            )
            run = backend.forward_decode if decode else backend.forward_extend
            got.append(run(q, k, v, layer, fb))
    return got, [kv.get_key_buffer(i).clone() for i in range(2)]


def main() -> None:
    torch.manual_seed(0)
    layers = [RadixAttention(4, 16, 0.25, 2, layer_id=i) for i in range(2)]
    outs = {}
    served = None
    for name in ("torch_native", "sglang_fl"):
        kv, req = pools()
        runner = SimpleNamespace(
            device="cpu", req_to_token_pool=req, token_to_kv_pool=kv, page_size=1
        )
        if name == "torch_native":
            backend = TorchNativeAttnBackend(runner)
        else:
            backend = attention_backend.create_backend(runner)
            served = type(backend).__name__
        outs[name] = forward(backend, kv, req, layers)
    (native, native_pools), (ours, our_pools) = outs["torch_native"], outs["sglang_fl"]
    result = {
        "same": all(torch.equal(a, b) for a, b in zip(native, ours, strict=True)),
        "pools_same": all(torch.equal(a, b) for a, b in zip(native_pools, our_pools, strict=True)),
        "backend_class": served,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
