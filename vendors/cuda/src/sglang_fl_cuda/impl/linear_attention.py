"""The gated-delta-rule (GDN) family on CUDA: SGLang 0.5.23's own Triton kernels, behind the
standard signatures.

sgl_kernel has no delta-rule kernels (only the causal convs, :mod:`.causal_conv`); on CUDA
SGLang runs its Triton ones. Six are wrapped here, so
the conformance kit can check them on a GPU and the policy can choose them:
``chunk_gated_delta_rule`` (``fla/chunk.py``), ``fused_recurrent_gated_delta_rule`` and
``..._packed_decode`` (``fla/fused_recurrent.py``), ``fused_sigmoid_gating_delta_rule_update``
(``linear/fused_sigmoid_gating_recurrent.py``), ``fused_gdn_gating``
(``linear/fused_gdn_gating.py``) and ``rms_norm_gated`` (``fla/fused_norm_gate.py``'s
``layer_norm_gated_fwd``), all under ``sglang/kernels/ops/attention/``. They are reached
through :mod:`sglang_fl_cuda.sglang_triton` (the ``SGLANG_TRITON`` probe), which calls SGLang's
function *without* sglang-fl's own routing hook around it.

Interplay with the routing (``integrations/sglang/linear_attention.py``): without these
adapters the reference was the only implementation, and where Triton runs the routing left the
function to SGLang. Now ``vendor.cuda`` is chosen on a GPU, so the routing binds it: SGLang's
call reaches the same Triton kernel through the adapter. That is correct (the kernel gets the
arguments SGLang would have passed it) and adds what SGLang lacks: a call the kernel cannot
serve (float32 prefill, a head ratio, a strided pool it would copy, an index past the pool) is
declined with the reason in the dispatch report and the next candidate serves, instead of an
assert or a write outside the pool. The cost is a few host-side checks per call, and one
device-to-host read of the state indices (skipped while a CUDA graph is being captured, where
no read is possible; SGLang's own indices are then trusted, as SGLang trusts them).

The causal convs are sgl_kernel's (:mod:`.causal_conv`). The other ops (and Qwen3.5's contiguous
split and attention output gate, routed with them) have no adapter yet (``NO_KERNEL``): their
Triton kernels stay in place.
Every refusal below cites the kernel source it follows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from sglang_fl.ops.linear_attention import PAD_SLOT_ID, check_state_indices
from sglang_fl.types import Unsupported

from ..backend import SGLANG_TRITON

_PREFIX = "sgl_kernel has no kernel for it; SGLang's own Triton kernel"
_NO_ADAPTER = "no adapter in this wheel yet, so it stays in place"
NO_KERNEL = {
    "fused_qkvzba_split_reshape_cat": f"{_PREFIX} (triton_gdn_fused_proj): {_NO_ADAPTER}",
    "fused_qkvzba_split_reshape_cat_contiguous": f"{_PREFIX} (triton_gdn_fused_proj, Qwen3.5's "
    f"layout): {_NO_ADAPTER}",
    "fused_sigmoid_mul": "sgl_kernel has none; SGLang's own Triton kernel (elementwise."
    f"fused_sigmoid_mul, Qwen3.5's attention output gate): {_NO_ADAPTER}",
    "track_mamba_states": f"{_PREFIX} (mamba/mamba_state_scatter_triton): {_NO_ADAPTER}",
}

# Where the refusals come from: SGLang 0.5.23, sglang/kernels/ops/attention/...
CHUNK = "fla/chunk.py"
CHUNK_H = "fla/chunk_delta_h.py"
RECURRENT = "fla/fused_recurrent.py"
SIGMOID = "linear/fused_sigmoid_gating_recurrent.py"
GATING = "linear/fused_gdn_gating.py"
NORM = "fla/fused_norm_gate.py"
# layer_norm_gated_fwd: "This layer norm doesn't support feature dim >= 64KB."
MAX_NORM_ROW_BYTES = 65536
# The gate activations layer_norm_gated_fwd_kernel applies (any other: no gate at all).
NORM_ACTIVATIONS = frozenset({"swish", "silu", "sigmoid"})
# chunk_gated_delta_rule_fwd_h: `assert K <= 256`.
MAX_CHUNK_HEAD_DIM = 256


def _heads(op: str, heads_qk: int, heads_v: int, source: str) -> None:
    if heads_qk <= 0 or heads_v % heads_qk:
        raise Unsupported(
            f"{op}: SGLang's Triton kernel maps value head i to key head i // (HV // H), so "
            f"HV ({heads_v}) must be a multiple of H ({heads_qk}) ({source})"
        )


def _rows_packed(state: torch.Tensor) -> bool:
    """Whether each pool slot ``[HV, V, K]`` is dense (the slot pitch, ``stride(0)``, is free)."""
    dv, dk = state.shape[-2:]
    return state.stride(3) == 1 and state.stride(2) == dk and state.stride(1) == dv * dk


def _require_in_pool(op: str, indices: torch.Tensor, slots: int, *, padding: bool) -> None:
    """Decline an index the kernel would follow outside the pool (none checks the bound)."""
    check_state_indices(
        op,
        indices,
        slots,
        pad_slot_id=PAD_SLOT_ID if padding else None,
        error=Unsupported,
        why="SGLang's Triton kernel does not check the bound and would write past the pool",
    )


def _positive_scale(op: str, scale: float | None, source: str) -> None:
    if scale is not None and not scale > 0:
        raise Unsupported(f"{op}: SGLang's kernel asserts scale > 0, got {scale} ({source})")


def _token_major(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``[B, T, H, D]`` as the sigmoid-gating kernel addresses it: token ``t`` of a row
    at ``t * stride(1)``, heads and features dense within it (a read-only input: a copy
    serves where it is not)."""
    batch, tokens, _, dim = x.shape
    dense = x.stride(3) == 1 and x.stride(2) == dim
    rows = batch == 1 or x.stride(0) == tokens * x.stride(1)
    return x if dense and rows else x.contiguous()


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    """``x`` with a unit last-dim stride (a read-only input: a copy serves where it is not)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def chunk_gated_delta_rule(
    obj: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    initial_state_indices: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    inplace_update: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prefill on ``chunk_gated_delta_rule`` (``fla/chunk.py``); returns ``(o, h, states)``."""
    op = "chunk_gated_delta_rule"
    batch, tokens, heads_qk, dk = k.shape
    heads_v, dv = v.shape[-2], v.shape[-1]
    if not q.dtype == k.dtype == v.dtype:
        raise Unsupported(f"{op}: q, k and v must share a dtype ({CHUNK}: `assert q.dtype == ...`)")
    if q.dtype == torch.float32:
        raise Unsupported(
            f"{op}: SGLang's chunked kernel does not support float32 ({CHUNK}: `assert q.dtype "
            "!= torch.float32`); float16/bfloat16 only"
        )
    if beta.dim() != 3:
        raise Unsupported(f"{op}: beta must be [B, T, HV] ({CHUNK}: `assert len(beta.shape) == 3`)")
    if dk > MAX_CHUNK_HEAD_DIM:
        raise Unsupported(
            f"{op}: head dim K={dk} > {MAX_CHUNK_HEAD_DIM} ({CHUNK_H}: `assert K <= 256`)"
        )
    _heads(op, heads_qk, heads_v, f"{CHUNK_H}, `i_h // (H // Hg)`")
    sequences = batch if cu_seqlens is None else cu_seqlens.numel() - 1
    pool = initial_state
    if pool is None:  # the kernel always reads and writes a pool: give it one of zeros
        pool = torch.zeros(sequences, heads_v, dv, dk, dtype=torch.float32, device=k.device)
        inplace_update = True
    elif not pool.is_contiguous():
        raise Unsupported(
            f"{op}: the state pool must be contiguous: SGLang's input_guard ({CHUNK}, "
            "ChunkGatedDeltaRuleFunction.forward) copies a strided one, so the in-place update "
            "would be lost"
        )
    indices = initial_state_indices
    if indices is None:
        if pool.shape[0] < sequences:
            raise Unsupported(f"{op}: {sequences} sequences but a pool of {pool.shape[0]} slots")
        indices = torch.arange(sequences, dtype=torch.int32, device=k.device)
    elif indices.numel() != sequences:
        raise Unsupported(f"{op}: {indices.numel()} state indices for {sequences} sequences")
    else:
        _require_in_pool(op, indices, pool.shape[0], padding=False)
    if tokens == 0:  # prepare_chunk_indices (fla/index.py) would torch.cat an empty list
        o = q.new_zeros(batch, 0, heads_v, dv)
        return o, k.new_zeros(1, 0, heads_v, dv, dk), pool
    sglang = SGLANG_TRITON.require()
    o, _, h = sglang.chunk_gated_delta_rule(
        q=q,
        k=k,
        v=v,
        g=g,
        beta=beta,
        scale=scale,
        initial_state=pool,
        initial_state_indices=indices,
        cu_seqlens=cu_seqlens,
        head_first=False,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        inplace_update=inplace_update,
    )
    return o, h, pool


