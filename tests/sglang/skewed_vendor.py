"""A throwaway vendor whose ``rms_norm`` is subtly wrong, for verify mode to find.

It accumulates the variance in bfloat16 where the contract says float32: outputs stay close
enough to generate text, but outside the contract's float32 tolerance.
"""

from __future__ import annotations

from pathlib import Path

from sglang_processes import install_source

__all__ = ["SKEWED_IMPL", "skewed_vendor_site"]

SKEWED_IMPL = "vendor.skewed.rms_norm"

SKEWED_KERNEL = '''
"""The skewed chip's norm: the variance accumulates in bfloat16 (the contract says float32)."""
import torch


def rms_norm(obj, x, residual=None):
    orig_dtype = x.dtype
    hidden = x.to(torch.float32)
    if residual is not None:
        hidden = hidden + residual.to(torch.float32)
        residual = hidden.to(orig_dtype)
    variance = hidden.to(torch.bfloat16).pow(2).mean(dim=-1, keepdim=True).to(torch.float32)
    out = (hidden * torch.rsqrt(variance + obj.variance_epsilon) * obj.weight).to(orig_dtype)
    return out if residual is None else (out, residual)
'''

SKEWED_PLUGIN = f'''
from sglang_fl import hookimpl
from sglang_fl.dispatch.types import BackendImplKind, OpImpl

from .impl.normalization import rms_norm


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(
        OpImpl(op_name="rms_norm", impl_id="{SKEWED_IMPL}", kind=BackendImplKind.VENDOR,
               fn=rms_norm, vendor="skewed")
    )
'''

SKEWED_PYPROJECT = """
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang-fl-skewed"
version = "0.0.1"
dependencies = ["sglang-fl"]

[tool.setuptools]
packages = ["sglang_fl_skewed", "sglang_fl_skewed.impl"]

[project.entry-points."sglang_fl.backends"]
skewed = "sglang_fl_skewed.plugin"
"""


def skewed_vendor_site(root: Path) -> Path:
    """Install the skewed vendor under ``root``; returns its site directory."""
    package = root / "src" / "sglang_fl_skewed"
    (package / "impl").mkdir(parents=True)
    (package / "__init__.py").write_text('"""A chip whose rms_norm is subtly wrong."""\n')
    (package / "impl" / "__init__.py").write_text("")
    (package / "impl" / "normalization.py").write_text(SKEWED_KERNEL)
    (package / "plugin.py").write_text(SKEWED_PLUGIN)
    (root / "src" / "pyproject.toml").write_text(SKEWED_PYPROJECT)
    return install_source(root / "src", root)
