"""The NVIDIA backend: ``sgl_kernel`` on a CUDA device, probed lazily and once per process."""

from __future__ import annotations

import os

import torch

from sglang_fl.types import Availability, Backend, ChipSdk

__all__ = ["FLASH_ATTN", "SGL_KERNEL", "CudaBackend"]


def _no_cuda_hint() -> str:
    """Why torch sees no GPU, in the terms a user can act on."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is built without CUDA"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return f"CUDA_VISIBLE_DEVICES={visible!r}"
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}) found no driver or GPU"


# The devices are counted before the import: on a machine without a GPU, sgl_kernel (a large
# native library that looks for one when imported) is never loaded.
SGL_KERNEL = ChipSdk(
    "sgl_kernel",
    device="CUDA device",
    count_devices=torch.cuda.device_count,
    devices_need_sdk=False,
    requires=(
        "silu_and_mul",
        "rmsnorm",
        "fused_add_rmsnorm",
        "rotary_embedding",
        "gelu_and_mul",
        "gelu_tanh_and_mul",
        "gemma_rmsnorm",
        "gemma_fused_add_rmsnorm",
    ),
    no_device_hint=_no_cuda_hint,
)

# sgl_kernel's FlashAttention-3 wrapper module (what SGLang's ``fa3`` attention backend imports):
# a submodule that ``import sgl_kernel`` does not load, probed on its own so that a wheel built
# without FA3 still serves the kernels above.
FLASH_ATTN = ChipSdk(
    "sgl_kernel.flash_attn",
    device="CUDA device",
    count_devices=torch.cuda.device_count,
    devices_need_sdk=False,
    requires=("flash_attn_with_kvcache", "is_fa3_supported"),
    no_device_hint=_no_cuda_hint,
)


class CudaBackend(Backend):
    """Available when torch sees a CUDA device and ``sgl_kernel`` imports with its kernels."""

    @property
    def name(self) -> str:
        return "cuda"

    def is_available(self) -> Availability:
        return SGL_KERNEL.probe()
