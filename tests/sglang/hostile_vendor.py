"""One throwaway vendor distribution whose misbehaviours are switched per run (issue 33).

Installed as a real distribution (``installed_dists``), three entry points, each switched by
an environment variable so that one site serves every attack (and one shared engine can carry
several of them at once):

- ``hostile_offer`` offers a whole attention backend whose ``priority`` is wrong:
  ``HOSTILE_OFFER_PRIORITY`` = ``word`` (``"high"``), ``nan``, ``inf`` (``1e400``), ``text``
  (``"7"``), ``float`` (``2.9``) or ``bool`` (``True``); unset, it offers nothing.
- ``hostile_factory`` offers a whole backend (priority 1000: chosen before other vendors')
  whose factory misbehaves as ``HOSTILE_FACTORY`` says: ``exit`` (``sys.exit(3)``),
  ``baseexc`` (a ``BaseException`` subclass), ``hang`` (sleeps an hour), or builds SGLang's
  ``TorchNativeAttnBackend`` whose decode then ``raise`` s (:data:`DECODE_FAULT`), calls
  ``sys.exit(3)`` (``exit_decode``) or returns a ``wrong_shape`` output; unset, it offers
  nothing.
- ``hostile_kernels`` registers kernels: ``HOSTILE_DECODE=decline``, a ``decode_attention``
  that declines every call (:data:`DECODE_DECLINE`); ``HOSTILE_GDN`` = ``decline`` (its
  ``fused_recurrent_gated_delta_rule_packed_decode`` declines every call), ``outside`` (that
  kernel computes the step, then also writes a state slot no index names) or ``zeros`` (an
  ``rms_norm_gated`` returning zeros).
"""

from __future__ import annotations

from pathlib import Path

from installed_dists import ENTRY_POINT_GROUP, install_dist

__all__ = [
    "DECODE_DECLINE",
    "DECODE_FAULT",
    "FACTORY_IMPL_ID",
    "OFFER_IMPL_ID",
    "hostile_vendor_site",
]

OFFER_IMPL_ID = "vendor.hostile_offer.attention_backend"
FACTORY_IMPL_ID = "vendor.hostile_factory.attention_backend"
DECODE_FAULT = "hostile: the decode kernel faulted on this batch"
DECODE_DECLINE = "hostile: no decode kernel for any batch"

OFFER = """
import os

from sglang_fl import SglangAttentionBackendOffer, hookimpl

PRIORITIES = {"word": "high", "nan": float("nan"), "inf": 1e400, "text": "7", "float": 2.9,
              "bool": True}


def build(model_runner):
    raise AssertionError("an offer whose priority is refused is never built")


@hookimpl
def sglang_fl_attention_backend():
    wanted = os.environ.get("HOSTILE_OFFER_PRIORITY")
    if wanted is None:
        return None
    return SglangAttentionBackendOffer(factory=build, priority=PRIORITIES[wanted])
"""

FACTORY = f"""
import os
import sys
import time

from sglang_fl import SglangAttentionBackendOffer, hookimpl


class PluginBaseError(BaseException):
    pass


def build(model_runner):
    how = os.environ["HOSTILE_FACTORY"]
    if how == "exit":
        sys.exit(3)
    if how == "baseexc":
        raise PluginBaseError("not an Exception")
    if how == "hang":
        time.sleep(3600)
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    class FaultyBackend(TorchNativeAttnBackend):
        def forward_decode(self, q, *args, **kwargs):
            out = super().forward_decode(q, *args, **kwargs)
            if how == "exit_decode":
                sys.exit(3)
            if how == "raise":
                raise RuntimeError({DECODE_FAULT!r})
            return out[:, : out.shape[1] // 2]  # wrong_shape: half of every row

    return FaultyBackend(model_runner)


@hookimpl
def sglang_fl_attention_backend():
    if "HOSTILE_FACTORY" not in os.environ:
        return None
    return SglangAttentionBackendOffer(factory=build, priority=1000)
"""

KERNELS = f"""
import os

import torch

from sglang_fl import Unsupported, hookimpl
from sglang_fl.ops import get_contract
from sglang_fl.types import BackendImplKind, OpImpl

_PACKED = get_contract("fused_recurrent_gated_delta_rule_packed_decode").reference


def decode_attention(obj, q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                     page_size=1):
    raise Unsupported({DECODE_DECLINE!r})


def packed_decode(obj, mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                  ssm_state_indices, use_qk_l2norm_in_kernel=False):
    if os.environ["HOSTILE_GDN"] == "decline":
        raise Unsupported("hostile: no packed decode kernel")
    result = _PACKED(obj, mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                     ssm_state_indices, use_qk_l2norm_in_kernel)
    named = set(ssm_state_indices.reshape(-1).tolist())
    unnamed = [slot for slot in range(initial_state.shape[0]) if slot not in named]
    if unnamed:  # a write no index asked for: another request's state
        initial_state[unnamed[0]] += 1.0
    return result


def rms_norm_gated(obj, x, gate):
    return torch.zeros_like(x)


@hookimpl
def sglang_fl_register_ops(registry):
    impls = []
    if os.environ.get("HOSTILE_DECODE") == "decline":
        impls.append(("decode_attention", decode_attention))
    gdn = os.environ.get("HOSTILE_GDN")
    if gdn in ("decline", "outside"):
        impls.append(("fused_recurrent_gated_delta_rule_packed_decode", packed_decode))
    if gdn == "zeros":
        impls.append(("rms_norm_gated", rms_norm_gated))
    registry.register_many(
        OpImpl(op, f"vendor.hostile_kernels.{{op}}", BackendImplKind.VENDOR, fn,
               vendor="hostile_kernels")
        for op, fn in impls
    )
"""


def hostile_vendor_site(root: Path) -> Path:
    """Install the hostile distribution under ``root``; returns its site directory."""
    return install_dist(
        root / "site",
        "sglang-fl-hostile",
        "0.0.1",
        files={
            "sglang_fl_hostile/__init__.py": "",
            "sglang_fl_hostile/offer.py": OFFER,
            "sglang_fl_hostile/factory.py": FACTORY,
            "sglang_fl_hostile/kernels.py": KERNELS,
        },
        entry_points={
            ENTRY_POINT_GROUP: {
                "hostile_offer": "sglang_fl_hostile.offer",
                "hostile_factory": "sglang_fl_hostile.factory",
                "hostile_kernels": "sglang_fl_hostile.kernels",
            }
        },
    )
