"""The bridge of SGLang's ``ClampPositionOp`` (``sglang.kernels.ops.attention.clamp_position``).

SGLang calls it once per decode batch, from ``ForwardBatch.init_new``, to turn the requests'
sequence lengths into the positions of the tokens being decoded.
"""

from __future__ import annotations

from typing import Any

import torch

from ...routing import Forward, Handoff
from .base import Bridge

__all__ = ["ClampPositionBridge"]


class ClampPositionBridge(Bridge):
    op_name = "clamp_position"

    def bind(self, layer: Any, fn: Forward, sglang_forward: Forward, handoff: Handoff) -> Forward:
        def clamp_position(seq_lens: torch.Tensor) -> torch.Tensor:
            clamped: torch.Tensor = fn(layer, seq_lens)
            return clamped

        return clamp_position
