"""Fixtures: the ``torch_npu`` test double, installed for one test and removed after it."""

from __future__ import annotations

import pytest
from sglang_fl_ascend.backend import TORCH_NPU
from torch_npu_double import TorchNpuDouble

from sglang_fl.testing.doubles import install_double


@pytest.fixture
def torch_npu(monkeypatch: pytest.MonkeyPatch) -> TorchNpuDouble:
    """A fresh double as ``torch_npu``, both in ``sys.modules`` and as the adapters' module."""
    return install_double(monkeypatch, TorchNpuDouble(), TORCH_NPU)
