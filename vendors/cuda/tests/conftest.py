"""Fixtures: the doubles of ``sgl_kernel``, its FlashAttention-3 and causal-conv modules and
SGLang's Triton GDN kernels, each installed for one test and removed after it."""

from __future__ import annotations

import sys

import pytest
import torch
from causal_conv_double import SglKernelMambaDouble
from flash_attn_double import FlashAttnDouble
from sgl_kernel_double import SglangTritonMoeDouble, SglKernelDouble
from sglang_fl_cuda.backend import FLASH_ATTN, SGL_KERNEL, SGL_KERNEL_MAMBA, SGLANG_TRITON
from sglang_fl_cuda.impl.moe import SGLANG_FUSED_MOE
from sglang_triton_double import SglangTritonGdnDouble

from sglang_fl.testing.doubles import install_double


@pytest.fixture
def sgl_kernel(monkeypatch: pytest.MonkeyPatch) -> SglKernelDouble:
    """A fresh double as ``sgl_kernel``, both in ``sys.modules`` and as the adapters' module."""
    # SGLang's Triton fused experts, which the fused_moe adapter imports on its first call.
    monkeypatch.setitem(sys.modules, SGLANG_FUSED_MOE, SglangTritonMoeDouble())
    return install_double(monkeypatch, SglKernelDouble(), SGL_KERNEL)


@pytest.fixture
def sglang_triton_moe(sgl_kernel: SglKernelDouble) -> SglangTritonMoeDouble:
    """The double of SGLang's Triton fused-experts module the fused_moe adapter calls."""
    module = sys.modules[SGLANG_FUSED_MOE]
    assert isinstance(module, SglangTritonMoeDouble)
    return module


@pytest.fixture
def flash_attn(monkeypatch: pytest.MonkeyPatch) -> FlashAttnDouble:
    """A fresh double as ``sgl_kernel.flash_attn`` (FlashAttention-3), on an emulated sm90: the
    double's GPU is also what ``torch.cuda.get_device_capability`` reports (set its
    ``capability`` to emulate another)."""
    double = install_double(monkeypatch, FlashAttnDouble(), FLASH_ATTN)
    monkeypatch.setattr(torch.cuda, "get_device_capability", double.get_device_capability)
    return double


@pytest.fixture
def triton_gdn(monkeypatch: pytest.MonkeyPatch) -> SglangTritonGdnDouble:
    """A fresh double as the module the ``SGLANG_TRITON`` probe imports (the GDN adapters')."""
    return install_double(monkeypatch, SglangTritonGdnDouble(), SGLANG_TRITON)


@pytest.fixture
def sgl_kernel_mamba(monkeypatch: pytest.MonkeyPatch) -> SglKernelMambaDouble:
    """A fresh double as ``sgl_kernel.mamba`` (the compiled causal convs)."""
    return install_double(monkeypatch, SglKernelMambaDouble(), SGL_KERNEL_MAMBA)
