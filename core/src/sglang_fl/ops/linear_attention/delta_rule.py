"""The gated delta rule: chunked prefill, recurrent and packed decode, sigmoid-gating decode.

Names and signatures are SGLang 0.5.23's (``sglang.kernels.ops.attention.fla.chunk``,
``fla.fused_recurrent``, ``linear.fused_sigmoid_gating_recurrent``; the first three are also
the FlagOS plugin's op names), with ``obj`` (``None``: kernel functions have no layer) first.
State pools are ``[N, HV, V, K]`` and are updated in place through per-sequence indices; the
contracts return the pool as their last output, so the conformance kit checks that it was
written in place and that every slot holds what the reference holds (untouched slots too).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from ..contract import OpCase, OpContract, OpInputs, Tolerance, random_tensor
from ._gdn import (
    chunked_sequence,
    gdn_decay,
    l2norm,
    prepare_qkv,
    recurrent_step,
    scrambled_slots,
    sequence_bounds,
)
from .state_indices import HOST_INDICES, PAD_SLOT_ID, check_state_indices

__all__ = [
    "CHUNK_GATED_DELTA_RULE",
    "FUSED_RECURRENT_GATED_DELTA_RULE",
    "FUSED_RECURRENT_GATED_DELTA_RULE_PACKED_DECODE",
    "FUSED_SIGMOID_GATING_DELTA_RULE_UPDATE",
]

# The state is carried over many tokens in float32; the chunked and recurrent forms round
# differently, and low-precision inputs enter every step.
TOLERANCES: Mapping[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(atol=1e-4, rtol=1e-4),
    torch.float16: Tolerance(atol=5e-3, rtol=5e-3),
    torch.bfloat16: Tolerance(atol=3e-2, rtol=3e-2),
}
DTYPES = tuple(TOLERANCES)


# -- chunk_gated_delta_rule (prefill) --------------------------------------------------------------


def _chunk_signature(
    obj: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    initial_state_indices: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    inplace_update: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prefill: run the gated delta rule over each sequence, starting from its pooled state.

    ``q``/``k`` ``[B, T, H, K]``, ``v`` ``[B, T, HV, V]`` (``HV`` a multiple of ``H``: value
    head ``i`` reads key head ``i // (HV // H)``), ``g`` (log decay) and ``beta``
    ``[B, T, HV]``. With ``cu_seqlens`` ``[N + 1]`` the batch dim is 1 and the tokens are
    ``N`` concatenated sequences (a sequence may be empty). ``scale`` defaults to
    ``K ** -0.5``; ``use_qk_l2norm_in_kernel`` L2-normalises ``q`` and ``k`` first (eps 1e-6).
    Sequence ``i`` starts from ``initial_state[initial_state_indices[i]]`` (``[N_slots, HV, V,
    K]``; zeros without ``initial_state``) and, with ``inplace_update``, its final state is
    written back into that slot; other slots are untouched. An index outside the pool is an
    ``IndexError`` naming the op.

    Returns ``(o, h, states)``: ``o`` ``[B, T, HV, V]`` in ``q``'s dtype; ``h``
    ``[B, NT, HV, V, K]`` in ``k``'s dtype, the state before each 64-token chunk of each
    sequence (SGLang's radix cache snapshots these); ``states`` the pool itself (or, without
    a pool, the ``[N, HV, V, K]`` float32 final states). All arithmetic in float32.
    """
    raise NotImplementedError


