"""The Ascend backend: ``torch_npu`` with a visible NPU, probed lazily and once per process."""

from __future__ import annotations

import os

from sglang_fl.types import Availability, Backend, ChipSdk

__all__ = ["TORCH_NPU", "AscendBackend"]


def _count_npus() -> int:
    """NPUs visible to this process (ChipSdk calls it after importing torch_npu)."""
    return int(TORCH_NPU.require().npu.device_count())


def _no_npu_hint() -> str:
    visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    if visible is not None:
        return f"ASCEND_RT_VISIBLE_DEVICES={visible!r}"
    return "torch_npu imported but found no Ascend driver or device"


# torch.npu exists only after `import torch_npu`, so devices are counted after the import.
TORCH_NPU = ChipSdk(
    "torch_npu",
    device="NPU",
    count_devices=_count_npus,
    devices_need_sdk=True,
    requires=(
        "npu_swiglu",
        "npu_rms_norm",
        "npu_add_rms_norm",
        "npu_mrope",
        "npu_geglu",
        "npu_gelu",
        "npu_fast_gelu",
    ),
    no_device_hint=_no_npu_hint,
)


class AscendBackend(Backend):
    """Available when ``torch_npu`` imports (with CANN) and at least one NPU is visible."""

    @property
    def name(self) -> str:
        return "ascend"

    def is_available(self) -> Availability:
        return TORCH_NPU.probe()
