"""``rms_norm_gated``: GDN's output norm, ``rmsnorm(x) * weight * act(gate)``.

SGLang 0.5.23's Qwen3-Next builds ``sglang.kernels.ops.attention.fla.fused_norm_gate.
FusedRMSNormGated`` (eager) or ``fla.layernorm_gated.RMSNorm`` (piecewise CUDA graphs): plain
``nn.Module``s whose forward launches a Triton kernel, so neither runs without a Triton driver.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from ..contract import (
    STANDARD_DTYPES,
    STANDARD_TOLERANCES,
    OpCase,
    OpContract,
    OpInputs,
    layer,
    random_tensor,
)

__all__ = ["GATE_ACTIVATIONS", "RMS_NORM_GATED"]

# SGLang's names for the gate's activation ("swish" is SiLU).
GATE_ACTIVATIONS = ("swish", "silu", "sigmoid")


def _signature(obj: Any, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``rmsnorm(x) * obj.weight * act(gate)`` per row of ``x`` ``[T, hidden]``.

    ``obj`` has ``weight`` ``[hidden]``, ``eps``, ``activation`` (``"swish"``/``"silu"``: SiLU,
    ``"sigmoid"``), and optionally ``norm_before_gate`` (default ``True``; ``False`` gates
    first, then normalises) and ``group_size`` (default ``None``: one group; else the norm
    runs over groups of that many channels). ``gate`` is ``x``'s shape; rows may be strided.
    float32 inside, the result in ``x``'s dtype, a new tensor; inputs are not written.
    """
    raise NotImplementedError


def rms_norm_gated(obj: Any, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Same math as SGLang's ``rms_norm_ref`` (``fla/layernorm_gated.py``) with the gate's
    activation as the module says."""
    activation = obj.activation
    if activation not in GATE_ACTIVATIONS:
        raise ValueError(
            f"rms_norm_gated: activation {activation!r} is not one of "
            f"{', '.join(map(repr, GATE_ACTIVATIONS))}"
        )
    xf, zf = x.float(), gate.float()
    gated = torch.sigmoid(zf) if activation == "sigmoid" else F.silu(zf)
    norm_before_gate = getattr(obj, "norm_before_gate", True)
    group_size = getattr(obj, "group_size", None) or x.shape[-1]
    if not norm_before_gate:
        xf = xf * gated
    groups = xf.unflatten(-1, (-1, group_size))
    rstd = torch.rsqrt(groups.square().mean(dim=-1, keepdim=True) + obj.eps)
    out = (groups * rstd).flatten(-2) * obj.weight.float()
    if norm_before_gate:
        out = out * gated
    result: torch.Tensor = out.to(x.dtype)
    return result


def _name(p: Mapping[str, Any]) -> str:
    name = f"tokens={p['tokens']},hidden={p['hidden']},activation={p['activation']}"
    name += "" if p.get("norm_before_gate", True) else ",gate-first"
    name += f",group={p['group']}" if p.get("group") else ""
    return name + (",strided" if p.get("strided") else "")


_PARAMS: tuple[dict[str, Any], ...] = (
    *({"tokens": t, "hidden": 16, "activation": "silu"} for t in (0, 1, 7, 33)),
    {"tokens": 7, "hidden": 128, "activation": "swish"},
    {"tokens": 7, "hidden": 16, "activation": "sigmoid"},
    {"tokens": 5, "hidden": 32, "activation": "swish", "norm_before_gate": False},
    {"tokens": 5, "hidden": 32, "activation": "swish", "group": 8},
    {"tokens": 7, "hidden": 16, "activation": "silu", "strided": True},
)
CASES = tuple(OpCase(_name(p), p) for p in _PARAMS)


def _make_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    p = case.params
    shape = (p["tokens"], p["hidden"])
    x = random_tensor(shape, dtype, device, generator, contiguous=not p.get("strided"))
    gate = random_tensor(shape, dtype, device, generator, contiguous=not p.get("strided"))
    noise = random_tensor((p["hidden"],), torch.float32, device, generator)
    obj = layer(
        weight=(1.0 + 0.1 * noise).to(dtype),
        eps=1e-6,
        activation=p["activation"],
        norm_before_gate=p.get("norm_before_gate", True),
        group_size=p.get("group"),
        hidden_size=p["hidden"],
    )
    return OpInputs(obj=obj, args=(x, gate), preserved=("x", "gate"))


RMS_NORM_GATED = OpContract(
    name="rms_norm_gated",
    sglang_layer="FusedRMSNormGated / fla RMSNorm (gated)",
    summary="Gated RMS norm: rmsnorm(x) * weight * silu|sigmoid(gate), fp32 inside",
    signature=inspect.signature(_signature),
    details=inspect.getdoc(_signature) or "",
    reference=rms_norm_gated,
    dtypes=STANDARD_DTYPES,
    tolerances=STANDARD_TOLERANCES,
    cases=CASES,
    make_inputs=_make_inputs,
)