def fused_recurrent_gated_delta_rule(
    obj: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token by token on ``fused_recurrent_gated_delta_rule`` (``fla/fused_recurrent.py``)."""
    op = "fused_recurrent_gated_delta_rule"
    batch = k.shape[0]
    heads_qk, heads_v = k.shape[-2], v.shape[-2]
    _heads(op, heads_qk, heads_v, f"{RECURRENT}, fused_recurrent_gated_delta_rule_fwd_kernel")
    _positive_scale(op, scale, f"{RECURRENT}: `assert scale > 0`")
    sequences = batch if cu_seqlens is None else cu_seqlens.numel() - 1
    if initial_state is not None and initial_state.shape[0] != sequences:
        raise Unsupported(f"{op}: {initial_state.shape[0]} initial states, {sequences} sequences")
    if beta is None:  # SGLang's default, ones_like(q[..., 0]), has H heads, not HV
        beta = torch.ones_like(g)
    sglang = SGLANG_TRITON.require()
    o, final = sglang.fused_recurrent_gated_delta_rule(
        q=q,
        k=k,
        v=v,
        g=g,
        beta=beta,
        scale=scale,
        initial_state=initial_state,
        output_final_state=True,  # the contract always returns the final state
        cu_seqlens=cu_seqlens,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
    )
    return o, final


def fused_recurrent_gated_delta_rule_packed_decode(
    obj: Any,
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor,
    out: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    use_qk_l2norm_in_kernel: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode on ``fused_recurrent_gated_delta_rule_packed_decode`` (``fla/fused_recurrent.py``):
    its own argument checks raise ``ValueError``; the ones a valid contract call can meet are
    declined here first."""
    op = "fused_recurrent_gated_delta_rule_packed_decode"
    if not out.is_contiguous():
        raise Unsupported(f"{op}: out must be contiguous ({RECURRENT}: '`out` must be contiguous')")
    if initial_state.dim() != 4 or not _rows_packed(initial_state):
        raise Unsupported(
            f"{op}: each state slot [HV, V, K] must be dense ({RECURRENT}: the kernel addresses "
            "h0 + idx * stride(0) + i_hv * V * K + v * K + k)"
        )
    if ssm_state_indices.dim() != 1:
        raise Unsupported(f"{op}: ssm_state_indices must be 1-D ({RECURRENT})")
    _require_in_pool(op, ssm_state_indices, initial_state.shape[0], padding=True)
    sglang = SGLANG_TRITON.require()
    got, state = sglang.fused_recurrent_gated_delta_rule_packed_decode(
        mixed_qkv=_unit_last(mixed_qkv),
        a=_unit_last(a),
        b=_unit_last(b),
        A_log=A_log.contiguous(),
        dt_bias=dt_bias.contiguous(),
        scale=scale,
        initial_state=initial_state,
        out=out,
        ssm_state_indices=ssm_state_indices,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
    )
    return got, state


def fused_sigmoid_gating_delta_rule_update(
    obj: Any,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    softplus_beta: float,
    softplus_threshold: float,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    b: torch.Tensor,
    initial_state_source: torch.Tensor,
    initial_state_indices: torch.Tensor,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode on ``fused_sigmoid_gating_delta_rule_update``; returns ``(o, pool)``."""
    op = "fused_sigmoid_gating_delta_rule_update"
    heads_qk, heads_v = k.shape[-2], v.shape[-2]
    _heads(op, heads_qk, heads_v, f"{SIGMOID}, `i_h = i_hv // (HV // H)`")
    _positive_scale(op, scale, f"{SIGMOID}: `assert scale > 0`")
    if not _rows_packed(initial_state_source):
        raise Unsupported(
            f"{op}: each state slot [HV, V, K] must be dense ({SIGMOID}: the kernel addresses "
            "h0_source + idx * stride(0) + i_hv * K * V + v * K + k)"
        )
    sequences = k.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    if initial_state_indices.numel() != sequences:
        raise Unsupported(f"{op}: {initial_state_indices.numel()} indices, {sequences} sequences")
    _require_in_pool(op, initial_state_indices, initial_state_source.shape[0], padding=True)
    sglang = SGLANG_TRITON.require()
    o = sglang.fused_sigmoid_gating_delta_rule_update(
        A_log=A_log.contiguous(),
        a=_unit_last(a),
        dt_bias=dt_bias.contiguous(),
        softplus_beta=softplus_beta,
        softplus_threshold=softplus_threshold,
        q=_token_major(q),
        k=_token_major(k),
        v=_token_major(v),
        b=_unit_last(b),
        initial_state_source=initial_state_source,
        initial_state_indices=initial_state_indices,
        scale=scale,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=cu_seqlens,
    )
    return o, initial_state_source


def fused_gdn_gating(
    obj: Any,
    A_log: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dt_bias: torch.Tensor,
    beta: float = 1.0,
    threshold: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill gates on ``fused_gdn_gating`` (``linear/fused_gdn_gating.py``): the kernel
    addresses row ``i`` at ``i * stride(0)`` and its heads densely, so a row with a strided
    last dim is copied first (``a``/``b`` are only read)."""
    if a.dim() != 2 or b.shape != a.shape:
        raise Unsupported(f"fused_gdn_gating: a and b must be [T, HV] ({GATING}: batch, "
                          "num_heads = a.shape)")  # fmt: skip
    sglang = SGLANG_TRITON.require()
    g, beta_out = sglang.fused_gdn_gating(
        A_log.contiguous(), _unit_last(a), _unit_last(b), dt_bias.contiguous(), beta, threshold
    )
    return g, beta_out


def rms_norm_gated(obj: Any, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """The gated RMS norm on ``layer_norm_gated_fwd`` (``fla/fused_norm_gate.py``), the launcher
    under ``FusedRMSNormGated.forward``: asked for a new output (``out_dtype``), since by
    default it writes the result over ``x``."""
    op = "rms_norm_gated"
    if obj.activation not in NORM_ACTIVATIONS:
        raise Unsupported(f"{op}: activation {obj.activation!r}: the kernel gates with "
                          f"{sorted(NORM_ACTIVATIONS)} only ({NORM})")  # fmt: skip
    hidden = x.shape[-1]
    if not getattr(obj, "norm_before_gate", True):
        raise Unsupported(f"{op}: SGLang's kernel normalises before gating ({NORM})")
    if getattr(obj, "group_size", None) not in (None, hidden):
        raise Unsupported(f"{op}: SGLang's kernel normalises whole rows, no groups ({NORM})")
    weight = getattr(obj, "weight", None)
    if weight is None or x.dim() != 2 or gate.shape != x.shape or weight.shape != (hidden,):
        raise Unsupported(f"{op}: x and gate [T, hidden], weight [hidden] ({NORM})")
    if hidden * x.element_size() > MAX_NORM_ROW_BYTES:
        raise Unsupported(f"{op}: rows over 64 KB ({NORM}: layer_norm_gated_fwd raises)")
    if x.shape[0] == 0:
        return x.new_empty(x.shape)
    sglang = SGLANG_TRITON.require()
    y, _, _, _ = sglang.layer_norm_gated_fwd(
        x=x.contiguous(),  # rows addressed at i * hidden (make_block_ptr strides (D, 1))
        g=gate.contiguous(),
        weight=weight.contiguous(),
        bias=None,
        activation=obj.activation,
        eps=obj.eps,
        out_dtype=x.dtype,
        is_rms_norm=True,
    )
    result: torch.Tensor = y
    return result


ADAPTERS: Mapping[str, Callable[..., Any]] = {
    "chunk_gated_delta_rule": chunk_gated_delta_rule,
    "fused_recurrent_gated_delta_rule": fused_recurrent_gated_delta_rule,
    "fused_recurrent_gated_delta_rule_packed_decode": (
        fused_recurrent_gated_delta_rule_packed_decode
    ),
    "fused_sigmoid_gating_delta_rule_update": fused_sigmoid_gating_delta_rule_update,
    "fused_gdn_gating": fused_gdn_gating,
    "rms_norm_gated": rms_norm_gated,
}
