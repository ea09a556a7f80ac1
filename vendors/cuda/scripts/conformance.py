#!/usr/bin/env python3
"""Hardware conformance of sglang-fl-cuda: each op vs the reference, timed vs SGLang's own.

Run it on a machine with an NVIDIA GPU, a CUDA build of torch, ``sgl_kernel``, and
``sglang-fl`` + ``sglang-fl-cuda`` installed (SGLang too, for the timing baseline)::

    python vendors/cuda/scripts/conformance.py [--op rms_norm] [--dtype bfloat16] [--repeat 100]

For every case and dtype of each op contract it runs the ``vendor.cuda`` implementation on the
GPU through core's conformance check (values within the dtype's tolerance, untouched inputs,
in-place outputs), prints the max absolute and relative error against the reference backend
on the same inputs, and the time per call of this backend divided by the time of SGLang's own
``forward_cuda`` on the same layer and tensors (``n/a`` without SGLang; ``--no-baseline`` or
``--repeat 0`` skips timing). Exit status: 0 when every case passes or is declined
(``Unsupported``), 1 when one fails, 2 when the backend is unavailable here (the reason is
printed). The runner is core's :mod:`sglang_fl.testing.hardware`; this file only says what is
CUDA's own: the adapters as the plugin registers them, and its probes. ``sgl_kernel`` decides
whether the script runs; the heading gives every other probe's verdict too (FlashAttention-3,
which a Blackwell GPU lacks, ``sgl_kernel.mamba``'s causal convs, SGLang's Triton GDN kernels,
NCCL), so a row declined because its piece is missing here is explained above it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import torch
from sglang_fl_cuda import plugin
from sglang_fl_cuda.backend import (
    SGL_KERNEL,
    SGL_KERNEL_MAMBA,
    SGLANG_TRITON,
    FlashAttnBackend,
    NcclBackend,
)

from sglang_fl.testing.hardware import HardwareTarget, run_hardware_conformance
from sglang_fl.types import Availability

# The probes besides sgl_kernel's, each deciding a group of the plugin's adapters.
OTHER_PROBES: dict[str, Callable[[], Availability]] = {
    "FlashAttention-3 (decode/extend_attention)": FlashAttnBackend().is_available,
    "causal convs": SGL_KERNEL_MAMBA.probe,
    "GDN": SGLANG_TRITON.probe,
    "collectives": NcclBackend().is_available,
}


def probe() -> Availability:
    """``sgl_kernel``'s verdict, with every other probe's reason after it."""
    found = SGL_KERNEL.probe()
    if not found:
        return found
    others = "; ".join(
        f"{group}: {verdict.reason if verdict else f'unavailable: {verdict.reason}'}"
        for group, verdict in ((group, check()) for group, check in OTHER_PROBES.items())
    )
    return Availability(True, f"{found.reason}; {others}")


TARGET = HardwareTarget(
    title="sglang-fl-cuda",
    register=plugin.sglang_fl_register_ops,  # the adapters exactly as the plugin registers them
    probe=probe,
    device="cuda",
    synchronize=torch.cuda.synchronize,
    sglang_forward="forward_cuda",
    device_name=torch.cuda.get_device_name,
)


def main(argv: Sequence[str] | None = None) -> int:
    return run_hardware_conformance(argv, TARGET)


if __name__ == "__main__":
    sys.exit(main())
