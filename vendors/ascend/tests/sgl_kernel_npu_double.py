"""A TEST DOUBLE of ``sgl_kernel_npu.fla.fused_gdn_gating``: sgl_kernel_npu's GDN gating
operator, on the CPU.

Not the real operator (a Triton-Ascend kernel that needs an NPU). Same name, arguments and
outputs as ``fused_gdn_gating_npu(A_log, a, b, dt_bias, beta=1.0, threshold=20.0) -> (g,
beta_output)`` in sgl-kernel-npu ``python/sgl_kernel_npu/sgl_kernel_npu/fla/fused_gdn_gating.py``
(the version SGLang 0.5.23's ``ascend_gdn_backend.py`` imports with
``fused_gdn_gating_kernel_without_sigmoid``): ``g`` float32 ``[1, B, HV]`` (``[B, HV]`` with
``flat_g``, the layout of sgl-kernel-npu #747), ``beta_output`` in ``b``'s dtype. Each
precondition is a :class:`~sglang_fl.testing.doubles.Constraint` naming its source; after the
checks it computes with core's reference of ``fused_gdn_gating``.
"""

from __future__ import annotations

import torch

from sglang_fl.ops import get_contract
from sglang_fl.testing.doubles import Constraint, SdkDouble

SOURCE = "sgl-kernel-npu python/sgl_kernel_npu/sgl_kernel_npu/fla/fused_gdn_gating.py"


class SglKernelNpuGatingDouble(SdkDouble):
    """``sgl_kernel_npu.fla.fused_gdn_gating`` stand-in: ``fused_gdn_gating_npu``."""

    GATING_LAYOUT = Constraint(
        "fused_gdn_gating_npu",
        "contiguous a and b [B, HV] of one shape, contiguous A_log and dt_bias [HV]",
        f"{SOURCE}, fused_gdn_gating_kernel: off = batch_off * seq_len * NUM_HEADS + i_s * "
        "NUM_HEADS + head_off, A_log + head_off (no strides); fused_gdn_gating_npu: "
        "`batch, num_heads = a.shape`",
        "reads the wrong elements (not checked)",
    )
    GATING_ROWS = Constraint(
        "fused_gdn_gating_npu",
        "at least one row",
        f"{SOURCE}, fused_gdn_gating_npu: progs = batch when batch <= num_cores, grid "
        "(progs, seq_len)",
        "launches an empty grid",
    )

    def __init__(self, *, flat_g: bool = False) -> None:
        super().__init__("sgl_kernel_npu.fla.fused_gdn_gating")
        self.flat_g = flat_g

    def fused_gdn_gating_npu(
        self,
        A_log: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        dt_bias: torch.Tensor,
        beta: float = 1.0,
        threshold: float = 20.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.record("fused_gdn_gating_npu", A_log, a, b, dt_bias, beta, threshold)
        heads = a.shape[-1]
        layout = (
            a.dim() == 2
            and b.shape == a.shape
            and a.is_contiguous()
            and b.is_contiguous()
            and A_log.shape == dt_bias.shape == (heads,)
            and A_log.is_contiguous()
            and dt_bias.is_contiguous()
        )
        self.GATING_LAYOUT.check(layout, f"a {list(a.shape)} strides {a.stride()}")
        self.GATING_ROWS.check(a.shape[0] > 0, "no rows")
        reference = get_contract("fused_gdn_gating").reference
        g, beta_out = reference(None, A_log, a, b, dt_bias, beta, threshold)
        return (g[0] if self.flat_g else g), beta_out.to(b.dtype)
