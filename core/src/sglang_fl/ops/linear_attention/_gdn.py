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

import functools
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


def check_heads(heads: int, num_v_heads: int, op: str) -> int:
    """The value heads per query/key head; a count that does not divide is a ``ValueError``."""
    if heads == 0 or num_v_heads % heads:
        raise ValueError(
            f"{op}: the value heads ({num_v_heads}) must be a multiple of the query/key heads "
            f"({heads})"
        )
    return num_v_heads // heads


def expand_heads(x: torch.Tensor, num_v_heads: int, op: str) -> torch.Tensor:
    """``[..., H, D]`` -> ``[..., HV, D]``: each query/key head serves ``HV // H`` value heads.

    Value head ``hv`` reads key head ``hv // (HV // H)``, as FLA's kernels index it.
    """
    ratio = check_heads(x.shape[-2], num_v_heads, op)
    return x.repeat_interleave(ratio, dim=-2) if ratio != 1 else x


def scrambled_slots(count: int, pool: int) -> torch.Tensor:
    """``count`` distinct rows of a ``pool``-row state pool, int32, in a scrambled order (odd
    rows descending, then even ones): never ``0..count - 1``, so a kernel ignoring the indices
    fails a case, and never one row twice (a batch's rows run concurrently in a kernel)."""
    if count > pool:
        raise ValueError(f"{count} distinct slots do not fit a pool of {pool}")
    order = [*range(pool - 1, -1, -2), *range(pool - 2, -1, -2)]
    return torch.tensor(order[:count], dtype=torch.int32)


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
    *,
    in_place: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token for a batch of sequences, in float32; returns ``(o, new_state)``.

    ``state`` ``[B, HV, V, K]``, ``q``/``k`` ``[B, HV, K]`` (q already scaled), ``v``
    ``[B, HV, V]``, ``g``/``beta`` ``[B, HV]``; ``o`` is ``[B, HV, V]`` (any leading dims that
    broadcast work: grouped heads pass key heads once). ``in_place`` updates ``state`` itself
    (a gathered copy the caller owns); otherwise the caller's state is not written. The reads
    are elementwise products summed over K: for one token a matrix-vector ``bmm`` costs
    several times more on the CPU.
    """
    decay = torch.exp(g)[..., None, None]
    state = state.mul_(decay) if in_place else state * decay
    k_row = k.unsqueeze(-2)
    read = (state * k_row).sum(dim=-1)
    delta = (v - read).mul_(beta.unsqueeze(-1))
    state.addcmul_(delta.unsqueeze(-1), k_row)
    return (state * q.unsqueeze(-2)).sum(dim=-1), state


def _chunk_major(x: torch.Tensor, chunks: int, chunk_size: int) -> torch.Tensor:
    """``[T, h, D]`` -> ``[N, h, C, D]`` contiguous, the tail chunk zero-padded: one copy."""
    tokens, heads, dim = x.shape
    full, tail = divmod(tokens, chunk_size)
    y = x.new_empty(chunks, heads, chunk_size, dim)
    if full:
        y[:full].copy_(x[: full * chunk_size].unflatten(0, (full, chunk_size)).transpose(1, 2))
    if tail:  # zero keys, values, decays and betas: padding changes no state
        y[full, :, :tail].copy_(x[full * chunk_size :].transpose(0, 1))
        y[full, :, tail:].zero_()
    return y


@functools.cache
def _strictly_upper(chunk_size: int, device: torch.device) -> torch.Tensor:
    """The causal mask of one chunk (what token ``i`` may not see), built once per size."""
    return torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=device).triu_(1)


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

    ``state`` ``[HV, V, K]`` (not written); ``q``/``k`` ``[T, H, K]`` (q already scaled; value
    head ``hv`` reads key head ``hv // (HV // H)``), ``v`` ``[T, HV, V]``, ``g``/``beta``
    ``[T, HV]``. ``o`` is ``[T, HV, V]``; ``chunk_states`` is ``[ceil(T / C), HV, V, K]``, the
    state *before* each chunk (FLA's ``h``).

    Within a chunk, with ``G_i`` the cumulative log decay up to token ``i``, the delta-rule
    updates ``u_i = beta_i (v_i - S_{i-1} k_i)`` satisfy the unit lower-triangular system
    ``(I + A) U = beta * (V - exp(G) S_0 K^T)`` with ``A_ij = beta_i exp(G_i - G_j) k_i . k_j``
    for ``j < i``. Everything but the carried state is batched over chunks and heads (one
    triangular inverse for both right-hand sides, key-head products formed once per key head,
    not per value head); the loop over chunks only carries the state, and it reads and writes
    the ``[V, K]`` layout in place through transposed matmul operands, never copying it.
    """
    tokens, heads, dk = k.shape
    heads_v, dv = v.shape[-2], v.shape[-1]
    ratio, size = heads_v // heads, chunk_size
    chunks = -(-tokens // size)
    # [N, h, C, D]: chunks and heads batched, tokens of one chunk in the rows.
    qc, kc, vc = (_chunk_major(x, chunks, size) for x in (q, k, v))
    gc = _chunk_major(g.unsqueeze(-1), chunks, size).squeeze(-1).cumsum_(dim=-1)  # [N, HV, C]
    bc = _chunk_major(beta.unsqueeze(-1), chunks, size)  # [N, HV, C, 1]

    def per_value_head(key_side: torch.Tensor, value_side: torch.Tensor) -> torch.Tensor:
        """A key-head tensor ``[N, H, C, X]`` times a value-head one ``[N, HV, C, Y]``."""
        grouped = key_side.unsqueeze(2) * value_side.view(chunks, heads, ratio, size, -1)
        return grouped.view(chunks, heads_v, size, -1)

    decay = (gc.unsqueeze(-1) - gc.unsqueeze(-2)).masked_fill_(
        _strictly_upper(size, k.device), float("-inf")
    )
    decay.exp_()  # [N, HV, C, C]: exp(G_i - G_j) on and below the diagonal, 0 above
    system = per_value_head(kc @ kc.transpose(-1, -2), decay * bc)  # beta_i k_i.k_j decay_ij
    attend = per_value_head(qc @ kc.transpose(-1, -2), decay)  # causal, diagonal included
    eye = torch.eye(size, dtype=torch.float32, device=k.device).expand_as(system)
    # The solver reads only the strictly lower triangle (unit diagonal): no mask needed.
    inverse = torch.linalg.solve_triangular(system, eye, upper=False, unitriangular=True)
    u = inverse @ vc.mul_(bc)  # value part, [N, HV, C, V]
    to_chunk = gc.exp().unsqueeze(-1)  # [N, HV, C, 1]: decay from the chunk's start
    w = inverse @ per_value_head(kc, bc * to_chunk)  # state-read part
    last = gc[..., -1:]  # [N, HV, 1]
    k_to_end = per_value_head(kc, (last - gc).exp_().unsqueeze(-1))
    chunk_decay = last.exp().unsqueeze(-1)  # [N, HV, 1, 1]

    states = torch.empty(chunks + 1, heads_v, dv, dk, dtype=torch.float32, device=k.device)
    states[0] = state
    for c in range(chunks):
        u[c].baddbmm_(w[c], states[c].transpose(-1, -2), alpha=-1)  # u becomes the new values
        torch.mul(states[c], chunk_decay[c], out=states[c + 1])
        states[c + 1].baddbmm_(u[c].transpose(-1, -2), k_to_end[c])
    out = attend @ u
    q_decayed = per_value_head(qc, to_chunk)
    out.view(-1, size, dv).baddbmm_(
        q_decayed.view(-1, size, dk), states[:chunks].view(-1, dv, dk).transpose(-1, -2)
    )
    o = out.transpose(1, 2).reshape(chunks * size, heads_v, dv)[:tokens]
    return o, states[chunks], states[:chunks]


def prepare_qkv(
    op: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None,
    use_qk_l2norm: bool,
    *,
    expand: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float32 ``q`` (normalised if asked, scaled), ``k`` (normalised if asked), ``v``;
    query/key heads expanded to the value heads unless ``expand`` is false (the chunked form
    broadcasts them instead; the head counts are checked either way)."""
    heads_v = v.shape[-2]
    if scale is None:
        scale = k.shape[-1] ** -0.5
    qf, kf = (l2norm(q), l2norm(k)) if use_qk_l2norm else (q.float(), k.float())
    if not expand:
        check_heads(k.shape[-2], heads_v, op)
        return qf * scale, kf, v.float()
    return expand_heads(qf * scale, heads_v, op), expand_heads(kf, heads_v, op), v.float()


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
