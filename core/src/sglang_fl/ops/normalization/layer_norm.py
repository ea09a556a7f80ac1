"""``layer_norm``: SGLang's ``LayerNorm`` (vision towers, encoders), in its compute dtype."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from ..contract import (
    STANDARD_DTYPES,
    STANDARD_TOLERANCES,
    TOKEN_COUNTS,
    OpCase,
    OpContract,
    OpInputs,
    axis,
    case_grid,
    layer,
    random_tensor,
)

# (elementwise_affine, use_bias): the three forms LayerNorm's options give.
_AFFINE_FORMS = (
    {"affine": True, "bias": True},
    {"affine": True, "bias": False},
    {"affine": False, "bias": False},
)


def _signature(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """Layer-normalise ``x`` ``[num_tokens, hidden]`` over its last dim into a new tensor.

    Reads ``obj.hidden_size``, ``obj.variance_epsilon``, ``obj.dtype`` (the compute dtype:
    ``x`` is converted to it, normalised, and the result converted back to ``x``'s dtype),
    ``obj.weight`` and ``obj.bias`` (``[hidden]``, in ``obj.dtype``), applied only when
    ``obj.elementwise_affine`` and ``obj.use_bias`` are true respectively. ``x`` stays
    untouched; ``num_tokens`` may be 0; ``x`` may be strided.
    """
    raise NotImplementedError


def reference(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """Same math as ``LayerNorm.forward_native``."""
    weight = obj.weight if obj.elementwise_affine else None
    bias = obj.bias if obj.use_bias else None
    return F.layer_norm(
        x.to(obj.dtype), (obj.hidden_size,), weight=weight, bias=bias, eps=obj.variance_epsilon
    ).to(x.dtype)


def _case_name(p: Mapping[str, Any]) -> str:
    name = f"tokens={p['tokens']},hidden={p['hidden']}"
    name += ",weight" if p["affine"] else ",no-weight"
    name += ",bias" if p["bias"] else ""
    name += ",compute=float32" if p["fp32_compute"] else ",compute=input"
    return name + ("" if p["contiguous"] else ",strided")


CASES = case_grid(
    _case_name,
    axis("tokens", TOKEN_COUNTS),
    axis("hidden", (16, 1024)),
    _AFFINE_FORMS,
    axis("fp32_compute", (True, False)),
    axis("contiguous", (True, False)),
)


def _make_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    p = case.params
    hidden = p["hidden"]
    x = random_tensor((p["tokens"], hidden), dtype, device, generator, contiguous=p["contiguous"])
    compute = torch.float32 if p["fp32_compute"] else dtype
    weight = 1.0 + 0.1 * random_tensor((hidden,), torch.float32, device, generator)
    bias = 0.1 * random_tensor((hidden,), torch.float32, device, generator)
    obj = layer(
        hidden_size=hidden,
        variance_epsilon=1e-6,
        elementwise_affine=p["affine"],
        use_bias=p["bias"],
        dtype=compute,
        weight=weight.to(compute),
        bias=bias.to(compute),
    )
    return OpInputs(obj=obj, args=(x,), preserved=("x",))


CONTRACT = OpContract(
    name="layer_norm",
    sglang_layer="LayerNorm",
    summary="Layer normalisation with optional weight and bias, in the layer's compute dtype",
    signature=inspect.signature(_signature),
    details=inspect.getdoc(_signature) or "",
    reference=reference,
    dtypes=STANDARD_DTYPES,
    tolerances=STANDARD_TOLERANCES,
    cases=CASES,
    make_inputs=_make_inputs,
)
