"""The GDN references' scaling and their speed against transformers' torch implementation.

``python benchmarks/linear_attention.py [--quick]`` (in the ``sglang`` or ``bench`` session's
venv: it needs transformers) prints three tables, each measured side by side in one run
(``timing.interleaved``):

- prefill: ``chunk_gated_delta_rule``'s cost per token at 256, 1024 and 4096 tokens, as a ratio
  to the 256-token cost (flat = linear in the sequence length);
- decode: ``fused_recurrent_gated_delta_rule_packed_decode``'s cost per step after a prefix of
  256, 1024 and 4096 tokens (the state is the whole context: the ratio stays ~1);
- the reference against transformers' ``torch_chunk_gated_delta_rule`` (at each prefill
  length) and ``torch_recurrent_gated_delta_rule`` (one decode step) on the same shapes (a
  speed-up: >= 1.0x is the target).

Shapes are Qwen3-Next's per-rank GDN head shapes scaled down (heads 4/8, head dims 64) so a
shared 2-core machine runs it in a minute or two.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from timing import Call, interleaved

from sglang_fl.ops import get_contract

H, HV, K, V = 4, 8, 64, 64
LENGTHS = (256, 1024, 4096)


def _inputs(tokens: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    q = torch.randn(1, tokens, H, K, generator=gen)
    k = torch.randn(1, tokens, H, K, generator=gen)
    v = torch.randn(1, tokens, HV, V, generator=gen)
    g = -0.5 * torch.rand(1, tokens, HV, generator=gen)
    beta = torch.rand(1, tokens, HV, generator=gen).sigmoid()
    return q, k, v, g, beta


def prefill_calls(lengths: tuple[int, ...]) -> dict[str, Call]:
    chunk = get_contract("chunk_gated_delta_rule").reference
    gen = torch.Generator().manual_seed(0)
    calls = {}
    for n in lengths:
        q, k, v, g, beta = _inputs(n, gen)
        pool = torch.zeros(1, HV, V, K)
        args = (None, q, k, v, g, beta, None, pool, torch.tensor([0]), torch.tensor([0, n]), True)
        calls[f"reference prefill {n}"] = Call(chunk, args)
    return calls


def decode_calls(lengths: tuple[int, ...]) -> dict[str, Call]:
    packed = get_contract("fused_recurrent_gated_delta_rule_packed_decode").reference
    gen = torch.Generator().manual_seed(1)
    calls = {}
    for n in lengths:
        # The state after an n-token prefix: what a decode step reads, whatever n is.
        q, k, v, g, beta = _inputs(n, gen)
        pool = torch.zeros(1, HV, V, K)
        get_contract("chunk_gated_delta_rule").reference(
            None, q, k, v, g, beta, None, pool, torch.tensor([0]), torch.tensor([0, n]), True
        )
        mixed = torch.randn(1, 2 * H * K + HV * V, generator=gen)
        a, b = torch.randn(1, HV, generator=gen), torch.randn(1, HV, generator=gen)
        A_log, dt_bias = torch.zeros(HV), torch.zeros(HV)
        out = torch.empty(1, 1, HV, V)
        args = (None, mixed, a, b, A_log, dt_bias, K**-0.5, pool, out, torch.tensor([0]), True)
        calls[f"reference decode after {n}"] = Call(packed, args)
    return calls


def versus_transformers(tokens: int) -> dict[str, Call]:
    """The same work on both sides: transformers' variants also expand the key heads and, for
    decode, split the packed projection and form the gates, as its ``Qwen3NextGatedDeltaNet``
    does around these functions."""
    from transformers.models.qwen3_next import modeling_qwen3_next as hf

    gen = torch.Generator().manual_seed(2)
    q, k, v, g, beta = _inputs(tokens, gen)
    rep = HV // H

    def hf_prefill() -> object:
        qe, ke = (x.repeat_interleave(rep, dim=2) for x in (q, k))
        return hf.torch_chunk_gated_delta_rule(
            qe, ke, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True
        )

    chunk = get_contract("chunk_gated_delta_rule").reference
    pool = torch.zeros(1, HV, V, K)
    prefill_args = (
        None,
        q,
        k,
        v,
        g,
        beta,
        None,
        pool,
        torch.tensor([0]),
        torch.tensor([0, tokens]),
    )

    mixed = torch.randn(1, 2 * H * K + HV * V, generator=gen)
    a, b = torch.randn(1, HV, generator=gen), torch.randn(1, HV, generator=gen)
    A_log, dt_bias = torch.zeros(HV), torch.zeros(HV)
    state_hf = torch.zeros(1, HV, K, V)

    def hf_decode() -> object:
        qs, ks, vs = torch.split(mixed, [H * K, H * K, HV * V], dim=-1)
        qs, ks = (x.reshape(1, 1, H, K).repeat_interleave(rep, dim=2) for x in (qs, ks))
        gs = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
        return hf.torch_recurrent_gated_delta_rule(
            qs, ks, vs.reshape(1, 1, HV, V), gs.unsqueeze(0), b.sigmoid().unsqueeze(0),
            initial_state=state_hf, output_final_state=True, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip

    packed = get_contract("fused_recurrent_gated_delta_rule_packed_decode").reference
    dpool, out = torch.zeros(1, HV, V, K), torch.empty(1, 1, HV, V)
    decode_args = (None, mixed, a, b, A_log, dt_bias, K**-0.5, dpool, out, torch.tensor([0]), True)
    return {
        f"reference prefill {tokens}": Call(chunk, prefill_args, {"use_qk_l2norm_in_kernel": True}),
        f"transformers prefill {tokens}": Call(hf_prefill),
        "reference decode step": Call(packed, decode_args),
        "transformers decode step": Call(hf_decode),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # a shared machine: one thread, comparable figures
    budget = 1_000_000_000 if args.quick else 4_000_000_000
    reps = 5 if args.quick else 15

    prefill = interleaved(prefill_calls(LENGTHS), repetitions=reps, budget_ns=budget)
    base = prefill[f"reference prefill {LENGTHS[0]}"].median_ns / LENGTHS[0]
    print("prefill (chunk_gated_delta_rule): cost per token, ratio to 256 tokens (flat = linear)")
    for n in LENGTHS:
        per_token = prefill[f"reference prefill {n}"].median_ns / n
        print(f"  {n:>5} tokens  {per_token / 1e3:9.2f} us/token  ratio {per_token / base:5.2f}")

    decode = interleaved(decode_calls(LENGTHS), repetitions=reps, budget_ns=budget)
    base = decode[f"reference decode after {LENGTHS[0]}"].median_ns
    print("decode (packed decode step): cost per step after a prefix, ratio to 256")
    for n in LENGTHS:
        step = decode[f"reference decode after {n}"].median_ns
        print(f"  {n:>5} prefix  {step / 1e3:9.2f} us/step   ratio {step / base:5.2f}")

    print("reference vs transformers' torch implementation (speed-up, >= 1.0x is the target)")
    for tokens in LENGTHS:
        calls = versus_transformers(tokens)
        whats = (f"prefill {tokens}",) + (("decode step",) if tokens == LENGTHS[-1] else ())
        for what in whats:
            pair = {who: calls[f"{who} {what}"] for who in ("reference", "transformers")}
            vs = interleaved(pair, repetitions=reps, budget_ns=budget)  # side by side
            ours, theirs = vs["reference"].median_ns, vs["transformers"].median_ns
            print(
                f"  {what:<14} reference {ours / 1e3:10.1f} us  transformers "
                f"{theirs / 1e3:10.1f} us  speed-up {theirs / ours:5.2f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
