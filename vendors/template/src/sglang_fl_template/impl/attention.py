"""Attention kernel functions on template."""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.types import Unsupported


def clamp_position(obj: Any, seq_lens: torch.Tensor) -> torch.Tensor:
    # max(seq_lens - 1, 0) as a new int64 tensor; seq_lens [batch] is int32 or int64 and
    # stays untouched; exact.
    raise Unsupported("template: clamp_position is not implemented")
