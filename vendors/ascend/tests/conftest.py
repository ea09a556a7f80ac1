"""Fixtures: the ``torch_npu`` test double, installed for one test and removed after it."""

from __future__ import annotations

import sys

import pytest
from sglang_fl_ascend.ascend import TORCH_NPU
from torch_npu_double import TorchNpuDouble


@pytest.fixture
def torch_npu(monkeypatch: pytest.MonkeyPatch) -> TorchNpuDouble:
    """A fresh double as ``torch_npu``, both in ``sys.modules`` and as the adapters' module."""
    double = TorchNpuDouble()
    monkeypatch.setitem(sys.modules, "torch_npu", double)
    monkeypatch.setattr(TORCH_NPU, "module", double)
    return double
