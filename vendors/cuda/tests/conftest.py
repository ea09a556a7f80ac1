"""Fixtures: the ``sgl_kernel`` test double, installed for one test and removed after it."""

from __future__ import annotations

import pytest
from sgl_kernel_double import SglKernelDouble
from sglang_fl_cuda.backend import SGL_KERNEL

from sglang_fl.testing.doubles import install_double


@pytest.fixture
def sgl_kernel(monkeypatch: pytest.MonkeyPatch) -> SglKernelDouble:
    """A fresh double as ``sgl_kernel``, both in ``sys.modules`` and as the adapters' module."""
    return install_double(monkeypatch, SglKernelDouble(), SGL_KERNEL)
