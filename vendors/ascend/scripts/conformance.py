#!/usr/bin/env python3
"""Hardware conformance of sglang-fl-ascend: each op vs the reference, timed vs SGLang's own.

Run it on an Ascend machine with CANN, ``torch`` + the matching ``torch_npu``, and
``sglang-fl`` + ``sglang-fl-ascend`` installed (SGLang too, for the timing baseline)::

    python vendors/ascend/scripts/conformance.py [--op rms_norm] [--dtype bfloat16] [--repeat 100]

For every case and dtype of each op contract, the ``vendor.ascend`` implementation runs on the
NPU through core's conformance check (tolerance, untouched inputs, in-place outputs); the
script prints the max absolute and relative error against the reference backend on the same
inputs, and the time per call divided by that of SGLang's ``forward_npu`` on the same layer
(``n/a`` without SGLang; ``--repeat 0`` or ``--no-baseline`` skips timing). Cases the adapters
decline (e.g. ``npu_mrope``'s head-size alignment) show as ``skipped``; a case the operator
rejects anyway shows as ``failed`` with the operator's message. Exit status: 0 when all cases
pass or are declined, 1 otherwise, 2 when the backend is unavailable. The runner is core's
:mod:`sglang_fl.testing.hardware`; this file only says what is Ascend's own.

Decode has two operators: SGLang's default ``_npu_paged_attention`` (16-aligned pages) and FIA
(``npu_fused_infer_attention_score``: other pages and windows, and every decode call with
``ASCEND_USE_FIA=1``, read once per process). Run the script once without and once with
``ASCEND_USE_FIA=1`` to check both on the same cases. The GDN ops run only where
``sgl_kernel_npu`` is installed (otherwise declined, so ``skipped``; the heading gives its
probe's verdict).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch
from sglang_fl_ascend import plugin
from sglang_fl_ascend.backend import TORCH_NPU, SglKernelNpuBackend

from sglang_fl.testing.hardware import HardwareTarget, run_hardware_conformance
from sglang_fl.types import Availability


def synchronize() -> None:
    torch.npu.synchronize()  # type: ignore[attr-defined]  # torch.npu exists once torch_npu is in


def probe() -> Availability:
    """torch_npu's verdict, which decides whether the script runs, with sgl_kernel_npu's after
    it in the heading: without that package the GDN rows are declined (``skipped``)."""
    found = TORCH_NPU.probe()
    if not found:
        return found
    gdn = SglKernelNpuBackend().is_available()
    verdict = gdn.reason if gdn else f"unavailable: {gdn.reason}"
    return Availability(True, f"{found.reason}; GDN ops (sgl_kernel_npu): {verdict}")


TARGET = HardwareTarget(
    title="sglang-fl-ascend",
    register=plugin.sglang_fl_register_ops,  # the adapters exactly as the plugin registers them
    probe=probe,
    device="npu",
    synchronize=synchronize,
    sglang_forward="forward_npu",
)


def main(argv: Sequence[str] | None = None) -> int:
    return run_hardware_conformance(argv, TARGET)


if __name__ == "__main__":
    sys.exit(main())
