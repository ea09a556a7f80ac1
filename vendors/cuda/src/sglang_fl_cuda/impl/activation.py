"""``silu_and_mul`` on ``sgl_kernel.silu_and_mul``, called as ``SiluAndMul.forward_cuda`` does.

Constraints of the kernel (``sglang-kernel`` 0.4.x) and how they are met: rows of a multiple
of 16 bytes (otherwise ``Unsupported``), contiguous input (a strided ``x`` is packed first),
at least one token (an empty batch returns its empty output without a launch).
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl import Unsupported

from ..backend import SGL_KERNEL

# sgl_kernel.silu_and_mul loads rows in 16-byte vectors and refuses other row widths.
_ROW_ALIGNMENT_BYTES = 16


def silu_and_mul(obj: Any, x: torch.Tensor) -> torch.Tensor:
    """``silu(x[:, :d]) * x[:, d:]`` into a new ``[num_tokens, d]`` tensor; ``x`` is read only."""
    if x.shape[-1] * x.element_size() % _ROW_ALIGNMENT_BYTES:
        raise Unsupported(
            f"sgl_kernel.silu_and_mul needs rows of a multiple of {_ROW_ALIGNMENT_BYTES} bytes; "
            f"got {x.shape[-1]} x {x.dtype}"
        )
    out = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out  # the kernel launches one block per token: with none it would fail
    # The kernel reads each token's 2*d values as one packed row.
    SGL_KERNEL.require().silu_and_mul(x.contiguous(), out)
    return out
