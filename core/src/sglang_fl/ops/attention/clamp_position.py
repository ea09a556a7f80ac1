"""``clamp_position``: SGLang's ``ClampPositionOp``, the decode position of each request.

SGLang computes, for every running request, the zero-based position of the token being decoded
from the request's sequence length. It is a fused op (``BaseFusedOp``) with a CUDA JIT kernel;
on a chip without one it runs PyTorch. The contract takes the sequence lengths as they are and
always returns a new int64 tensor, which is what SGLang's decode path indexes the rope cache
and the KV cache with.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from ..contract import OpCase, OpContract, OpInputs, Tolerance, axis, case_grid, layer

# Sequence lengths come as int32 or int64 depending on the attention backend.
INDEX_DTYPES: tuple[torch.dtype, ...] = (torch.int32, torch.int64)
_EXACT = Tolerance(atol=0.0, rtol=0.0)


def _signature(obj: Any, seq_lens: torch.Tensor) -> torch.Tensor:
    """``max(seq_lens - 1, 0)`` as a new int64 tensor of ``seq_lens``'s shape.

    ``seq_lens`` is ``[batch]`` (``batch`` may be 0, the tensor may be strided), int32 or int64,
    and stays untouched. A length of 0 gives position 0, never -1. The result is exact: an
    index, not an approximation. The layer carries no state.
    """
    raise NotImplementedError


def reference(obj: Any, seq_lens: torch.Tensor) -> torch.Tensor:
    """Same math as ``ClampPositionOp.forward_native``."""
    return torch.clamp(seq_lens - 1, min=0).to(torch.int64)


def _case_name(p: Mapping[str, Any]) -> str:
    return f"batch={p['batch']}" + ("" if p["contiguous"] else ",strided")


CASES = case_grid(_case_name, axis("batch", (0, 1, 7, 64)), axis("contiguous", (True, False)))


def _make_inputs(
    case: OpCase, dtype: torch.dtype, device: torch.device, generator: torch.Generator
) -> OpInputs:
    p = case.params
    width = p["batch"] if p["contiguous"] else 2 * p["batch"]
    lengths = torch.randint(0, 4096, (width,), generator=generator, dtype=torch.int64)
    lengths[:: max(1, width // 4)] = 0  # empty requests: clamped to 0, never -1
    seq_lens = lengths.to(device, dtype)
    if not p["contiguous"]:
        seq_lens = seq_lens[::2]
    return OpInputs(obj=layer(), args=(seq_lens,), preserved=("seq_lens",))


CONTRACT = OpContract(
    name="clamp_position",
    sglang_layer="ClampPositionOp",
    summary="Decode positions: max(seq_lens - 1, 0) as int64",
    signature=inspect.signature(_signature),
    details=inspect.getdoc(_signature) or "",
    reference=reference,
    dtypes=INDEX_DTYPES,
    tolerances={dtype: _EXACT for dtype in INDEX_DTYPES},
    cases=CASES,
    make_inputs=_make_inputs,
)
