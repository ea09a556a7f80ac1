"""A throwaway vendor whose chip is not in this machine: its probe says no, with a reason.

It registers kernels for ``rms_norm`` and the attention ops (the reference math), each with an
availability probe that returns ``Availability(False, OFFLINE_REASON)``, the way a real vendor
wheel behaves on a machine without its chip. Installed as a ``.dist-info`` beside core
(``installed_dists``), so entry-point discovery finds it like any installed wheel; an engine
carrying it must run on sglang-fl's own kernels and its report must say why this vendor was
skipped.
"""

from __future__ import annotations

from pathlib import Path

from installed_dists import ENTRY_POINT_GROUP, install_dist

__all__ = ["OFFLINE_DISTRIBUTION", "OFFLINE_OPS", "OFFLINE_REASON", "offline_vendor_site"]

OFFLINE_DISTRIBUTION = "sglang-fl-offline-chip"
OFFLINE_REASON = "offline_chip: no device (driver not loaded)"
OFFLINE_OPS = ("rms_norm", "decode_attention", "extend_attention")

OFFLINE_MODULE = f'''
"""A vendor whose chip is not in this machine: its probe says no, with a reason."""
from sglang_fl.ops import get_contract
from sglang_fl.types import Availability, BackendImplKind, OpImpl, hookimpl


def available():
    return Availability(False, {OFFLINE_REASON!r})


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register_many(
        [
            OpImpl(
                op_name=op,
                impl_id=f"vendor.offline_chip.{{op}}",
                kind=BackendImplKind.VENDOR,
                fn=get_contract(op).reference,
                vendor="offline_chip",
                available=available,
            )
            for op in {OFFLINE_OPS!r}
        ]
    )
'''


def offline_vendor_site(root: Path) -> Path:
    """Install the offline vendor under ``root``; returns its site directory."""
    return install_dist(
        root,
        OFFLINE_DISTRIBUTION,
        "0.1.0",
        files={"sglang_fl_offline_chip.py": OFFLINE_MODULE},
        entry_points={ENTRY_POINT_GROUP: {"offline_chip": "sglang_fl_offline_chip"}},
    )
