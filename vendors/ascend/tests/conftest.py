"""Fixtures: the ``torch_npu`` test double and the ``sgl_kernel_npu`` double (the package and
its GDN submodules), each installed for one test and removed after it."""

from __future__ import annotations

import pytest
from sgl_kernel_npu_double import SglKernelNpuDouble, install_sgl_kernel_npu
from sglang_fl_ascend.backend import TORCH_NPU
from torch_npu_quant_double import TorchNpuQuantDouble

from sglang_fl.testing.doubles import install_double


@pytest.fixture
def torch_npu(monkeypatch: pytest.MonkeyPatch) -> TorchNpuQuantDouble:
    """A fresh double as ``torch_npu`` (its quantization operators included), both in
    ``sys.modules`` and as the adapters' module."""
    return install_double(monkeypatch, TorchNpuQuantDouble(), TORCH_NPU)


@pytest.fixture
def sgl_kernel_npu(monkeypatch: pytest.MonkeyPatch) -> SglKernelNpuDouble:
    """A fresh double of sgl_kernel_npu's main release as the GDN adapters' package."""
    return install_sgl_kernel_npu(monkeypatch, SglKernelNpuDouble())
