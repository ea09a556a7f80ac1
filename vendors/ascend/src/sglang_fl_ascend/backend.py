"""The Ascend backend: ``torch_npu`` with a visible NPU, probed lazily and once per process.

Besides the import and the device count, the probe reads what the adapters' operators depend
on (:func:`platform`): the torch_npu release (its MoE gating operator changed with Ascend
Extension for PyTorch 7.2.0; releases before 2.4.0 may pair with a CANN whose KV store takes
one head size only; FIA's TND layout takes PageAttention from Ascend Extension for PyTorch
7.3.0; HCCL's gather, float8 and 16-64-bit unsigned dtypes came with 26.0.0), the SoC
generation (bfloat16 GELUs, ND paged attention and HCCL's compatible gather exist on A2/A3
only; float64 reductions on Ascend 950 only) and SGLang's ``ASCEND_USE_FIA`` switch (which
decode operator comes first).
"""

from __future__ import annotations

import enum
import os
import re
from dataclasses import dataclass
from types import ModuleType

from sglang_fl.types import Availability, Backend, ChipSdk

__all__ = [
    "SGL_KERNEL_NPU",
    "TORCH_NPU",
    "AscendBackend",
    "AscendSoc",
    "NpuPlatform",
    "SglKernelNpuBackend",
    "platform",
]

# The first torch_npu release line of Ascend Extension for PyTorch 7.2.0 (CANN 8.3.RC1): the
# op-plugin 7.1.0 branch builds torch_npu 2.1.0/2.5.1/2.6.0, 7.2.0 adds 2.7.1 and 2.8.0 (op-plugin
# README of each branch). Releases below it may be 7.0.0/7.1.0 builds, whose
# npu_moe_gating_top_k is the restricted one (see impl/moe.py).
GENERAL_GATING_SINCE = (2, 7, 1)
# The first torch_npu release line whose every build pairs with CANN 8.0.RC3 or later
# (Ascend/pytorch COMPATIBILITY.md, the version table: 2.4.0 <-> CANN 8.0.RC3; 2.3.1 and
# 2.1.0.post6 <-> CANN 8.0.RC2), whose ATB ReshapeAndCache takes a value head size other than
# the key's on every product (the CANN 8.0.RC2 page limits it to Atlas 800I A2).
DIFFERING_HEAD_DIMS_SINCE = (2, 4, 0)
# The first torch_npu build of each release line that Ascend Extension for PyTorch 7.3.0 made
# (Ascend/pytorch tags v7.3.0-pytorch2.6.0/-2.7.1/-2.8.0/-2.9.0, version.txt: 2.6.0.post5,
# 2.7.1.post2, 2.8.0.post2, 2.9.0; v7.2.0.1 builds 2.6.0.post4, 2.7.1.post1, 2.8.0.post1).
EXTENSION_7_3_FIRST_POST = {(2, 6, 0): 5, (2, 7, 1): 2, (2, 8, 0): 2}
EXTENSION_7_3_LINES_SINCE = (2, 9, 0)
# The first torch_npu build of each release line that Ascend Extension for PyTorch 26.0.0 made
# (Ascend/pytorch tags v26.0.0-pytorch2.7.1/-2.8.0/-2.9.0/-2.10.0, version.txt: 2.7.1.post4,
# 2.8.0.post4, 2.9.0.post2, 2.10.0; the v7.3.1 tags build 2.7.1.post3, 2.8.0.post3,
# 2.9.0.post1). Lines from 2.10.0 on were first built by 26.0.0; 2.6.0 and older never were.
EXTENSION_26_FIRST_POST = {(2, 7, 1): 4, (2, 8, 0): 4, (2, 9, 0): 2}
EXTENSION_26_LINES_SINCE = (2, 10, 0)
# SGLang's switch for FIA decode (hardware_backend/npu/attention/ascend_backend.py:383,
# get_bool_env_var("ASCEND_USE_FIA", "False"), true for "true"/"1" in any case).
USE_FIA = "ASCEND_USE_FIA"


class AscendSoc(str, enum.Enum):
    """SoC generations by ``torch_npu.npu.get_soc_version()`` (ranges as vllm-ascend's
    ``vllm_ascend/utils.py`` maps them: 220-225 A2, 250-255 A3, 200-205 310P, 260 A5)."""

    A2 = "Atlas A2"
    A3 = "Atlas A3"
    INFERENCE_310P = "Atlas 300I/310P"
    A5 = "Ascend 950"
    OTHER = "an older or unknown SoC"


def _soc_of(version: int | None) -> AscendSoc:
    if version is None:
        return AscendSoc.OTHER
    if 220 <= version <= 225:
        return AscendSoc.A2
    if 250 <= version <= 255:
        return AscendSoc.A3
    if 200 <= version <= 205:
        return AscendSoc.INFERENCE_310P
    if version == 260:
        return AscendSoc.A5
    return AscendSoc.OTHER


