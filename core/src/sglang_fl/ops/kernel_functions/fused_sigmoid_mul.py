"""``fused_sigmoid_mul``: the attention output gate of Qwen3.5's full-attention layers.

SGLang 0.5.23's ``models/qwen3_5.py`` gates each full-attention layer's output with
``sglang.kernels.ops.elementwise.elementwise.fused_sigmoid_mul(attn_output, gate,
inplace=True)``, a Triton-only kernel, on every platform but the CPU build of ``sgl_kernel``
and NPU. ``gate`` is the second half of the per-head ``[q | gate]`` projection: a 3-D strided
view ``[T, heads, head_dim]`` (no copy). Its ``quant=True`` form (per-token FP8 output for an
FP8 ``o_proj``) is outside this contract and stays with SGLang.
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
    axis,
    case_grid,
    random_tensor,
)

__all__ = ["FUSED_SIGMOID_MUL"]


def _signature(
    obj: Any, attn_output: torch.Tensor, gate: torch.Tensor, inplace: bool = False
) -> torch.Tensor:
    """``attn_output * sigmoid(gate)``, in float32, rounded once to ``attn_output``'s dtype.

    ``attn_output`` ``[T, hidden]`` (contiguous); ``gate`` either the same shape or ``[T,
    heads, head_dim]`` with ``heads * head_dim == hidden`` and any strides (element ``(t, i)``
    is ``gate[t, i // head_dim, i % head_dim]``). ``inplace=True`` writes the result into
    ``attn_output`` and returns it; otherwise a new tensor, no input written. ``obj`` is
    ``None``: a kernel function has no layer.
    """
    raise NotImplementedError


def reference(
    obj: Any, attn_output: torch.Tensor, gate: torch.Tensor, inplace: bool = False
) -> torch.Tensor:
    """Same math as SGLang's ``_fused_sigmoid_mul_kernel`` (``QUANT=False``)."""
    if gate.dim() == 3 and attn_output.dim() == 2:
        tokens, heads, head_dim = gate.shape
        if attn_output.shape != (tokens, heads * head_dim):
            raise ValueError(
                f"fused_sigmoid_mul: attn_output {tuple(attn_output.shape)} must be [T, heads * "
                f"head_dim] = {(tokens, heads * head_dim)} for a gate {tuple(gate.shape)}"
            )
        gate = gate.reshape(tokens, heads * head_dim)
    elif gate.shape != attn_output.shape:
        raise ValueError(
            f"fused_sigmoid_mul: gate {tuple(gate.shape)} must have attn_output's shape "
            f"{tuple(attn_output.shape)} or be [T, heads, head_dim]"
        )
    result = (attn_output.float() * torch.sigmoid(gate.float())).to(attn_output.dtype)
    if inplace:
        return attn_output.copy_(result)
    return result


def _case_name(p: Mapping[str, Any]) -> str:
    name = f"tokens={p['tokens']},heads={p['heads']},head_dim={p['head_dim']},gate={p['gate']}"
    return name + (",inplace" if p["inplace"] else "")


# gate: "flat" (attn_output's shape), "heads" (a dense [T, heads, head_dim]) or "strided" (the
# second half of a [T, heads, 2 * head_dim] projection, as Qwen3.5 passes it).
CASES = (
    *case_grid(
        _case_name,
        axis("tokens", (0, 1, 7)),
        ({"heads": 2, "head_dim": 16},),
        axis("gate", ("strided",)),
        axis("inplace", (True, False)),
    ),
    *case_grid(
        _case_name,
        axis("tokens", (5,)),
        ({"heads": 4, "head_dim": 32}, {"heads": 3, "head_dim": 24}),
        axis("gate", ("flat", "heads", "strided")),
        axis("inplace", (True, False)),
    ),
)


def _make_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    p = case.params
    tokens, heads, head_dim = p["tokens"], p["heads"], p["head_dim"]
    attn_output = random_tensor((tokens, heads * head_dim), dtype, device, generator)
    if p["gate"] == "flat":
        gate = random_tensor((tokens, heads * head_dim), dtype, device, generator)
    elif p["gate"] == "heads":
        gate = random_tensor((tokens, heads, head_dim), dtype, device, generator)
    else:
        q_gate = random_tensor((tokens, heads, 2 * head_dim), dtype, device, generator)
        gate = q_gate[..., head_dim:]
    if p["inplace"]:
        return OpInputs(
            obj=None,
            args=(attn_output, gate),
            kwargs={"inplace": True},
            preserved=("gate",),
            written_in_place={0: "attn_output"},
        )
    return OpInputs(obj=None, args=(attn_output, gate), preserved=("attn_output", "gate"))


FUSED_SIGMOID_MUL = OpContract(
    name="fused_sigmoid_mul",
    sglang_layer="fused_sigmoid_mul (kernel function, Qwen3.5's attention output gate)",
    summary="Attention output gate: attn_output * sigmoid(gate), strided 3-D gate, in place",
    signature=inspect.signature(_signature),
    details=inspect.getdoc(_signature) or "",
    reference=reference,
    dtypes=STANDARD_DTYPES,
    tolerances=STANDARD_TOLERANCES,
    cases=CASES,
    make_inputs=_make_inputs,
)
