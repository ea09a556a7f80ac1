"""The gated-delta-rule (GDN) family on Ascend: ``fused_gdn_gating`` on sgl_kernel_npu's
operator; the rest declared, not served.

torch_npu has no GDN operators. SGLang 0.5.23's NPU path imports its own from
``sgl_kernel_npu`` (read in the SGLang wheel: ``models/qwen3_next.py`` binds
``sgl_kernel_npu.fla.utils.fused_qkvzba_split_reshape_cat``, ``models/qwen3_5.py``
``..._contiguous`` and ``sgl_kernel_npu.activation.fused_sigmoid_mul``; ``gdn_backend.py`` and
``hardware_backend/npu/attention/ascend_gdn_backend.py`` bind
``sgl_kernel_npu.fla.fused_gdn_gating.fused_gdn_gating_npu`` and
``sgl_kernel_npu.mamba.causal_conv1d.causal_conv1d_fn_npu``/``causal_conv1d_update_npu``;
``gdn_triton.py`` binds ``sgl_kernel_npu.fla.chunk.chunk_gated_delta_rule_npu`` and
``..fused_sigmoid_gating_recurrent_decode_optimized``).

``fused_gdn_gating`` calls ``fused_gdn_gating_npu(A_log, a, b, dt_bias, beta, threshold)`` as
SGLang does (sgl-kernel-npu ``python/sgl_kernel_npu/sgl_kernel_npu/fla/fused_gdn_gating.py``):
its kernel addresses ``a``/``b`` densely (``off = row * NUM_HEADS + head``, no strides), so a
strided row is copied; it returns ``g`` as ``[1, T, HV]`` (``[T, HV]`` after sgl-kernel-npu
#747, a change SGLang 0.5.23 does not follow) and ``beta`` in ``b``'s dtype: both are reshaped
to the contract's ``[1, T, HV]`` float32. No SGLang release pins an sgl_kernel_npu version, and
the other operators' signatures and output layouts differ between its versions (the chunked
prefill takes a gathered state, not a pool and indices), so they are not wrapped yet: each op
is declared with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from sglang_fl.types import Unsupported

from ..backend import SGL_KERNEL_NPU_GATING

_SGLANG = "torch_npu has no operator; SGLang's NPU path calls sgl_kernel_npu's"
_NONE = "torch_npu has no operator and sgl_kernel_npu none that SGLang 0.5.23 uses"
NO_KERNEL = {
    "fused_qkvzba_split_reshape_cat": f"{_SGLANG} fla.utils.fused_qkvzba_split_reshape_cat",
    "fused_qkvzba_split_reshape_cat_contiguous": f"{_SGLANG} "
    "fla.utils.fused_qkvzba_split_reshape_cat_contiguous (Qwen3.5)",
    "fused_sigmoid_mul": f"{_SGLANG} activation.fused_sigmoid_mul (Qwen3.5's attention output "
    "gate, on a contiguous gate)",
    "causal_conv1d_fn": f"{_SGLANG} mamba.causal_conv1d.causal_conv1d_fn_npu",
    "causal_conv1d_update": f"{_SGLANG} mamba.causal_conv1d.causal_conv1d_update_npu",
    "chunk_gated_delta_rule": f"{_SGLANG} fla.chunk.chunk_gated_delta_rule_npu",
    "fused_recurrent_gated_delta_rule": _NONE,
    "fused_recurrent_gated_delta_rule_packed_decode": f"{_NONE} (packed decode is off on NPU)",
    "fused_sigmoid_gating_delta_rule_update": f"{_SGLANG} "
    "fla.fused_sigmoid_gating_recurrent_decode_optimized",
    "rms_norm_gated": _NONE,
    "track_mamba_states": _NONE,
}


def _dense(x: torch.Tensor) -> torch.Tensor:
    return x if x.is_contiguous() else x.contiguous()


def fused_gdn_gating(
    obj: Any,
    A_log: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dt_bias: torch.Tensor,
    beta: float = 1.0,
    threshold: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill gates on ``sgl_kernel_npu``'s ``fused_gdn_gating_npu``; float32 ``[1, T, HV]``."""
    if a.dim() != 2 or b.shape != a.shape or A_log.shape != (a.shape[1],):
        raise Unsupported(
            "fused_gdn_gating: a and b must be [T, HV] and A_log [HV] (sgl_kernel_npu "
            "fused_gdn_gating_npu: `batch, num_heads = a.shape`)"
        )
    tokens, heads = a.shape
    if tokens == 0:  # its launch grid is one program per row: none for an empty batch
        empty = torch.empty(1, 0, heads, dtype=torch.float32, device=a.device)
        return empty, empty.clone()
    sdk = SGL_KERNEL_NPU_GATING.require()
    g, beta_out = sdk.fused_gdn_gating_npu(
        _dense(A_log), _dense(a), _dense(b), _dense(dt_bias), beta, threshold
    )
    shape = (1, tokens, heads)
    return g.reshape(shape).float(), beta_out.reshape(shape).float()


ADAPTERS: Mapping[str, Callable[..., Any]] = {"fused_gdn_gating": fused_gdn_gating}
