"""Kernel functions SGLang's model code calls directly, outside any fused-op layer.

SGLang 0.5.23's MoE models call a few kernels as plain functions; some exist only as Triton
kernels (``sglang.kernels.ops``), so a model calling one cannot run on a chip without a Triton
backend. Each such function is a standard op here, with a reference, so it can be routed.

Covered (found by reading ``sglang/srt/models/*.py``):

- ``fused_gate_sigmoid_mul``: ``sglang.kernels.ops.elementwise.elementwise``'s
  ``fused_gate_sigmoid_mul`` and ``fused_gate_sigmoid_mul_add``, the shared-expert gate of
  Qwen2-MoE (``qwen2_moe.py``, also used by the models built on its MoE block), called on
  every platform but NPU and Intel AMX.
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

__all__ = ["FUSED_GATE_SIGMOID_MUL"]


def _signature(
    obj: Any,
    hidden_states: torch.Tensor,
    gate_weight: torch.Tensor,
    shared_output: torch.Tensor,
    addend: torch.Tensor | None = None,
) -> torch.Tensor:
    """``sigmoid(hidden_states @ gate_weight) * shared_output (+ addend)``, row by row.

    ``hidden_states`` and ``shared_output`` (and ``addend``) are ``[num_tokens, hidden]``,
    ``gate_weight`` is ``[hidden]``: one scalar gate per token scales that token's shared-expert
    output. The dot product, sigmoid, product and sum are computed in float32 and rounded once
    to ``shared_output``'s dtype. Without ``addend`` a new tensor is returned and no input is
    written; with it an implementation may write the result into ``addend`` (as SGLang's
    ``fused_gate_sigmoid_mul_add`` does), so callers use the returned tensor. ``obj`` is
    ``None``: a kernel function has no layer.
    """
    raise NotImplementedError


def reference(
    obj: Any,
    hidden_states: torch.Tensor,
    gate_weight: torch.Tensor,
    shared_output: torch.Tensor,
    addend: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same math as SGLang's Triton kernel ``_fused_gate_sigmoid_mul_add_kernel``."""
    logit = (hidden_states.float() * gate_weight.float()).sum(dim=-1, keepdim=True)
    result = torch.sigmoid(logit) * shared_output.float()
    if addend is not None:
        result = result + addend.float()
    return result.to(shared_output.dtype)


def _case_name(p: Mapping[str, Any]) -> str:
    name = f"tokens={p['tokens']},hidden={p['hidden']}" + (",addend" if p["addend"] else "")
    return name + ("" if p["contiguous"] else ",strided")


_ADDEND = axis("addend", (False, True))
CASES = (
    *case_grid(
        _case_name,
        axis("tokens", (0, 1, 7, 33)),
        axis("hidden", (16, 128, 2048)),
        _ADDEND,
        axis("contiguous", (True,)),
    ),
    # hidden_states as a strided view (a slice of a wider buffer), with and without the addend.
    *case_grid(
        _case_name,
        axis("tokens", (7,)),
        axis("hidden", (128,)),
        _ADDEND,
        axis("contiguous", (False,)),
    ),
)


def _make_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    p = case.params
    shape = (p["tokens"], p["hidden"])
    hidden_states = random_tensor(shape, dtype, device, generator, contiguous=p["contiguous"])
    # ~1/sqrt(hidden) like a trained gate, so the sigmoid is not saturated.
    gate = random_tensor((p["hidden"],), torch.float32, device, generator) / p["hidden"] ** 0.5
    shared_output = random_tensor(shape, dtype, device, generator)
    args: tuple[Any, ...] = (hidden_states, gate.to(dtype), shared_output)
    if p["addend"]:
        args += (random_tensor(shape, dtype, device, generator),)
    # With an addend, the result may be written into it: it is not preserved, nor required.
    return OpInputs(
        obj=None, args=args, preserved=("hidden_states", "gate_weight", "shared_output")
    )


FUSED_GATE_SIGMOID_MUL = OpContract(
    name="fused_gate_sigmoid_mul",
    sglang_layer="fused_gate_sigmoid_mul(_add) (kernel function)",
    summary="Shared-expert gate: sigmoid(x . w) * shared_output (+ addend), fp32 inside",
    signature=inspect.signature(_signature),
    details=inspect.getdoc(_signature) or "",
    reference=reference,
    dtypes=STANDARD_DTYPES,
    tolerances=STANDARD_TOLERANCES,
    cases=CASES,
    make_inputs=_make_inputs,
)
