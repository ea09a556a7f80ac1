"""Fixtures: the ``torch_npu`` test double and the double of sgl_kernel_npu's GDN gating
module, each installed for one test and removed after it."""

from __future__ import annotations

import pytest
from sgl_kernel_npu_double import SglKernelNpuGatingDouble
from sglang_fl_ascend.backend import SGL_KERNEL_NPU_GATING, TORCH_NPU
from torch_npu_quant_double import TorchNpuQuantDouble

from sglang_fl.testing.doubles import install_double


@pytest.fixture
def torch_npu(monkeypatch: pytest.MonkeyPatch) -> TorchNpuQuantDouble:
    """A fresh double as ``torch_npu`` (its quantization operators included), both in
    ``sys.modules`` and as the adapters' module."""
    return install_double(monkeypatch, TorchNpuQuantDouble(), TORCH_NPU)


@pytest.fixture
def sgl_kernel_npu_gating(monkeypatch: pytest.MonkeyPatch) -> SglKernelNpuGatingDouble:
    """A fresh double as ``sgl_kernel_npu.fla.fused_gdn_gating`` (the GDN gating adapter's)."""
    return install_double(monkeypatch, SglKernelNpuGatingDouble(), SGL_KERNEL_NPU_GATING)
