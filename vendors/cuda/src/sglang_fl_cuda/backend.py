"""The NVIDIA backends: ``sgl_kernel`` (its elementwise kernels, its FlashAttention-3 module, its
compiled causal convs), SGLang's own Triton kernels and NCCL on a CUDA device, each probed
lazily and once per process, so one missing piece leaves the others served."""

from __future__ import annotations

import os

import torch

from sglang_fl.types import Availability, Backend, ChipSdk

__all__ = [
    "FA3_DEVICES",
    "FLASH_ATTN",
    "NO_FLASHINFER",
    "SGLANG_TRITON",
    "SGL_KERNEL",
    "SGL_KERNEL_MAMBA",
    "FlashAttnBackend",
    "NcclBackend",
    "SdkBackend",
]


def _no_cuda_hint() -> str:
    """Why torch sees no GPU, in the terms a user can act on."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is built without CUDA"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return f"CUDA_VISIBLE_DEVICES={visible!r}"
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}) found no driver or GPU"


def _cuda_sdk(name: str, *requires: str) -> ChipSdk:
    """A module of CUDA kernels, imported only once torch has counted a CUDA device: on a
    machine without a GPU it is never loaded (sgl_kernel, a large native library, looks for one
    when imported; the Triton facade imports Triton)."""
    return ChipSdk(
        name,
        device="CUDA device",
        count_devices=torch.cuda.device_count,
        devices_need_sdk=False,
        requires=requires,
        no_device_hint=_no_cuda_hint,
    )


SGL_KERNEL = _cuda_sdk(
    "sgl_kernel",
    "silu_and_mul",
    "rmsnorm",
    "fused_add_rmsnorm",
    "rotary_embedding",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "gemma_rmsnorm",
    "gemma_fused_add_rmsnorm",
)
# sgl_kernel's FlashAttention-3 wrapper module (what SGLang's ``fa3`` attention backend imports):
# a submodule that ``import sgl_kernel`` does not load, probed on its own so that a wheel built
# without FA3 still serves the kernels above.
FLASH_ATTN = _cuda_sdk("sgl_kernel.flash_attn", "flash_attn_with_kvcache", "is_fa3_supported")
# sgl_kernel's compiled causal convs (``sgl_kernel/mamba.py``), probed on their own too.
SGL_KERNEL_MAMBA = _cuda_sdk("sgl_kernel.mamba", "causal_conv1d_fwd", "causal_conv1d_update")
# SGLang's Triton GDN kernels, through the facade module that imports them.
SGLANG_TRITON = _cuda_sdk(
    "sglang_fl_cuda.sglang_triton",
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gated_delta_rule_packed_decode",
    "fused_sigmoid_gating_delta_rule_update",
    "fused_gdn_gating",
    "layer_norm_gated_fwd",
)


class SdkBackend(Backend):
    """The ``cuda`` vendor's kernels of one SDK: available when torch sees a CUDA device and
    ``sdk`` imports with the functions its adapters call (``SGL_KERNEL``, ``SGL_KERNEL_MAMBA``,
    ``SGLANG_TRITON``)."""

    def __init__(self, sdk: ChipSdk) -> None:
        self.sdk = sdk

    @property
    def name(self) -> str:
        return "cuda"

    def is_available(self) -> Availability:
        return self.sdk.probe()

    def __repr__(self) -> str:
        return f"<SdkBackend 'cuda': {self.sdk.name}>"


def _nccl_availability() -> Availability:
    """CUDA devices and a torch built with NCCL (``ProcessGroupNCCL``); torch is already
    imported, so this imports nothing new."""
    count = torch.cuda.device_count()
    if count == 0:
        return Availability(False, f"no CUDA device visible ({_no_cuda_hint()})")
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_nccl_available()):
        return Availability(False, f"torch {torch.__version__} is built without NCCL")
    version = ".".join(map(str, torch.cuda.nccl.version()))
    plural = "" if count == 1 else "s"
    return Availability(
        True, f"NCCL {version} through torch.distributed; {count} CUDA device{plural}"
    )


class NcclBackend(Backend):
    """The collectives: NCCL through torch.distributed, on the engine's ``nccl`` device groups.

    Probed apart from :class:`CudaBackend`: collectives need NCCL, not ``sgl_kernel``."""

    @property
    def name(self) -> str:
        return "cuda"

    def is_available(self) -> Availability:
        try:
            return _nccl_availability()
        except Exception as exc:  # a driver error while asking: a reason, never a raise
            return Availability(False, f"probing NCCL failed: {type(exc).__name__}: {exc}")


# Where sgl_kernel's FlashAttention-3 runs: ``is_fa3_supported`` (sgl_kernel/flash_attn.py:16-28,
# sglang-kernel 0.4.10) holds for CUDA >= 12.3 and compute capability 8.x or 9.x, the GPUs its
# flash_ops binary has kernels for (cubins for sm_80, sm_86 and sm_90a only).
FA3_DEVICES = "sm80/86/89/90 with CUDA >= 12.3 (sgl_kernel/flash_attn.py is_fa3_supported)"
# What SGLang runs where FA3 cannot, and why this wheel does not yet.
NO_FLASHINFER = (
    "FlashInfer, SGLang's attention there, has no adapter here yet: it plans once per batch "
    "(sglang-fl-cuda README, 'FlashInfer')"
)


def _fa3_availability() -> Availability:
    """The module probe, then ``is_fa3_supported`` on every visible device: a Blackwell GPU
    (sm100/sm120) imports the module but has no FA3 kernel, so FA3 is unavailable there."""
    found = FLASH_ATTN.probe()
    if not found:
        return found
    module = FLASH_ATTN.require()
    lacking = [
        f"cuda:{index} (sm{''.join(map(str, torch.cuda.get_device_capability(index)))})"
        for index in range(torch.cuda.device_count())
        if not module.is_fa3_supported(index)
    ]
    if lacking:
        return Availability(
            False,
            f"sgl_kernel's FlashAttention-3 runs on {FA3_DEVICES}, not on {', '.join(lacking)} "
            f"with CUDA {torch.version.cuda}; {NO_FLASHINFER}",
        )
    return found


class FlashAttnBackend(Backend):
    """The same vendor (``cuda``) for the attention adapters: available when
    ``sgl_kernel.flash_attn`` (FlashAttention-3) imports, which a wheel built without FA3 lacks
    while its other kernels work, and every visible GPU is one FA3 has kernels for."""

    @property
    def name(self) -> str:
        return "cuda"

    def is_available(self) -> Availability:
        try:
            return _fa3_availability()
        except Exception as exc:  # a driver error while asking: a reason, never a raise
            return Availability(
                False, f"probing FlashAttention-3 failed: {type(exc).__name__}: {exc}"
            )
