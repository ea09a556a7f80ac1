"""``fused_qkvzba_split_reshape_cat(_contiguous)`` and ``fused_gdn_gating``: GDN's input side.

The splits are SGLang's ``sglang.kernels.ops.attention.triton_gdn_fused_proj``'s: Qwen3-Next's
packed projection holds, per key head, ``[q | k | v (r heads) | z (r heads)]`` and ``[b (r) |
a (r)]`` with ``r = HV / H``; SGLang's model takes this Triton path when ``r`` is 1, 2 or 4.
Qwen3.5's (``models/qwen3_5.py``, every ratio) is not interleaved: ``[all q | all k | all v |
all z]`` and ``[all b | all a]``; the outputs are the same.
The gating is ``sglang.kernels.ops.attention.linear.fused_gdn_gating``'s (prefill).
"""

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
    random_tensor,
)
from ._gdn import gdn_decay

__all__ = [
    "FUSED_GDN_GATING",
    "FUSED_QKVZBA_SPLIT_RESHAPE_CAT",
    "FUSED_QKVZBA_SPLIT_RESHAPE_CAT_CONTIGUOUS",
]


def _split_signature(
    obj: Any,
    mixed_qkvz: torch.Tensor,
    mixed_ba: torch.Tensor,
    num_heads_qk: int,
    num_heads_v: int,
    head_qk: int,
    head_v: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unpack Qwen3-Next's per-key-head interleaved projections into GDN's operands.

    ``mixed_qkvz`` ``[T, H * (2 * head_qk + 2 * r * head_v)]``, ``mixed_ba`` ``[T, H * 2 * r]``
    with ``r = num_heads_v / num_heads_qk`` (an integer). Returns new tensors ``(mixed_qkv,
    z, b, a)``: ``mixed_qkv`` ``[T, 2 * H * head_qk + HV * head_v]`` (all q heads, all k heads,
    all v heads: the convolution's input), ``z`` ``[T, HV, head_v]``, ``b`` and ``a``
    ``[T, HV]``; dtypes as the inputs'. A pure permutation: results are exact.
    """
    raise NotImplementedError


def fused_qkvzba_split_reshape_cat(
    obj: Any,
    mixed_qkvz: torch.Tensor,
    mixed_ba: torch.Tensor,
    num_heads_qk: int,
    num_heads_v: int,
    head_qk: int,
    head_v: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Views and one ``cat``; works for any integer head ratio."""
    if num_heads_qk <= 0 or num_heads_v % num_heads_qk:
        raise ValueError(
            f"fused_qkvzba_split_reshape_cat: num_heads_v ({num_heads_v}) must be a positive "
            f"multiple of num_heads_qk ({num_heads_qk})"
        )
    r = num_heads_v // num_heads_qk
    tokens = mixed_qkvz.shape[0]
    grouped = mixed_qkvz.reshape(tokens, num_heads_qk, 2 * head_qk + 2 * r * head_v)
    q, k, v, z = torch.split(grouped, [head_qk, head_qk, r * head_v, r * head_v], dim=-1)
    ba = mixed_ba.reshape(tokens, num_heads_qk, 2 * r)
    b, a = torch.split(ba, [r, r], dim=-1)
    mixed_qkv = torch.cat(
        (
            q.reshape(tokens, num_heads_qk * head_qk),
            k.reshape(tokens, num_heads_qk * head_qk),
            v.reshape(tokens, num_heads_v * head_v),
        ),
        dim=-1,
    )
    return (
        mixed_qkv,
        z.reshape(tokens, num_heads_v, head_v).contiguous(),
        b.reshape(tokens, num_heads_v).contiguous(),
        a.reshape(tokens, num_heads_v).contiguous(),
    )


def _contiguous_signature(
    obj: Any,
    mixed_qkvz: torch.Tensor,
    mixed_ba: torch.Tensor,
    num_heads_qk: int,
    num_heads_v: int,
    head_qk: int,
    head_v: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unpack Qwen3.5's non-interleaved projections into GDN's operands.

    ``mixed_qkvz`` ``[T, 2 * H * head_qk + 2 * HV * head_v]`` laid out ``[all q | all k | all
    v | all z]``, ``mixed_ba`` ``[T, 2 * HV]`` laid out ``[all b | all a]`` (rows may be
    strided); ``HV`` a multiple of ``H``. Returns new tensors ``(mixed_qkv, z, b, a)`` shaped
    as ``fused_qkvzba_split_reshape_cat``'s: ``mixed_qkv`` ``[T, 2 * H * head_qk + HV *
    head_v]``, ``z`` ``[T, HV, head_v]``, ``b`` and ``a`` ``[T, HV]``. A pure copy: exact.
    """
    raise NotImplementedError


def fused_qkvzba_split_reshape_cat_contiguous(
    obj: Any,
    mixed_qkvz: torch.Tensor,
    mixed_ba: torch.Tensor,
    num_heads_qk: int,
    num_heads_v: int,
    head_qk: int,
    head_v: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Slices and copies; the input already holds ``mixed_qkv`` as its leading columns."""
    if num_heads_qk <= 0 or num_heads_v % num_heads_qk:
        raise ValueError(
            f"fused_qkvzba_split_reshape_cat_contiguous: num_heads_v ({num_heads_v}) must be a "
            f"positive multiple of num_heads_qk ({num_heads_qk})"
        )
    tokens = mixed_qkvz.shape[0]
    qkv_dim = 2 * num_heads_qk * head_qk + num_heads_v * head_v
    z = mixed_qkvz[:, qkv_dim : qkv_dim + num_heads_v * head_v]
    return (
        mixed_qkvz[:, :qkv_dim].contiguous(),
        z.reshape(tokens, num_heads_v, head_v).contiguous(),
        mixed_ba[:, :num_heads_v].contiguous(),
        mixed_ba[:, num_heads_v : 2 * num_heads_v].contiguous(),
    )


# (H, HV, head_qk, head_v): the ratios SGLang's Triton path takes (1, 2, 4) and one it does not.
SPLIT_HEADS = ((2, 2, 16, 16), (2, 4, 16, 8), (1, 4, 8, 8), (2, 6, 8, 16))


def _split_name(p: Mapping[str, Any]) -> str:
    h, hv, dk, dv = p["heads"]
    name = f"tokens={p['tokens']},heads={h}/{hv},k={dk},v={dv}"
    return name + ("" if p["contiguous"] else ",strided")


_SPLIT_PARAMS: tuple[dict[str, Any], ...] = (
    *({"tokens": t, "heads": SPLIT_HEADS[1], "contiguous": True} for t in (0, 1, 7)),
    *({"tokens": 5, "heads": heads, "contiguous": True} for heads in SPLIT_HEADS),
    {"tokens": 6, "heads": SPLIT_HEADS[3], "contiguous": False},
)
SPLIT_CASES = tuple(OpCase(_split_name(p), p) for p in _SPLIT_PARAMS)


def _split_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    p = case.params
    h, hv, dk, dv = p["heads"]
    r = hv // h
    qkvz = random_tensor(
        (p["tokens"], h * (2 * dk + 2 * r * dv)),
        dtype,
        device,
        generator,
        contiguous=p["contiguous"],
    )
    ba = random_tensor((p["tokens"], h * 2 * r), dtype, device, generator)
    return OpInputs(obj=None, args=(qkvz, ba, h, hv, dk, dv), preserved=("mixed_qkvz", "mixed_ba"))


_EXACT = {dtype: STANDARD_TOLERANCES[dtype] for dtype in STANDARD_DTYPES}

FUSED_QKVZBA_SPLIT_RESHAPE_CAT = OpContract(
    name="fused_qkvzba_split_reshape_cat",
    sglang_layer="fused_qkvzba_split_reshape_cat (kernel function, Qwen3-Next)",
    summary="Unpack Qwen3-Next's interleaved qkvz/ba projections into mixed_qkv, z, b, a",
    signature=inspect.signature(_split_signature),
    details=inspect.getdoc(_split_signature) or "",
    reference=fused_qkvzba_split_reshape_cat,
    dtypes=STANDARD_DTYPES,
    tolerances=_EXACT,
    cases=SPLIT_CASES,
    make_inputs=_split_inputs,
)


def _contiguous_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    p = case.params
    h, hv, dk, dv = p["heads"]
    qkvz = random_tensor(
        (p["tokens"], 2 * h * dk + 2 * hv * dv),
        dtype,
        device,
        generator,
        contiguous=p["contiguous"],
    )
    ba = random_tensor((p["tokens"], 2 * hv), dtype, device, generator)
    return OpInputs(obj=None, args=(qkvz, ba, h, hv, dk, dv), preserved=("mixed_qkvz", "mixed_ba"))


FUSED_QKVZBA_SPLIT_RESHAPE_CAT_CONTIGUOUS = OpContract(
    name="fused_qkvzba_split_reshape_cat_contiguous",
    sglang_layer="fused_qkvzba_split_reshape_cat_contiguous (kernel function, Qwen3.5)",
    summary="Unpack Qwen3.5's [q|k|v|z]/[b|a] projections into mixed_qkv, z, b, a",
    signature=inspect.signature(_contiguous_signature),
    details=inspect.getdoc(_contiguous_signature) or "",
    reference=fused_qkvzba_split_reshape_cat_contiguous,
    dtypes=STANDARD_DTYPES,
    tolerances=_EXACT,
    cases=SPLIT_CASES,
    make_inputs=_contiguous_inputs,
)


def _gating_signature(
    obj: Any,
    A_log: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dt_bias: torch.Tensor,
    beta: float = 1.0,
    threshold: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDN's prefill gates per token and value head.

    ``a``/``b`` ``[T, HV]`` (rows may be strided), ``A_log``/``dt_bias`` ``[HV]``. Returns
    float32 ``(g, beta_out)``, each ``[1, T, HV]``: ``g = -exp(A_log) * softplus(a +
    dt_bias)`` with softplus ``(1/beta) * log(1 + exp(beta * x))``, linear above
    ``threshold``; ``beta_out = sigmoid(b)`` rounded to ``b``'s dtype (as SGLang's kernel
    stores it) and returned in float32.
    """
    raise NotImplementedError


def fused_gdn_gating(
    obj: Any,
    A_log: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dt_bias: torch.Tensor,
    beta: float = 1.0,
    threshold: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same math as SGLang's ``fused_gdn_gating_kernel``."""
    g = gdn_decay(A_log, a, dt_bias, beta, threshold)
    beta_out = torch.sigmoid(b.float()).to(b.dtype).float()
    return g.unsqueeze(0), beta_out.unsqueeze(0)


def _gating_name(p: Mapping[str, Any]) -> str:
    return f"tokens={p['tokens']},heads={p['heads']}" + ("" if p["contiguous"] else ",strided")


GATING_CASES = tuple(
    OpCase(_gating_name(p), p)
    for p in (
        *({"tokens": t, "heads": 4, "contiguous": True} for t in (0, 1, 7, 33)),
        {"tokens": 7, "heads": 6, "contiguous": True},
        {"tokens": 7, "heads": 4, "contiguous": False},
    )
)


def _gating_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    p = case.params
    hv = p["heads"]
    a = random_tensor((p["tokens"], hv), dtype, device, generator, contiguous=p["contiguous"])
    # Some a + dt_bias far past the threshold, where softplus is linear.
    a.mul_(8.0)  # in place: a strided view stays strided
    b = random_tensor((p["tokens"], hv), dtype, device, generator)
    A_log = torch.log(1.0 + 4.0 * torch.rand(hv, generator=generator)).to(device)
    dt_bias = random_tensor((hv,), dtype, device, generator)
    return OpInputs(obj=None, args=(A_log, a, b, dt_bias), preserved=("A_log", "a", "b", "dt_bias"))


FUSED_GDN_GATING = OpContract(
    name="fused_gdn_gating",
    sglang_layer="fused_gdn_gating (kernel function, GDN prefill)",
    summary="GDN gates: g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), fp32",
    signature=inspect.signature(_gating_signature),
    details=inspect.getdoc(_gating_signature) or "",
    reference=fused_gdn_gating,
    dtypes=STANDARD_DTYPES,
    tolerances=STANDARD_TOLERANCES,
    cases=GATING_CASES,
    make_inputs=_gating_inputs,
)
