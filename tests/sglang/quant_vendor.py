"""A throwaway vendor with weight-preparing quantized kernels, installed as a distribution.

``quantprobe`` registers two quantized linear kernels, each with a ``prepare`` step (a probe
has no kernel of its own: each computes with the reference's math, on the layout it prepared):

- ``w8a8_int8_linear``: prepares the weight transposed (``[K, N]``, the layout of sgl_kernel's
  ``int8_scaled_mm`` and torch_npu's ``npu_quant_matmul``) and the scale as ``[1, N]``, and
  declines every call of more than ``TILE_TOKENS`` tokens (a prefill): those go to the reference
  with the checkpoint layout. Each call it serves appends ``served <tokens>`` to the file
  ``SERVED_LOG_ENV`` names; a call given the checkpoint layout instead of its own fails loudly.
- ``wna16_linear``: declines, at preparation, every layer wider than ``MAX_WNA16_ROWS`` output
  channels (the fused gate/up projection of the tiny model): those layers run on the reference.
"""

from __future__ import annotations

from pathlib import Path

from installed_dists import ENTRY_POINT_GROUP, install_dist

__all__ = [
    "IMPL_ID",
    "MAX_WNA16_ROWS",
    "PREPARE_REASON",
    "SERVED_LOG_ENV",
    "TILE_REASON",
    "TILE_TOKENS",
    "quant_vendor_site",
]

IMPL_ID = "vendor.quantprobe"
TILE_TOKENS = 16
TILE_REASON = f"quantprobe serves at most {TILE_TOKENS} tokens per call"
MAX_WNA16_ROWS = 1024
PREPARE_REASON = f"quantprobe packs at most {MAX_WNA16_ROWS} output channels"
SERVED_LOG_ENV = "QUANTPROBE_SERVED_LOG"

MODULE = f'''
"""The quantprobe vendor (tests/sglang/quant_vendor.py)."""
import os

from sglang_fl import PreparedKernel, Unsupported, hookimpl
from sglang_fl.ops import get_contract
from sglang_fl.types import Backend

_INT8 = get_contract("w8a8_int8_linear").reference
_WNA16 = get_contract("wna16_linear").reference


class QuantProbe(Backend):
    name = "quantprobe"

    def is_available(self):
        return True


def prepare_int8(obj, weight, weight_scale):
    return weight.t().contiguous(), weight_scale.reshape(1, -1)


def int8_linear(obj, x, weight_t, scale_row, bias=None):
    if scale_row.dim() != 2 or weight_t.shape[0] != x.shape[1]:
        raise AssertionError("quantprobe got a layout it did not prepare")
    if x.shape[0] > {TILE_TOKENS}:
        raise Unsupported({TILE_REASON!r})
    out = _INT8(obj, x, weight_t.t(), scale_row.reshape(-1), bias)
    log = os.environ.get({SERVED_LOG_ENV!r})
    if log:
        with open(log, "a") as f:
            f.write(f"served {{x.shape[0]}}\\n")
    return out


def prepare_wna16(obj, weight, weight_scale, weight_zero_point):
    if weight.shape[0] > {MAX_WNA16_ROWS}:
        raise Unsupported({PREPARE_REASON!r})
    return weight, weight_scale, weight_zero_point


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register_many(
        QuantProbe().implementations(
            {{
                "w8a8_int8_linear": PreparedKernel(int8_linear, prepare_int8),
                "wna16_linear": PreparedKernel(_WNA16, prepare_wna16),
            }}
        )
    )
'''


def quant_vendor_site(root: Path) -> Path:
    """Install the quantprobe vendor into the site directory ``root``; returns it."""
    return install_dist(
        root,
        "sglang-fl-quantprobe",
        "0.0.1",
        files={"sglang_fl_quantprobe/__init__.py": MODULE},
        entry_points={ENTRY_POINT_GROUP: {"quantprobe": "sglang_fl_quantprobe"}},
        dedent=False,
    )
