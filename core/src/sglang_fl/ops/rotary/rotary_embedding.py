"""``rotary_embedding``: SGLang's ``RotaryEmbedding`` applied to the rotary part of q and k."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from ..contract import (
    STANDARD_DTYPES,
    STANDARD_TOLERANCES,
    OpCase,
    OpContract,
    OpInputs,
    axis,
    case_grid,
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
    ``num_tokens`` may be 0; rows may be strided (q and k cut from one packed qkv tensor).
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


def _case_name(p: Mapping[str, Any]) -> str:
    name = f"tokens={p['tokens']},heads={p['q_heads']}/{p['kv_heads']},rotary_dim={p['rotary_dim']}"
    name += f"/{p['head_size']}" if p["rotary_dim"] < p["head_size"] else ""
    name += ",interleaved" if p["interleaved"] else ",neox"
    name += ",inplace" if p["inplace"] else ",out-of-place"
    return name + (",packed-qkv" if p["packed"] else "")


_GQA = {"q_heads": 4, "kv_heads": 2}
# Full rotary, and partial rotary (the leading half of each head).
_DIMS = ({"head_size": 16, "rotary_dim": 16}, {"head_size": 64, "rotary_dim": 32})
_STYLES, _MODES = axis("interleaved", (False, True)), axis("inplace", (True, False))
CASES = (
    *case_grid(
        _case_name,
        axis("tokens", (1, 5, 17)),
        ({"q_heads": 1, "kv_heads": 1}, _GQA),
        _DIMS,
        _STYLES,
        _MODES,
        axis("packed", (False,)),
    ),
    # q and k as SGLang hands them over: views into the packed qkv projection output, so rows
    # are strided even when the whole head is rotated.
    *case_grid(
        _case_name, axis("tokens", (5,)), (_GQA,), _DIMS, _STYLES, _MODES, axis("packed", (True,))
    ),
    # An empty batch (0 tokens).
    *case_grid(
        _case_name,
        axis("tokens", (0,)),
        (_GQA,),
        (_DIMS[1],),
        axis("interleaved", (False,)),
        _MODES,
        axis("packed", (False,)),
    ),
)


def _heads(
    p: Mapping[str, Any], dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Full ``[tokens, heads, head_size]`` query and key, separate or cut from one qkv buffer."""
    tokens, head_size, q_heads, kv_heads = p["tokens"], p["head_size"], p["q_heads"], p["kv_heads"]
    if not p["packed"]:
        query = random_tensor((tokens, q_heads, head_size), dtype, device, generator)
        return query, random_tensor((tokens, kv_heads, head_size), dtype, device, generator)
    width = (q_heads + 2 * kv_heads) * head_size  # q, k and v side by side in each row
    qkv = random_tensor((tokens, width), dtype, device, generator)
    q_end, k_end = q_heads * head_size, (q_heads + kv_heads) * head_size
    query = qkv[:, :q_end].view(tokens, q_heads, head_size)
    return query, qkv[:, q_end:k_end].view(tokens, kv_heads, head_size)


def _make_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    p = case.params
    rotary_dim, head_size = p["rotary_dim"], p["head_size"]
    # Partial rotary: q and k are the leading rotary_dim columns of each head (strided views).
    query_full, key_full = _heads(p, dtype, device, generator)
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


# Layer attribute holding (cos, sin, joined cache) for the last cos/sin pair a kernel was given.
_JOINED_CACHE_ATTR = "_sglang_fl_joined_cos_sin_cache"


def joined_cos_sin_cache(obj: Any, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``cat(cos, sin)``: the ``[max_positions, rotary_dim]`` cache rope kernels read, from the
    ``cos``/``sin`` halves the standard signature passes (for vendor kernels).

    Built once per cos/sin pair and kept on the layer: callers pass the same tensors on every
    call (the SGLang bridge converts the layer's cache once per dtype), so after the first call
    this is one attribute read.
    """
    memo = getattr(obj, _JOINED_CACHE_ATTR, None)
    if memo is None or memo[0] is not cos or memo[1] is not sin:
        memo = (cos, sin, torch.cat((cos, sin), dim=-1))
        setattr(obj, _JOINED_CACHE_ATTR, memo)
    joined: torch.Tensor = memo[2]
    return joined


CONTRACT = OpContract(
    name="rotary_embedding",
    sglang_layer="RotaryEmbedding",
    summary="Rotary position embedding of q and k (neox or interleaved, partial rotary)",
    signature=inspect.signature(_signature),
    details=inspect.getdoc(_signature) or "",
    reference=reference,
    dtypes=STANDARD_DTYPES,
    tolerances=STANDARD_TOLERANCES,
    cases=CASES,
    make_inputs=_make_inputs,
    reference_traceable=True,
)
