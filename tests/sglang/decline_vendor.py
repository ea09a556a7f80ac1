"""A throwaway vendor wheel whose ``decode_attention`` declines every call.

Built as a real wheel and installed with ``pip --target`` (as the probe vendor), it ranks
above the reference, so it is chosen; each call raises :class:`sglang_fl.Unsupported` before
computing, so the reference must run it (and the report say why), or, with
``SGLANG_FL_STRICT=1``, the call must fail naming the op and this implementation.
"""

from __future__ import annotations

from pathlib import Path

from sglang_processes import install_wheel_from_source

__all__ = ["DECLINE_IMPL_ID", "DECLINE_REASON", "decline_vendor_site"]

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

VENDOR_PYPROJECT = """
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang-fl-decline"
version = "0.0.1"
dependencies = ["sglang-fl"]

[project.entry-points."sglang_fl.backends"]
decline = "sglang_fl_decline"
"""


def decline_vendor_site(root: Path) -> Path:
    """Build and install the decline vendor under ``root``; returns its site directory."""
    source = root / "src"
    (source / "sglang_fl_decline").mkdir(parents=True)
    (source / "sglang_fl_decline" / "__init__.py").write_text(VENDOR_MODULE)
    (source / "pyproject.toml").write_text(VENDOR_PYPROJECT)
    return install_wheel_from_source(source, root)
