"""Throwaway vendor wheels whose kernels decline calls, built and installed for real.

Each is built as a real wheel and installed with ``pip --target`` (as the probe vendor); it
ranks above the reference, so it is chosen, and a declined call raises
:class:`sglang_fl.Unsupported` before computing, so the reference must run it (and the report
say why), or, with ``SGLANG_FL_STRICT=1``, the call must fail naming the op and this
implementation.

- ``decline_vendor_site``: ``decode_attention`` declines every call.
- ``gdn_decline_vendor_site``: ``chunk_gated_delta_rule`` declines per call, by shape: a
  prefill of more than ``GDN_TILE_TOKENS`` tokens; shorter ones it serves (with the reference's
  math: a probe has no kernel of its own), appending each served call's token count to the file
  ``GDN_SERVED_LOG_ENV`` names, so a test sees that it served too.
"""

from __future__ import annotations

from pathlib import Path

from sglang_processes import install_source

__all__ = [
    "DECLINE_IMPL_ID",
    "DECLINE_REASON",
    "GDN_DECLINE_IMPL_ID",
    "GDN_DECLINE_REASON",
    "GDN_SERVED_LOG_ENV",
    "GDN_TILE_TOKENS",
    "decline_vendor_site",
    "gdn_decline_vendor_site",
]

DECLINE_IMPL_ID = "vendor.decline.decode_attention"
DECLINE_REASON = "the decline vendor has no decode kernel for this batch"

VENDOR_MODULE = f'''
"""A vendor whose decode_attention declines every call."""
from sglang_fl import Unsupported, hookimpl
from sglang_fl.dispatch.types import BackendImplKind, BackendPriority, OpImpl


def decode_attention(obj, q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                     page_size=1):
    raise Unsupported({DECLINE_REASON!r})


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(
        OpImpl(op_name="decode_attention", impl_id={DECLINE_IMPL_ID!r},
               kind=BackendImplKind.VENDOR, fn=decode_attention, vendor="decline",
               priority=BackendPriority.VENDOR)
    )
'''

GDN_DECLINE_IMPL_ID = "vendor.gdndecline.chunk_gated_delta_rule"
GDN_TILE_TOKENS = 32
GDN_DECLINE_REASON = f"gdndecline: a prefill call of more than {GDN_TILE_TOKENS} tokens"
GDN_SERVED_LOG_ENV = "GDN_DECLINE_SERVED_LOG"

GDN_VENDOR_MODULE = f'''
"""A vendor whose chunk_gated_delta_rule serves short prefills and declines longer ones."""
import os

from sglang_fl import Unsupported, hookimpl
from sglang_fl.dispatch.types import BackendImplKind, BackendPriority, OpImpl
from sglang_fl.ops import get_contract

_REFERENCE = get_contract("chunk_gated_delta_rule").reference


def chunk_gated_delta_rule(obj, q, k, *args, **kwargs):
    if k.shape[1] > {GDN_TILE_TOKENS}:  # checked before anything is computed or written
        raise Unsupported({GDN_DECLINE_REASON!r})
    result = _REFERENCE(obj, q, k, *args, **kwargs)
    served = os.environ.get({GDN_SERVED_LOG_ENV!r})
    if served:
        with open(served, "a") as f:
            f.write(f"{{k.shape[1]}}\\n")
    return result


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(
        OpImpl(op_name="chunk_gated_delta_rule", impl_id={GDN_DECLINE_IMPL_ID!r},
               kind=BackendImplKind.VENDOR, fn=chunk_gated_delta_rule, vendor="gdndecline",
               priority=BackendPriority.VENDOR)
    )
'''


def _pyproject(distribution: str, entry_point: str, package: str) -> str:
    return f"""
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{distribution}"
version = "0.0.1"
dependencies = ["sglang-fl"]

[project.entry-points."sglang_fl.backends"]
{entry_point} = "{package}"
"""


def _install(root: Path, distribution: str, entry_point: str, package: str, module: str) -> Path:
    source = root / "src"
    (source / package).mkdir(parents=True)
    (source / package / "__init__.py").write_text(module)
    (source / "pyproject.toml").write_text(_pyproject(distribution, entry_point, package))
    return install_source(source, root)


def decline_vendor_site(root: Path) -> Path:
    """Build and install the decline vendor under ``root``; returns its site directory."""
    return _install(root, "sglang-fl-decline", "decline", "sglang_fl_decline", VENDOR_MODULE)


def gdn_decline_vendor_site(root: Path) -> Path:
    """Build and install the GDN decline vendor under ``root``; returns its site directory."""
    return _install(
        root, "sglang-fl-gdndecline", "gdndecline", "sglang_fl_gdndecline", GDN_VENDOR_MODULE
    )
