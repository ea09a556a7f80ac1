"""The gated delta rule's math, in float32, shared by the family's reference implementations.

State layout is SGLang's: one ``[HV, V, K]`` matrix ``S`` per sequence (value rows, key
columns), so a read is ``S @ k`` and an update adds ``v k^T``. Per token ``t`` (decay
``exp(g_t)``, write strength ``beta_t``, key ``k_t``, value ``v_t``, scaled query ``q_t``)::

    S <- exp(g_t) * S
    S <- S + beta_t * (v_t - S k_t) k_t^T
    o_t = S q_t

:func:`recurrent_step` applies one token to a batch of states (O(1) per token: the decode
form). :func:`chunked_sequence` computes the same for a whole sequence chunk by chunk (the
"WY" form FLA's Triton kernels use): inside a chunk of ``C`` tokens the updates are solved as
one unit-triangular system, across chunks the state is carried, so the cost is linear in the
sequence length (``O(T * C * (K + V))``), not quadratic.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
import torch.nn.functional as F

# FLA's chunk size (``sglang.kernels.ops.attention.fla.chunk.CHUNK_SIZE``): SGLang's Mamba
# radix cache tracks per-chunk states ``h`` on this grid, so the reference keeps it.
CHUNK_SIZE = 64
# The epsilon of the query/key L2 normalisation in FLA's and SGLang's kernels
# (``l2norm_fwd``; ``tl.sqrt(sum(x * x) + 1e-6)`` in the decode kernels).
L2NORM_EPS = 1e-6
# SGLang's ``PAD_SLOT_ID``: a state index meaning "padding row, touch no state".
PAD_SLOT_ID = -1


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim, in float32."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2NORM_EPS)


def gdn_decay(
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
) -> torch.Tensor:
    """The log decay ``g = -exp(A_log) * softplus(a + dt_bias)`` (float32, ``a``'s shape)."""
    x = a.float() + dt_bias.float()
    soft = F.softplus(x, beta=softplus_beta, threshold=softplus_threshold)
    return -torch.exp(A_log.float()) * soft


def expand_heads(x: torch.Tensor, num_v_heads: int, op: str) -> torch.Tensor:
    """``[..., H, D]`` -> ``[..., HV, D]``: each query/key head serves ``HV // H`` value heads.

    Value head ``hv`` reads key head ``hv // (HV // H)``, as FLA's kernels index it.
    """
    heads = x.shape[-2]
    if heads == 0 or num_v_heads % heads:
        raise ValueError(
            f"{op}: the value heads ({num_v_heads}) must be a multiple of the query/key heads "
            f"({heads})"
        )
    return x.repeat_interleave(num_v_heads // heads, dim=-2) if num_v_heads != heads else x


def check_state_indices(
    op: str, indices: torch.Tensor, pool_slots: int, *, allow_padding: bool = True
) -> list[int]:
    """The indices as ints; one outside the pool is an ``IndexError`` naming ``op``.

    A state index selects the pool row a request reads and writes in place; an index past the
    pool would write another request's (or another tensor's) memory, so it is refused, never
    clamped. ``PAD_SLOT_ID`` (-1) marks a padding row where the caller allows padding.
    """
    values = [int(i) for i in indices.reshape(-1).tolist()]
    for position, value in enumerate(values):
        if 0 <= value < pool_slots or (allow_padding and value == PAD_SLOT_ID):
            continue
        allowed = f"0..{pool_slots - 1}" if pool_slots else "none (the pool is empty)"
        padding = f", or {PAD_SLOT_ID} for a padding row" if allow_padding else ""
        raise IndexError(
            f"{op}: state index {value} at position {position} is outside the state pool of "
            f"{pool_slots} slots (allowed: {allowed}{padding})"
        )
    return values


def check_cu_seqlens(op: str, cu_seqlens: torch.Tensor, total_tokens: int) -> list[int]:
    """``cu_seqlens`` as ints: starting at 0, non-decreasing, ending at ``total_tokens``."""
    bounds = [int(i) for i in cu_seqlens.reshape(-1).tolist()]
    if (
        not bounds
        or bounds[0] != 0
        or bounds[-1] != total_tokens
        or any(b < a for a, b in itertools.pairwise(bounds))
    ):
        raise ValueError(
            f"{op}: cu_seqlens {bounds} must start at 0, never decrease and end at the "
            f"number of tokens ({total_tokens})"
        )
    return bounds


def recurrent_step(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token for a batch of sequences, in float32; returns ``(o, new_state)``.

    ``state`` ``[B, HV, V, K]``, ``q``/``k`` ``[B, HV, K]`` (q already scaled), ``v``
    ``[B, HV, V]``, ``g``/``beta`` ``[B, HV]``; ``o`` is ``[B, HV, V]``.
    """
    state = state * torch.exp(g)[..., None, None]  # a new tensor: the caller's is not written
    read = (state @ k.unsqueeze(-1)).squeeze(-1)
    delta = (v - read) * beta[..., None]
    state.addcmul_(delta.unsqueeze(-1), k.unsqueeze(-2))
    return (state @ q.unsqueeze(-1)).squeeze(-1), state


def chunked_sequence(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One sequence, chunk by chunk, in float32; returns ``(o, final_state, chunk_states)``.

    ``state`` ``[HV, V, K]``; ``q``/``k`` ``[T, HV, K]`` (q already scaled), ``v``
    ``[T, HV, V]``, ``g``/``beta`` ``[T, HV]``. ``o`` is ``[T, HV, V]``; ``chunk_states`` is
    ``[ceil(T / C), HV, V, K]``, the state *before* each chunk (FLA's ``h``).

    Within a chunk, with ``G_i`` the cumulative log decay up to token ``i``, the delta-rule
    updates ``u_i = beta_i (v_i - S_{i-1} k_i)`` satisfy the unit lower-triangular system
    ``(I + A) U = beta * (V - exp(G) S_0 K^T)`` with ``A_ij = beta_i exp(G_i - G_j) k_i . k_j``
    for ``j < i``, solved for both right-hand sides at once with one triangular solve.
    """
    tokens, heads, dk = k.shape
    dv = v.shape[-1]
    chunks = -(-tokens // chunk_size)
    padded = chunks * chunk_size
    if padded != tokens:  # zero keys, values and decays: padding changes no state
        pad = padded - tokens
        q = F.pad(q, (0, 0, 0, 0, 0, pad))
        k = F.pad(k, (0, 0, 0, 0, 0, pad))
        v = F.pad(v, (0, 0, 0, 0, 0, pad))
        g = F.pad(g, (0, 0, 0, pad))
        beta = F.pad(beta, (0, 0, 0, pad))
    # [HV, N, C, D]: heads and chunks batched, tokens of one chunk in the rows.
    q, k, v = (
        x.reshape(chunks, chunk_size, heads, -1).permute(2, 0, 1, 3).contiguous() for x in (q, k, v)
    )
    g = g.reshape(chunks, chunk_size, heads).permute(2, 0, 1).cumsum(dim=-1)
    beta = beta.reshape(chunks, chunk_size, heads).permute(2, 0, 1)

    lower = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=k.device).tril()
    gap = g[..., :, None] - g[..., None, :]
    decay = gap.masked_fill(~lower, float("-inf")).exp()  # [HV, N, C, C], 0 above
    kk = k @ k.transpose(-1, -2)
    system = (beta[..., None] * kk * decay).tril(-1) + torch.eye(chunk_size, device=k.device)
    k_beta_decayed = beta[..., None] * torch.exp(g)[..., None] * k  # [HV, N, C, K]
    rhs = torch.cat((beta[..., None] * v, k_beta_decayed), dim=-1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    u, w = solved[..., :dv], solved[..., dv:]  # value part and state-read part
    attend = (q @ k.transpose(-1, -2)) * decay  # causal, diagonal included
    q_decayed = q * torch.exp(g)[..., None]
    last = g[..., -1]  # [HV, N]
    k_to_end = k * torch.exp(last[..., None] - g)[..., None]

    out = torch.empty(heads, chunks, chunk_size, dv, dtype=torch.float32, device=k.device)
    states = torch.empty(chunks, heads, dv, dk, dtype=torch.float32, device=k.device)
    u, w = u.contiguous(), w.contiguous()
    for c in range(chunks):
        states[c] = state
        s_t = state.transpose(-1, -2).contiguous()  # [HV, K, V]
        new_v = u[:, c] - w[:, c] @ s_t  # [HV, C, V]
        out[:, c] = q_decayed[:, c] @ s_t + attend[:, c] @ new_v
        state = (
            state * torch.exp(last[:, c])[:, None, None] + new_v.transpose(-1, -2) @ k_to_end[:, c]
        )
    o = out.permute(1, 2, 0, 3).reshape(padded, heads, dv)[:tokens]
    return o, state, states


def prepare_qkv(
    op: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None,
    use_qk_l2norm: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float32 ``q`` (normalised if asked, scaled), ``k`` (normalised if asked), ``v``;
    query/key heads expanded to the value heads."""
    heads_v = v.shape[-2]
    if scale is None:
        scale = k.shape[-1] ** -0.5
    qf, kf = (l2norm(q), l2norm(k)) if use_qk_l2norm else (q.float(), k.float())
    qf = expand_heads(qf * scale, heads_v, op)
    kf = expand_heads(kf, heads_v, op)
    return qf, kf, v.float()


def sequence_bounds(
    op: str, cu_seqlens: torch.Tensor | None, batch: int, tokens: int
) -> Sequence[tuple[int, int, int]]:
    """``(row, start, end)`` per sequence: rows of ``[B, T]`` inputs, or spans of ``cu_seqlens``."""
    if cu_seqlens is None:
        return [(b, 0, tokens) for b in range(batch)]
    if batch != 1:
        raise ValueError(f"{op}: with cu_seqlens the batch dim must be 1, got {batch}")
    bounds = check_cu_seqlens(op, cu_seqlens, tokens)
    return [(0, s, e) for s, e in itertools.pairwise(bounds)]
