"""``rotary_embedding``: SGLang's ``RotaryEmbedding`` applied to the rotary part of q and k."""

from __future__ import annotations

import inspect
import itertools
from typing import Any

import torch

from .contract import (
    STANDARD_DTYPES,
    STANDARD_TOLERANCES,
    OpCase,
    OpContract,
    OpInputs,
    layer,
    random_tensor,
)

MAX_POSITIONS = 64


def _signature(
    obj: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: torch.Tensor,
    rotary_interleaved: bool = False,
    inplace: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``query`` ``[num_tokens, num_q_heads, rotary_dim]`` and ``key`` (same, kv heads).

    ``cos``/``sin`` are ``[max_positions, rotary_dim // 2]`` in the query's dtype, indexed by
    ``position_ids`` ``[num_tokens]``. ``rotary_interleaved=False`` is the neox style (rotate
    halves), ``True`` the GPT-J style (rotate even/odd pairs). With ``inplace=True`` the results
    are written into ``query`` and ``key`` (which may be strided views of a wider head) and
    returned; with ``inplace=False`` both inputs stay untouched and new tensors are returned.
    """
    raise NotImplementedError


def rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool
) -> torch.Tensor:
    """SGLang's ``apply_rotary_emb`` arithmetic on ``x`` ``[..., rotary_dim]``, in x's dtype."""
    if interleaved:
        x1, x2 = x[..., ::2], x[..., 1::2]
    else:
        x1, x2 = torch.chunk(x, 2, dim=-1)
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    if interleaved:
        return torch.stack((o1, o2), dim=-1).flatten(-2)
    return torch.cat((o1, o2), dim=-1)


def reference(
    obj: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: torch.Tensor,
    rotary_interleaved: bool = False,
    inplace: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same math as ``RotaryEmbedding.forward_native`` (``apply_rotary_emb``), in query dtype."""
    cos = cos.index_select(0, position_ids).unsqueeze(-2).to(query.dtype)
    sin = sin.index_select(0, position_ids).unsqueeze(-2).to(query.dtype)
    query_out = rotate(query, cos, sin, rotary_interleaved)
    key_out = rotate(key, cos, sin, rotary_interleaved)
    if not inplace:
        return query_out, key_out
    query.copy_(query_out)
    key.copy_(key_out)
    return query, key


def _cases() -> tuple[OpCase, ...]:
    cases = []
    for tokens, (q_heads, kv_heads), (
        head_size,
        rotary_dim,
    ), interleaved, inplace in itertools.product(
        (1, 5, 17), ((1, 1), (4, 2)), ((16, 16), (64, 32)), (False, True), (True, False)
    ):
        partial = rotary_dim < head_size
        name = f"tokens={tokens},heads={q_heads}/{kv_heads},rotary_dim={rotary_dim}"
        name += f"/{head_size}" if partial else ""
        name += ",interleaved" if interleaved else ",neox"
        name += ",inplace" if inplace else ",out-of-place"
        params = {
            "tokens": tokens,
            "q_heads": q_heads,
            "kv_heads": kv_heads,
            "head_size": head_size,
            "rotary_dim": rotary_dim,
            "interleaved": interleaved,
            "inplace": inplace,
        }
        cases.append(OpCase(name, params))
    return tuple(cases)


def _make_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    p = case.params
    rotary_dim, head_size = p["rotary_dim"], p["head_size"]
    # Partial rotary: q and k are the leading rotary_dim columns of each head (strided views).
    query_full = random_tensor((p["tokens"], p["q_heads"], head_size), dtype, device, generator)
    key_full = random_tensor((p["tokens"], p["kv_heads"], head_size), dtype, device, generator)
    query, key = query_full[..., :rotary_dim], key_full[..., :rotary_dim]
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    freqs = torch.outer(torch.arange(MAX_POSITIONS, dtype=torch.float32), inv_freq)
    cos, sin = freqs.cos().to(device, dtype), freqs.sin().to(device, dtype)
    positions = torch.randint(
        0, MAX_POSITIONS, (p["tokens"],), generator=generator, dtype=torch.int64
    ).to(device)
    obj = layer(
        head_size=head_size,
        rotary_dim=rotary_dim,
        is_neox_style=not p["interleaved"],
        cos_sin_cache=torch.cat((cos, sin), dim=-1),
    )
    inputs = OpInputs(
        obj=obj,
        args=(query, key, cos, sin, positions),
        kwargs={"rotary_interleaved": p["interleaved"], "inplace": p["inplace"]},
        preserved=("cos", "sin", "position_ids"),
    )
    if p["inplace"]:
        inputs.written_in_place = {0: "query", 1: "key"}
    else:
        inputs.preserved = (*inputs.preserved, "query", "key")
    return inputs


CONTRACT = OpContract(
    name="rotary_embedding",
    sglang_layer="RotaryEmbedding",
    summary="Rotary position embedding of q and k (neox or interleaved, partial rotary)",
    signature=inspect.signature(_signature),
    reference=reference,
    dtypes=STANDARD_DTYPES,
    tolerances=STANDARD_TOLERANCES,
    cases=_cases(),
    make_inputs=_make_inputs,
)
