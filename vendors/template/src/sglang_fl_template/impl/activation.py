"""Activations on template: ``x`` ``[num_tokens, width]`` (maybe 0 tokens, maybe strided) ->
a new tensor; ``x`` stays untouched."""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.types import Unsupported


def silu_and_mul(obj: Any, x: torch.Tensor) -> torch.Tensor:
    # Replace with the chip kernel; x stays untouched. Raising Unsupported (before writing
    # anything) hands this call to the next candidate, e.g. for a dtype the kernel lacks.
    raise Unsupported("template: silu_and_mul is not implemented")


def gelu_and_mul(obj: Any, x: torch.Tensor) -> torch.Tensor:
    # gelu(x[:, :d]) * x[:, d:] -> new [num_tokens, d]; obj.approximate is "none" (erf) or
    # "tanh" (sglang_fl.ops.activation.gelu_and_mul.check_approximate reads it).
    raise Unsupported("template: gelu_and_mul is not implemented")


def gelu_new(obj: Any, x: torch.Tensor) -> torch.Tensor:
    # 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3))), element-wise.
    raise Unsupported("template: gelu_new is not implemented")


def gelu_quick(obj: Any, x: torch.Tensor) -> torch.Tensor:
    # x * sigmoid(1.702 * x), element-wise.
    raise Unsupported("template: gelu_quick is not implemented")