def chunk_gated_delta_rule(
    obj: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    initial_state_indices: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    inplace_update: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chunked (WY) algorithm per sequence: linear in the sequence length."""
    op = "chunk_gated_delta_rule"
    batch, tokens, _, dk = k.shape
    heads_v, dv = v.shape[-2], v.shape[-1]
    spans = sequence_bounds(op, cu_seqlens, batch, tokens)
    qf, kf, vf = prepare_qkv(op, q, k, v, scale, use_qk_l2norm_in_kernel, expand=False)
    gf, bf = g.float(), beta.float()
    if initial_state is not None:
        if initial_state_indices is None:
            slots = list(range(len(spans)))
            check_state_indices(op, torch.arange(len(spans)), initial_state.shape[0])
        else:
            if initial_state_indices.numel() != len(spans):
                raise ValueError(
                    f"{op}: {initial_state_indices.numel()} state indices for "
                    f"{len(spans)} sequences"
                )
            check_state_indices(op, initial_state_indices, initial_state.shape[0], pad_slot_id=None)
            slots = initial_state_indices.reshape(-1).tolist()
        states = initial_state
    else:
        slots = list(range(len(spans)))
        states = torch.zeros(len(spans), heads_v, dv, dk, dtype=torch.float32, device=k.device)
    # The spans cover every token: no zero fill; one whole row is returned as it is.
    out = torch.empty(batch, tokens, heads_v, dv, dtype=torch.float32, device=k.device)
    chunk_states: list[torch.Tensor] = []
    finals: list[tuple[int, torch.Tensor]] = []
    for (row, start, end), slot in zip(spans, slots, strict=True):
        if end == start:
            continue
        o, final, h = chunked_sequence(
            states[slot].float(),
            qf[row, start:end],
            kf[row, start:end],
            vf[row, start:end],
            gf[row, start:end],
            bf[row, start:end],
        )
        if batch == 1 and end - start == tokens:
            out = o.unsqueeze(0)
        else:
            out[row, start:end] = o
        chunk_states.append(h)
        finals.append((slot, final))
    if inplace_update or initial_state is None:
        for slot, final in finals:  # after every read: a slot may serve two sequences
            states[slot] = final.to(states.dtype)
    if len(chunk_states) == 1:
        h_all = chunk_states[0]
    elif chunk_states:
        h_all = torch.cat(chunk_states)
    else:
        h_all = torch.zeros(0, heads_v, dv, dk, dtype=torch.float32, device=k.device)
    return out.to(q.dtype), h_all.unsqueeze(0).to(k.dtype), states


# -- fused_recurrent_gated_delta_rule -------------------------------------------------------------


def _recurrent_signature(
    obj: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token by token, FLA's ``fused_recurrent_gated_delta_rule`` (not pooled).

    Shapes as in ``chunk_gated_delta_rule``; ``beta`` defaults to ones; ``initial_state`` is
    ``[N, HV, V, K]``, one per sequence (zeros without it), never written. Returns
    ``(o, final_state)``: ``o`` in ``q``'s dtype, ``final_state`` ``[N, HV, V, K]`` float32
    (always computed; SGLang's form returns ``None`` unless ``output_final_state``).
    """
    raise NotImplementedError


def fused_recurrent_gated_delta_rule(
    obj: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One O(1) step per token, sequences batched per step."""
    op = "fused_recurrent_gated_delta_rule"
    batch, tokens, _, dk = k.shape
    heads_v, dv = v.shape[-2], v.shape[-1]
    spans = sequence_bounds(op, cu_seqlens, batch, tokens)
    qf, kf, vf = prepare_qkv(op, q, k, v, scale, use_qk_l2norm_in_kernel)
    gf = g.float()
    bf = beta.float() if beta is not None else torch.ones_like(gf)
    if initial_state is not None and initial_state.shape[0] != len(spans):
        raise ValueError(
            f"{op}: initial_state has {initial_state.shape[0]} states for {len(spans)} sequences"
        )
    state = (
        initial_state.float().clone()
        if initial_state is not None
        else torch.zeros(len(spans), heads_v, dv, dk, dtype=torch.float32, device=k.device)
    )
    out = torch.zeros(batch, tokens, heads_v, dv, dtype=torch.float32, device=k.device)
    longest = max((end - start for _, start, end in spans), default=0)
    for step in range(longest):
        live = [
            (n, row, start + step)
            for n, (row, start, end) in enumerate(spans)
            if start + step < end
        ]
        seqs = torch.tensor([n for n, _, _ in live], device=k.device)
        rows = torch.tensor([r for _, r, _ in live], device=k.device)
        at = torch.tensor([t for _, _, t in live], device=k.device)
        o, new = recurrent_step(
            state[seqs], qf[rows, at], kf[rows, at], vf[rows, at], gf[rows, at], bf[rows, at]
        )
        state[seqs] = new
        out[rows, at] = o
    return out.to(q.dtype), state


# -- fused_recurrent_gated_delta_rule_packed_decode ---------------------------------------------


def _packed_signature(
    obj: Any,
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor,
    out: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    use_qk_l2norm_in_kernel: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode, one token per request, straight from the packed convolution output.

    ``mixed_qkv`` ``[B, 2 * H * K + HV * V]`` (q heads, k heads, v heads), ``a``/``b``
    ``[B, HV]``, ``A_log``/``dt_bias`` ``[HV]``; ``g = -exp(A_log) * softplus(a + dt_bias)``
    (softplus threshold 20) and ``beta = sigmoid(b)`` (rounded to ``b``'s dtype) are formed
    inside. Request ``i`` reads and writes ``initial_state[ssm_state_indices[i]]`` (pool
    ``[N, HV, V, K]``); index -1 is a padding row: its output is zeros and no state is read
    or written; any other index outside the pool is an ``IndexError`` naming the op. The
    output is written into ``out`` ``[B, 1, HV, V]``. Returns ``(out, initial_state)``.
    """
    raise NotImplementedError


def fused_recurrent_gated_delta_rule_packed_decode(
    obj: Any,
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor,
    out: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    use_qk_l2norm_in_kernel: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather the live rows' states, one recurrent step, scatter back."""
    op = "fused_recurrent_gated_delta_rule_packed_decode"
    heads_v, dv, dk = initial_state.shape[-3:]
    batch = mixed_qkv.shape[0]
    heads_qk = (mixed_qkv.shape[-1] - heads_v * dv) // (2 * dk)
    if heads_qk <= 0 or 2 * heads_qk * dk + heads_v * dv != mixed_qkv.shape[-1]:
        raise ValueError(
            f"{op}: mixed_qkv's last dim {mixed_qkv.shape[-1]} is not 2 * H * {dk} + "
            f"{heads_v} * {dv} for any H"
        )
    if ssm_state_indices.numel() != batch or tuple(out.shape) != (batch, 1, heads_v, dv):
        raise ValueError(
            f"{op}: {batch} requests need {batch} state indices (got "
            f"{ssm_state_indices.numel()}) and out [{batch}, 1, {heads_v}, {dv}] (got "
            f"{list(out.shape)})"
        )
    check_state_indices(op, ssm_state_indices, initial_state.shape[0])
    slots = ssm_state_indices.reshape(-1).tolist()
    live = [i for i, slot in enumerate(slots) if slot != PAD_SLOT_ID]
    if len(live) == batch:  # no padding row (the common case): no row gathers
        rows = None
        where = ssm_state_indices.to(device=initial_state.device, dtype=torch.int64)
        packed, a_live, b_live = mixed_qkv, a, b
    elif live:
        rows = torch.tensor(live, device=mixed_qkv.device)
        where = torch.tensor([slots[i] for i in live], device=initial_state.device)
        packed, a_live, b_live = mixed_qkv[rows], a[rows], b[rows]
    result = torch.zeros(batch, heads_v, dv, dtype=torch.float32, device=out.device)
    if live:
        # Grouped, not expanded: value heads [H, r] share their key head's q and k by
        # broadcasting (value head i reads key head i // r), one L2 norm for q and k together.
        n, r = len(live), heads_v // heads_qk
        qk = packed[:, : 2 * heads_qk * dk].reshape(n, 2, heads_qk, 1, dk).float()
        if use_qk_l2norm_in_kernel:
            qk = l2norm(qk)
        q, k = qk[:, 0] * scale, qk[:, 1]  # [n, H, 1, K]
        v = packed[:, 2 * heads_qk * dk :].reshape(n, heads_qk, r, dv).float()
        g = gdn_decay(A_log, a_live, dt_bias).reshape(n, heads_qk, r)
        beta = torch.sigmoid(b_live.float()).to(b.dtype).float().reshape(n, heads_qk, r)
        state = initial_state.index_select(0, where).float()  # a copy: updated in place
        o, new = recurrent_step(state.view(n, heads_qk, r, dv, dk), q, k, v, g, beta, in_place=True)
        initial_state.index_copy_(0, where, new.reshape(n, heads_v, dv, dk).to(initial_state.dtype))
        o = o.reshape(n, heads_v, dv)
        if rows is None:
            result = o
        else:
            result[rows] = o
    out.copy_(result.unsqueeze(1))
    return out, initial_state


# -- fused_sigmoid_gating_delta_rule_update -------------------------------------------------------


def _sigmoid_signature(
    obj: Any,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    softplus_beta: float,
    softplus_threshold: float,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    b: torch.Tensor,
    initial_state_source: torch.Tensor,
    initial_state_indices: torch.Tensor,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode with the gates formed inside: SGLang's GDN ``decode`` kernel.

    ``q``/``k`` ``[B, T, H, K]``, ``v`` ``[B, T, HV, V]``; ``a``/``b`` ``[B * T, HV]`` per
    token; ``g = -exp(A_log) * softplus(a + dt_bias)`` (``softplus_beta``,
    ``softplus_threshold``), ``beta = sigmoid(b)`` in float32. With ``cu_seqlens`` (batch 1)
    the tokens are concatenated sequences, else each batch row is one. Sequence ``i`` starts
    from ``initial_state_source[initial_state_indices[i]]`` and its final state is written
    back there; index -1 starts from zeros and writes nothing; other out-of-pool indices are
    an ``IndexError`` naming the op. Returns ``(o, initial_state_source)``, ``o``
    ``[B, T, HV, V]`` in ``q``'s dtype. (SGLang's target-verify and KDA options are not part
    of this contract.)
    """
    raise NotImplementedError


def fused_sigmoid_gating_delta_rule_update(
    obj: Any,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    softplus_beta: float,
    softplus_threshold: float,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    b: torch.Tensor,
    initial_state_source: torch.Tensor,
    initial_state_indices: torch.Tensor,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence, per token: one recurrent step (decode has one token per sequence)."""
    op = "fused_sigmoid_gating_delta_rule_update"
    batch, tokens, _, dk = k.shape
    heads_v, dv = v.shape[-2], v.shape[-1]
    spans = sequence_bounds(op, cu_seqlens, batch, tokens)
    if initial_state_indices.numel() != len(spans):
        raise ValueError(
            f"{op}: {initial_state_indices.numel()} state indices for {len(spans)} sequences"
        )
    check_state_indices(op, initial_state_indices, initial_state_source.shape[0])
    slots = initial_state_indices.reshape(-1).tolist()
    qf, kf, vf = prepare_qkv(op, q, k, v, scale, use_qk_l2norm_in_kernel)
    g = gdn_decay(A_log, a, dt_bias, softplus_beta, softplus_threshold).reshape(
        batch, tokens, heads_v
    )
    beta = torch.sigmoid(b.float()).reshape(batch, tokens, heads_v)
    out = torch.zeros(batch, tokens, heads_v, dv, dtype=torch.float32, device=k.device)
    finals: list[tuple[int, torch.Tensor]] = []
    for (row, start, end), slot in zip(spans, slots, strict=True):
        state = (
            initial_state_source[slot].float().unsqueeze(0)
            if slot != PAD_SLOT_ID
            else torch.zeros(1, heads_v, dv, dk, dtype=torch.float32, device=k.device)
        )
        for t in range(start, end):
            o, state = recurrent_step(
                state,
                qf[row, t : t + 1],
                kf[row, t : t + 1],
                vf[row, t : t + 1],
                g[row, t : t + 1],
                beta[row, t : t + 1],
            )
            out[row, t] = o[0]
        if slot != PAD_SLOT_ID and end > start:
            finals.append((slot, state[0]))
    for slot, final in finals:
        initial_state_source[slot] = final.to(initial_state_source.dtype)
    return out.to(q.dtype), initial_state_source


# -- cases ---------------------------------------------------------------------------------------

# (H, HV, K, V): equal heads, the fused-split ratio 2, a ratio outside {1, 2, 4}.
HEADS: tuple[tuple[int, int, int, int], ...] = ((2, 2, 16, 16), (2, 4, 16, 8), (1, 3, 8, 16))


def _name(p: Mapping[str, Any]) -> str:
    h, hv, dk, dv = p["heads"]
    lens = p["lens"]
    name = f"batch={len(lens)},lens={'+'.join(map(str, lens)) or '-'},heads={h}/{hv},k={dk},v={dv}"
    name += "" if p.get("l2norm", True) else ",no-l2norm"
    name += "" if p.get("inplace", True) else ",no-inplace"
    return name + (",qkv-slices" if p.get("slices") else "")


def _case(**params: Any) -> OpCase:
    return OpCase(_name(params), params)


def _qkv(
    p: Mapping[str, Any],
    rows: int,
    tokens: int,
    dtype: torch.dtype,
    device: torch.device,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``q``, ``k`` ``[rows, tokens, H, K]`` and ``v`` ``[rows, tokens, HV, V]``; with
    ``slices``, views into one packed buffer, as SGLang's ``torch.split`` of ``mixed_qkv``."""
    h, hv, dk, dv = p["heads"]
    widths = [h * dk, h * dk, hv * dv]
    if p.get("slices"):
        packed = random_tensor((rows, tokens, sum(widths)), dtype, device, generator)
        q, k, v = torch.split(packed, widths, dim=-1)
    else:
        q, k, v = (random_tensor((rows, tokens, w), dtype, device, generator) for w in widths)
    return (
        q.unflatten(-1, (h, dk)),
        k.unflatten(-1, (h, dk)),
        v.unflatten(-1, (hv, dv)),
    )


def _pool(
    slots: int, p: Mapping[str, Any], device: torch.device, gen: torch.Generator
) -> torch.Tensor:
    _, hv, dk, dv = p["heads"]
    return 0.1 * random_tensor((slots, hv, dv, dk), torch.float32, device, gen)


def _decays(shape: tuple[int, ...], device: torch.device, gen: torch.Generator) -> torch.Tensor:
    """Log decays in [-0.5, 0): trained GDN layers forget slowly."""
    return -0.5 * torch.rand(shape, generator=gen).to(device)


CHUNK_CASES = (
    _case(lens=(), heads=HEADS[0]),
    _case(lens=(1,), heads=HEADS[0]),
    _case(lens=(7, 0, 33), heads=HEADS[1]),
    _case(lens=(64,), heads=HEADS[1]),
    _case(lens=(150, 5), heads=HEADS[2]),
    _case(lens=(70,), heads=HEADS[0], l2norm=False),
    _case(lens=(9, 65), heads=HEADS[1], inplace=False),
    _case(lens=(3, 66), heads=HEADS[2], slices=True),
)


def _chunk_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    p = case.params
    lens = p["lens"]
    total = sum(lens)
    _, hv, _, _ = p["heads"]
    q, k, v = _qkv(p, 1, total, dtype, device, generator)
    g = _decays((1, total, hv), device, generator)
    beta = torch.sigmoid(random_tensor((1, total, hv), torch.float32, device, generator))
    pool = _pool(len(lens) + 2, p, device, generator)
    cu = torch.tensor(
        [0, *torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int64
    )
    kwargs = {
        "initial_state": pool,
        "initial_state_indices": scrambled_slots(len(lens), pool.shape[0]).to(device),
        "cu_seqlens": cu.to(device),
        "use_qk_l2norm_in_kernel": p.get("l2norm", True),
        "inplace_update": p.get("inplace", True),
    }
    return OpInputs(
        obj=None,
        args=(q, k, v, g, beta),
        kwargs=kwargs,
        preserved=("q", "k", "v", "g", "beta", "initial_state_indices", "cu_seqlens"),
        written_in_place={2: "initial_state"},
    )


CHUNK_GATED_DELTA_RULE = OpContract(
    name="chunk_gated_delta_rule",
    sglang_layer="chunk_gated_delta_rule (kernel function, GDN prefill)",
    summary="Gated delta rule prefill over varlen sequences, pooled state updated in place",
    signature=inspect.signature(_chunk_signature),
    details=inspect.getdoc(_chunk_signature) or "",
    reference=chunk_gated_delta_rule,
    dtypes=DTYPES,
    tolerances=TOLERANCES,
    cases=CHUNK_CASES,
    make_inputs=_chunk_inputs,
)


RECURRENT_CASES = (
    _case(lens=(), heads=HEADS[0]),
    _case(lens=(1, 1, 1), heads=HEADS[1]),
    _case(lens=(7, 0, 12), heads=HEADS[2]),
    _case(lens=(5, 3), heads=HEADS[1], l2norm=False),
    _case(lens=(4, 9), heads=HEADS[0], slices=True),
)


def _recurrent_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    p = case.params
    lens = p["lens"]
    total = sum(lens)
    _, hv, _, _ = p["heads"]
    q, k, v = _qkv(p, 1, total, dtype, device, generator)
    g = _decays((1, total, hv), device, generator)
    beta = torch.sigmoid(random_tensor((1, total, hv), torch.float32, device, generator))
    state = _pool(len(lens), p, device, generator)
    cu = torch.tensor(
        [0, *torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int64
    )
    return OpInputs(
        obj=None,
        args=(q, k, v, g, beta),
        kwargs={
            "initial_state": state,
            "output_final_state": True,
            "cu_seqlens": cu.to(device),
            "use_qk_l2norm_in_kernel": p.get("l2norm", True),
        },
        preserved=("q", "k", "v", "g", "beta", "initial_state", "cu_seqlens"),
    )


FUSED_RECURRENT_GATED_DELTA_RULE = OpContract(
    name="fused_recurrent_gated_delta_rule",
    sglang_layer="fused_recurrent_gated_delta_rule (kernel function)",
    summary="Gated delta rule token by token over varlen sequences (state not pooled)",
    signature=inspect.signature(_recurrent_signature),
    details=inspect.getdoc(_recurrent_signature) or "",
    reference=fused_recurrent_gated_delta_rule,
    dtypes=DTYPES,
    tolerances=TOLERANCES,
    cases=RECURRENT_CASES,
    make_inputs=_recurrent_inputs,
)


# Decode batches: the live requests, and where padding rows (-1) sit.
PACKED_CASES = (
    _case(lens=(), heads=HEADS[0]),
    _case(lens=(1,), heads=HEADS[0]),
    _case(lens=(1,) * 5, heads=HEADS[1]),
    _case(lens=(1,) * 4, heads=HEADS[2], padding=True),
    _case(lens=(1,) * 3, heads=HEADS[1], l2norm=False),
    _case(lens=(1,) * 3, heads=HEADS[2], slices=True),
)


def _gate_params(
    hv: int, dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``A_log`` (float32, as SGLang keeps it) and ``dt_bias`` (the model dtype)."""
    A_log = torch.log(1.0 + 4.0 * torch.rand(hv, generator=gen)).to(device)
    dt_bias = random_tensor((hv,), dtype, device, gen)
    return A_log, dt_bias


def _packed_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    p = case.params
    h, hv, dk, dv = p["heads"]
    batch = len(p["lens"])
    width = 2 * h * dk + hv * dv
    if p.get("slices"):  # rows of a wider buffer: last dim contiguous, rows strided
        mixed_qkv = random_tensor((batch, width + 8), dtype, device, generator)[:, :width]
    else:
        mixed_qkv = random_tensor((batch, width), dtype, device, generator)
    a = random_tensor((batch, hv), dtype, device, generator)
    b = random_tensor((batch, hv), dtype, device, generator)
    A_log, dt_bias = _gate_params(hv, dtype, device, generator)
    pool = _pool(batch + 2, p, device, generator)
    indices = scrambled_slots(batch, pool.shape[0])
    if p.get("padding"):
        indices[1] = PAD_SLOT_ID
    out = random_tensor((batch, 1, hv, dv), dtype, device, generator)
    return OpInputs(
        obj=None,
        args=(mixed_qkv, a, b, A_log, dt_bias, dk**-0.5, pool, out, indices.to(device)),
        kwargs={"use_qk_l2norm_in_kernel": p.get("l2norm", True)},
        preserved=("mixed_qkv", "a", "b", "A_log", "dt_bias", "ssm_state_indices"),
        written_in_place={0: "out", 1: "initial_state"},
    )


FUSED_RECURRENT_GATED_DELTA_RULE_PACKED_DECODE = OpContract(
    name="fused_recurrent_gated_delta_rule_packed_decode",
    sglang_layer="fused_recurrent_gated_delta_rule_packed_decode (kernel function, GDN decode)",
    summary="GDN decode from the packed conv output: gates, one delta-rule step, pooled state",
    signature=inspect.signature(_packed_signature),
    details=inspect.getdoc(_packed_signature) or "",
    reference=fused_recurrent_gated_delta_rule_packed_decode,
    dtypes=DTYPES,
    tolerances=TOLERANCES,
    cases=PACKED_CASES,
    make_inputs=_packed_inputs,
    reference_graph_problems=HOST_INDICES,
)


SIGMOID_CASES = (
    _case(lens=(), heads=HEADS[0]),
    _case(lens=(1, 1, 1), heads=HEADS[1]),
    _case(lens=(1, 1, 1, 1), heads=HEADS[2], padding=True),
    _case(lens=(3, 1, 2), heads=HEADS[0]),  # several tokens per sequence (target verify)
    _case(lens=(1, 1), heads=HEADS[1], l2norm=False),
    _case(lens=(1, 1, 1), heads=HEADS[2], slices=True),
)


def _sigmoid_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    p = case.params
    lens = p["lens"]
    total = sum(lens)
    _, hv, _, _ = p["heads"]
    q, k, v = _qkv(p, 1, total, dtype, device, generator)
    a = random_tensor((total, hv), dtype, device, generator)
    b = random_tensor((total, hv), dtype, device, generator)
    A_log, dt_bias = _gate_params(hv, dtype, device, generator)
    pool = _pool(len(lens) + 2, p, device, generator)
    indices = scrambled_slots(len(lens), pool.shape[0])
    if p.get("padding"):
        indices[2] = PAD_SLOT_ID
    cu = torch.tensor(
        [0, *torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32
    )
    return OpInputs(
        obj=None,
        args=(A_log, a, dt_bias, 1.0, 20.0, q, k, v, b, pool, indices.to(device)),
        kwargs={"use_qk_l2norm_in_kernel": p.get("l2norm", True), "cu_seqlens": cu.to(device)},
        preserved=(
            "A_log",
            "a",
            "dt_bias",
            "q",
            "k",
            "v",
            "b",
            "initial_state_indices",
            "cu_seqlens",
        ),
        written_in_place={1: "initial_state_source"},
    )


FUSED_SIGMOID_GATING_DELTA_RULE_UPDATE = OpContract(
    name="fused_sigmoid_gating_delta_rule_update",
    sglang_layer="fused_sigmoid_gating_delta_rule_update (kernel function, GDN decode)",
    summary="GDN decode with the sigmoid/softplus gates fused in, pooled state in place",
    signature=inspect.signature(_sigmoid_signature),
    details=inspect.getdoc(_sigmoid_signature) or "",
    reference=fused_sigmoid_gating_delta_rule_update,
    dtypes=DTYPES,
    tolerances=TOLERANCES,
    cases=SIGMOID_CASES,
    make_inputs=_sigmoid_inputs,
    reference_graph_problems=HOST_INDICES,
)
