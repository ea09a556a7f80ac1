"""Two GDN routes called the way SGLang's GDN backend calls them, after SGLang loads plugins.

``python gdn_route_run.py`` runs ``load_plugins()`` (sglang-fl hooks the GDN functions in
SGLang's own modules), then calls SGLang's ``fused_recurrent_gated_delta_rule_packed_decode``
(one decode step of every contract case, the pool larger than the batch) and
``layernorm_gated.RMSNorm.forward`` with a gate, and prints one JSON line: per call, the
largest difference from the op's reference and the pool slots whose contents differ from it.
The environment picks the vendor and the switches (strict, verify) as for any process.
"""

from __future__ import annotations

import json

import torch


def main() -> None:
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.kernels.ops.attention.fla import fused_recurrent, layernorm_gated

    from sglang_fl.ops import get_contract

    contract = get_contract("fused_recurrent_gated_delta_rule_packed_decode")
    decode = []
    for case in contract.cases:
        made = contract.make_inputs(case, torch.float32, torch.device("cpu"), torch.Generator())
        expect = contract.make_inputs(case, torch.float32, torch.device("cpu"), torch.Generator())
        out, pool = fused_recurrent.fused_recurrent_gated_delta_rule_packed_decode(
            *made.args, **made.kwargs
        )
        want_out, want_pool = contract.reference(None, *expect.args, **expect.kwargs)
        differs = (pool - want_pool).flatten(1).abs().amax(1) > 0
        decode.append(
            {
                "case": case.name,
                "out_error": float((out - want_out).abs().max()) if out.numel() else 0.0,
                "slots_differing": [int(i) for i in differs.nonzero().flatten()],
            }
        )
    norm = layernorm_gated.RMSNorm(32, group_size=16, norm_before_gate=True, device="cpu")
    gen = torch.Generator().manual_seed(0)
    x, z = torch.randn(5, 32, generator=gen), torch.randn(5, 32, generator=gen)
    got = norm(x, z)
    want = get_contract("rms_norm_gated").reference(norm, x, z)
    print(
        json.dumps({"decode": decode, "norm_error": float((got - want).abs().max())}),
        flush=True,
    )


if __name__ == "__main__":
    main()