@dataclass(frozen=True)
class NpuPlatform:
    """The torch_npu release and NPU SoC of this process, as the adapters need them."""

    torch_npu_version: str
    release: tuple[int, int, int] | None  # None: a version string that does not parse
    soc_version: int | None  # None: not readable
    soc: AscendSoc
    fia_decode: bool = False  # ASCEND_USE_FIA: decode on FIA first, as SGLang does
    post: int = 0  # the ``.postN`` of the version (0 without one)

    def _built_since(
        self, first_post: dict[tuple[int, int, int], int], lines: tuple[int, int, int]
    ) -> bool:
        if self.release is None:
            return False
        if self.release >= lines:
            return True
        first = first_post.get(self.release)
        return first is not None and self.post >= first

    @property
    def extension_7_3(self) -> bool:
        """Whether this torch_npu is an Ascend Extension for PyTorch 7.3.0 build or later."""
        return self._built_since(EXTENSION_7_3_FIRST_POST, EXTENSION_7_3_LINES_SINCE)

    @property
    def extension_26(self) -> bool:
        """Whether this torch_npu is an Ascend Extension for PyTorch 26.0.0 build or later."""
        return self._built_since(EXTENSION_26_FIRST_POST, EXTENSION_26_LINES_SINCE)

    @property
    def general_gating(self) -> bool:
        """Whether npu_moe_gating_top_k is the general operator of torch_npu 7.2.0+ builds."""
        return self.release is not None and self.release >= GENERAL_GATING_SINCE

    @property
    def store_differing_head_dims(self) -> bool:
        """Whether the KV store takes a value head size other than the key's (CANN 8.0.RC3+)."""
        return self.release is not None and self.release >= DIFFERING_HEAD_DIMS_SINCE

    @property
    def a2_or_a3(self) -> bool:
        """Whether the SoC is an Atlas A2 or A3: what several operators are limited to."""
        return self.soc in (AscendSoc.A2, AscendSoc.A3)

    @property
    def bf16_gelu(self) -> bool:
        """Whether npu_gelu/npu_fast_gelu/npu_geglu take bfloat16 (A2/A3 only, per their pages)."""
        return self.a2_or_a3

    def describe(self) -> str:
        soc = f"{self.soc.value} (SoC {self.soc_version})" if self.soc_version else self.soc.value
        return f"torch_npu {self.torch_npu_version} on {soc}"


_RELEASE = re.compile(r"(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?")
_platform: tuple[ModuleType, NpuPlatform] | None = None


def platform() -> NpuPlatform:
    """The :class:`NpuPlatform` of the loaded torch_npu, read once per module object."""
    global _platform
    torch_npu = TORCH_NPU.require()
    cached = _platform
    if cached is not None and cached[0] is torch_npu:
        return cached[1]
    version = str(getattr(torch_npu, "__version__", "unknown"))
    match = _RELEASE.match(version)
    release = (int(match[1]), int(match[2]), int(match[3])) if match else None
    try:
        soc_version: int | None = int(torch_npu.npu.get_soc_version())
    except Exception:  # an SDK without the call, or a driver error: treated as an unknown SoC
        soc_version = None
    fia = os.environ.get(USE_FIA, "false").lower() in ("true", "1")
    post = int(match[4]) if match and match[4] else 0
    detected = NpuPlatform(version, release, soc_version, _soc_of(soc_version), fia, post)
    _platform = (torch_npu, detected)
    return detected


def _count_npus() -> int:
    """NPUs visible to this process (ChipSdk calls it after importing torch_npu); reads the
    platform too, so the probe is where the release and SoC are first read."""
    count = int(TORCH_NPU.require().npu.device_count())
    platform()
    return count


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
        "npu_layer_norm_eval",
    ),
    no_device_hint=_no_npu_hint,
)

# sgl_kernel_npu, the SGLang NPU path's own Triton-Ascend kernels: it imports torch_npu itself,
# so it is probed only once torch_npu's probe found an NPU. Which of its functions a release
# has, and in which form, is read per function (kernels.py).
SGL_KERNEL_NPU = ChipSdk(
    "sgl_kernel_npu",
    device="NPU",
    count_devices=_count_npus,
    devices_need_sdk=True,
    no_device_hint=_no_npu_hint,
)


class AscendBackend(Backend):
    """Available when ``torch_npu`` imports (with CANN) and at least one NPU is visible."""

    @property
    def name(self) -> str:
        return "ascend"

    def is_available(self) -> Availability:
        return TORCH_NPU.probe()


class SglKernelNpuBackend(Backend):
    """The same vendor (``ascend``) for the operators of ``sgl_kernel_npu``: torch_npu's probe
    first (its reason is the one a machine without an NPU shows), then the package's import;
    each function's form is checked at its first call (``kernels.py``)."""

    @property
    def name(self) -> str:
        return "ascend"

    def is_available(self) -> Availability:
        npu = TORCH_NPU.probe()
        return SGL_KERNEL_NPU.probe() if npu else npu
