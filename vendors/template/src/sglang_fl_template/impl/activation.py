"""``silu_and_mul`` on template: ``x`` ``[num_tokens, 2*d]`` -> new ``[num_tokens, d]``."""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl import Unsupported


def silu_and_mul(obj: Any, x: torch.Tensor) -> torch.Tensor:
    # Replace with the chip kernel; x stays untouched. Raising Unsupported (before writing
    # anything) hands this call to the next candidate, e.g. for a dtype the kernel lacks.
    raise Unsupported("template: silu_and_mul is not implemented")
