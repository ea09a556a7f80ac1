"""Fixtures: the ``sgl_kernel`` test double, installed for one test and removed after it."""

from __future__ import annotations

import sys

import pytest
from sgl_kernel_double import SglKernelDouble
from sglang_fl_cuda.backend import SGL_KERNEL


@pytest.fixture
def sgl_kernel(monkeypatch: pytest.MonkeyPatch) -> SglKernelDouble:
    """A fresh double as ``sgl_kernel``, both in ``sys.modules`` and as the adapters' module."""
    double = SglKernelDouble()
    monkeypatch.setitem(sys.modules, "sgl_kernel", double)
    monkeypatch.setattr(SGL_KERNEL, "module", double)
    return double
