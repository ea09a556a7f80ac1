"""A TEST DOUBLE of ``sglang_fl_cuda.sglang_triton``: SGLang 0.5.23's Triton GDN kernels, on
the CPU.

Not the real kernels. It stands in for the module the ``SGLANG_TRITON`` probe imports (which
forwards to SGLang's functions unchanged), so the CUDA adapters can be checked here without a
GPU: the same function names, keyword arguments, return values and in-place writes as SGLang's
``chunk_gated_delta_rule``, ``fused_recurrent_gated_delta_rule``,
``fused_recurrent_gated_delta_rule_packed_decode``, ``fused_sigmoid_gating_delta_rule_update``,
``fused_gdn_gating`` and ``fused_norm_gate.layer_norm_gated_fwd``, and every precondition of
theirs, each a :class:`~sglang_fl.testing.doubles.Constraint` naming its source in
``sglang/kernels/ops/attention/`` of SGLang 0.5.23: the functions' own asserts and
``ValueError``s, and the kernels' addressing where a violation is not checked but reads or
writes the wrong memory. After its checks it computes with core's reference of the op
(``get_contract(op).reference``). Options the adapters never pass (``head_first``, padding
indices in the chunked kernel) raise ``NotImplementedError`` rather than a guessed result.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from sglang_fl.ops import get_contract
from sglang_fl.testing.doubles import Constraint, SdkDouble

SGLANG = "SGLang 0.5.23 sglang/kernels/ops/attention"
CHUNK = f"{SGLANG}/fla/chunk.py, chunk_gated_delta_rule"
CHUNK_H = f"{SGLANG}/fla/chunk_delta_h.py"
RECURRENT = f"{SGLANG}/fla/fused_recurrent.py"
PACKED = f"{RECURRENT}, fused_recurrent_gated_delta_rule_packed_decode"
SIGMOID = f"{SGLANG}/linear/fused_sigmoid_gating_recurrent.py"
GATING = f"{SGLANG}/linear/fused_gdn_gating.py"
NORM = f"{SGLANG}/fla/fused_norm_gate.py"
HEAD_MAP = "value head i reads key head i // (HV // H)"
WRONG_MEMORY = "reads or writes the wrong elements (not checked)"
PAST_THE_POOL = "reads and writes past the pool (no bound check)"


def _dense_slots(state: torch.Tensor) -> bool:
    dv, dk = state.shape[-2:]
    return state.dim() == 4 and (state.stride(3), state.stride(2), state.stride(1)) == (
        1,
        dk,
        dv * dk,
    )


def _in_pool(indices: torch.Tensor, slots: int) -> bool:
    return bool(((indices >= -1) & (indices < slots)).all())


def _token_major(x: torch.Tensor) -> bool:
    batch, tokens, _, dim = x.shape
    return (
        x.stride(3) == 1
        and x.stride(2) == dim
        and (batch == 1 or x.stride(0) == tokens * x.stride(1))
    )


def _unmodeled(holds: bool, what: str) -> None:
    if not holds:
        raise NotImplementedError(f"the SGLang Triton GDN double does not model {what}")


class SglangTritonGdnDouble(SdkDouble):
    """``sglang_fl_cuda.sglang_triton`` stand-in: SGLang's six Triton GDN entry points."""

    # -- chunk_gated_delta_rule -------------------------------------------------------------
    CHUNK_DTYPE = Constraint(
        "chunk_gated_delta_rule",
        "q, k and v of one dtype, float16 or bfloat16",
        f"{CHUNK}: `assert q.dtype == k.dtype == v.dtype`, `assert q.dtype != torch.float32`",
        "raises AssertionError",
    )
    CHUNK_BETA = Constraint(
        "chunk_gated_delta_rule",
        "beta of shape [B, T, HV]",
        f"{CHUNK}: `assert len(beta.shape) == 3`",
        "raises AssertionError",
    )
    CHUNK_HEAD_DIM = Constraint(
        "chunk_gated_delta_rule",
        "a key head dim K <= 256",
        f"{CHUNK_H}, chunk_gated_delta_rule_fwd_h: `assert K <= 256`",
        "raises AssertionError",
    )
    CHUNK_HEADS = Constraint(
        "chunk_gated_delta_rule",
        "HV a multiple of H",
        f"{CHUNK_H}, fla/chunk_fwd.py and fla/chunk_o.py: {HEAD_MAP}",
        WRONG_MEMORY,
    )
    CHUNK_VARLEN = Constraint(
        "chunk_gated_delta_rule",
        "with cu_seqlens, batch 1 and one state index per sequence",
        f"{CHUNK}: raise ValueError('The batch size is expected to be 1 ...', 'The number of "
        "initial states is expected to be equal to the number of input sequences ...')",
        "raises ValueError",
    )
    CHUNK_POOL = Constraint(
        "chunk_gated_delta_rule",
        "a state pool and its indices",
        f"{CHUNK_H}, chunk_gated_delta_rule_fwd_kernel_h_blockdim64: `index = "
        "tl.load(initial_state_indices + i_n)` unconditionally, ht = initial_state + index * "
        "stride_init_state",
        "dereferences a null pointer",
    )
    CHUNK_POOL_CONTIGUOUS = Constraint(
        "chunk_gated_delta_rule",
        "a contiguous state pool",
        f"{SGLANG}/fla/utils.py input_guard (on ChunkGatedDeltaRuleFunction.forward) calls "
        ".contiguous() on every tensor argument",
        "updates a copy of a strided pool: the in-place write is lost",
    )
    CHUNK_INDEX = Constraint(
        "chunk_gated_delta_rule",
        "state indices in -1..N-1 (-1 skipped)",
        f"{CHUNK_H}, chunk_gated_delta_rule_fwd_kernel_h_blockdim64: `valid_state = index >= 0` "
        "is the only check",
        PAST_THE_POOL,
    )
    CHUNK_TOKENS = Constraint(
        "chunk_gated_delta_rule",
        "with cu_seqlens, at least one token",
        f"{SGLANG}/fla/index.py prepare_chunk_indices: torch.cat of one arange per sequence, "
        "each empty",
        "raises RuntimeError (torch.cat of empty tensors only)",
    )

    # -- fused_recurrent_gated_delta_rule ---------------------------------------------------
    RECURRENT_SCALE = Constraint(
        "fused_recurrent_gated_delta_rule",
        "scale None or > 0",
        f"{RECURRENT}, fused_recurrent_gated_delta_rule: `assert scale > 0`",
        "raises AssertionError",
    )
    RECURRENT_HEADS = Constraint(
        "fused_recurrent_gated_delta_rule",
        "HV a multiple of H",
        f"{RECURRENT}, fused_recurrent_gated_delta_rule_fwd_kernel: {HEAD_MAP}",
        WRONG_MEMORY,
    )
    RECURRENT_BETA = Constraint(
        "fused_recurrent_gated_delta_rule",
        "beta [B, T, HV] (its default, ones_like(q[..., 0]), has H heads)",
        f"{RECURRENT}, fused_recurrent_gated_delta_rule_fwd_kernel: p_beta += HV per token",
        "reads past beta when HV > H",
    )
    RECURRENT_VARLEN = Constraint(
        "fused_recurrent_gated_delta_rule",
        "with cu_seqlens, batch 1 and one initial state per sequence",
        f"{RECURRENT}, fused_recurrent_gated_delta_rule: raise ValueError(...)",
        "raises ValueError",
    )

    # -- fused_recurrent_gated_delta_rule_packed_decode -------------------------------------
    PACKED_LAYOUT = Constraint(
        "fused_recurrent_gated_delta_rule_packed_decode",
        "2-D mixed_qkv, a, b with a unit last stride, 1-D contiguous A_log/dt_bias and 1-D "
        "indices, a contiguous out",
        f"{PACKED}: raise ValueError('`mixed_qkv` must be contiguous in the last dim.', ...)",
        "raises ValueError",
    )
    PACKED_SHAPES = Constraint(
        "fused_recurrent_gated_delta_rule_packed_decode",
        "consistent shapes: [B] indices, [B, HV] a/b, [HV] A_log/dt_bias, out [B, 1, HV, V], "
        "mixed_qkv [B, 2 * H * K + HV * V] with HV a multiple of H",
        f"{PACKED}: raise ValueError('Mismatched batch sizes ...', 'Invalid head config ...')",
        "raises ValueError",
    )
    PACKED_STATE = Constraint(
        "fused_recurrent_gated_delta_rule_packed_decode",
        "a 4-D state pool with dense [HV, V, K] slots",
        f"{PACKED}: checks only stride(-1) == 1; the kernel addresses h0 + idx * stride(0) + "
        "i_hv * V * K + v * K + k",
        WRONG_MEMORY,
    )
    PACKED_INDEX = Constraint(
        "fused_recurrent_gated_delta_rule_packed_decode",
        "state indices in -1..N-1 (-1 a padding row)",
        f"{PACKED}_kernel: `if state_idx < 0: ... return` is the only check",
        PAST_THE_POOL,
    )

    # -- fused_sigmoid_gating_delta_rule_update ---------------------------------------------
    SIGMOID_SCALE = Constraint(
        "fused_sigmoid_gating_delta_rule_update",
        "scale None or > 0",
        f"{SIGMOID}, fused_sigmoid_gating_delta_rule_update: `assert scale > 0`",
        "raises AssertionError",
    )
    SIGMOID_HEADS = Constraint(
        "fused_sigmoid_gating_delta_rule_update",
        "HV a multiple of H",
        f"{SIGMOID}, fused_sigmoid_gating_delta_rule_update_kernel: {HEAD_MAP}",
        WRONG_MEMORY,
    )
    SIGMOID_LAYOUT = Constraint(
        "fused_sigmoid_gating_delta_rule_update",
        "token-major q/k/v (heads and features dense in a token), a/b with a unit last stride, "
        "contiguous A_log/dt_bias",
        f"{SIGMOID}: the kernel addresses q + bos * q.stride(1) + i_h * K + k, a + bos * "
        "a.stride(-2) + i_hv, A_log + i_hv",
        WRONG_MEMORY,
    )
    SIGMOID_POOL = Constraint(
        "fused_sigmoid_gating_delta_rule_update",
        "a state pool with dense [HV, V, K] slots",
        f"{SIGMOID}: the kernel addresses h0_source + idx * stride(0) + i_hv * K * V + v * K + k",
        WRONG_MEMORY,
    )
    SIGMOID_INDEX = Constraint(
        "fused_sigmoid_gating_delta_rule_update",
        "one state index per sequence, in -1..N-1 (-1: from zeros, not written)",
        f"{SIGMOID}, fused_sigmoid_gating_delta_rule_update_kernel: `if idx >= 0` is the only "
        "check",
        PAST_THE_POOL,
    )

    # -- fused_gdn_gating -------------------------------------------------------------------
    GATING_LAYOUT = Constraint(
        "fused_gdn_gating",
        "a and b [T, HV] with a unit last stride, A_log and dt_bias 1-D contiguous [HV]",
        f"{GATING}: `batch, num_heads = a.shape`; the kernel addresses a + i_b * stride_a + "
        "head and A_log + head",
        WRONG_MEMORY,
    )

    # -- layer_norm_gated_fwd (fused_norm_gate.py) ------------------------------------------
    NORM_ROWS = Constraint(
        "layer_norm_gated_fwd",
        "contiguous 2-D x and g [T, D]",
        f"{NORM}, layer_norm_gated_fwd_kernel: make_block_ptr(x, (T, D), (D, 1), ...), the same "
        "for g and y",
        WRONG_MEMORY,
    )
    NORM_WIDTH = Constraint(
        "layer_norm_gated_fwd",
        "rows of at most 64 KB",
        f"{NORM}, layer_norm_gated_fwd: raise RuntimeError(\"This layer norm doesn't support "
        'feature dim >= 64KB.")',
        "raises RuntimeError",
    )
    NORM_WEIGHT = Constraint(
        "layer_norm_gated_fwd",
        "weight [D] (or None) and bias [D] (or None)",
        f"{NORM}, layer_norm_gated_fwd: `assert weight.shape == (D,)`",
        "raises AssertionError",
    )
    NORM_ACTIVATION = Constraint(
        "layer_norm_gated_fwd",
        "activation 'swish', 'silu' or 'sigmoid'",
        f"{NORM}, layer_norm_gated_fwd_kernel: `if ACTIVATION == 'swish' or ... 'silu'`, "
        "`elif ACTIVATION == 'sigmoid'`",
        "applies no gate at all",
    )

    def __init__(self) -> None:
        super().__init__("sglang_fl_cuda.sglang_triton")

    def chunk_gated_delta_rule(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        scale: float | None = None,
        initial_state: torch.Tensor | None = None,
        initial_state_indices: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        head_first: bool = False,
        use_qk_l2norm_in_kernel: bool = False,
        inplace_update: bool = True,
    ) -> tuple[torch.Tensor, None, torch.Tensor]:
        """Returns SGLang's ``(o, None, h)``; the final states are in the pool."""
        self.record(
            "chunk_gated_delta_rule", q, k, v, g, beta, scale=scale, initial_state=initial_state,
            initial_state_indices=initial_state_indices, cu_seqlens=cu_seqlens,
            head_first=head_first, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            inplace_update=inplace_update,
        )  # fmt: skip
        _unmodeled(not head_first, "head_first (deprecated in SGLang)")
        dtypes = f"{q.dtype}, {k.dtype}, {v.dtype}"
        self.CHUNK_DTYPE.check(q.dtype == k.dtype == v.dtype != torch.float32, dtypes)
        self.CHUNK_BETA.check(beta.dim() == 3, f"beta {list(beta.shape)}")
        self.CHUNK_HEAD_DIM.check(k.shape[-1] <= 256, f"K={k.shape[-1]}")
        self.CHUNK_HEADS.check(v.shape[-2] % k.shape[-2] == 0, f"H={k.shape[-2]}, HV={v.shape[-2]}")
        sequences = q.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
        if cu_seqlens is not None:
            counted = initial_state_indices is None or initial_state_indices.numel() == sequences
            self.CHUNK_VARLEN.check(q.shape[0] == 1 and counted, f"batch {q.shape[0]}")
        self.CHUNK_POOL.check(
            initial_state is not None and initial_state_indices is not None,
            "initial_state or initial_state_indices None",
        )
        assert initial_state is not None  # for mypy: checked above
        assert initial_state_indices is not None
        self.CHUNK_POOL_CONTIGUOUS.check(initial_state.is_contiguous(), "a strided pool")
        self.CHUNK_INDEX.check(
            _in_pool(initial_state_indices, initial_state.shape[0]),
            f"{initial_state_indices.tolist()} for {initial_state.shape[0]} slots",
        )
        self.CHUNK_TOKENS.check(cu_seqlens is None or q.shape[1] > 0, "no tokens")
        _unmodeled(bool((initial_state_indices >= 0).all()), "padding rows in the chunked kernel")
        reference = get_contract("chunk_gated_delta_rule").reference
        o, h, _ = reference(
            None, q, k, v, g, beta, scale, initial_state, initial_state_indices, cu_seqlens,
            use_qk_l2norm_in_kernel, inplace_update,
        )  # fmt: skip
        return o, None, h

    def fused_recurrent_gated_delta_rule(
        self,
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
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Returns ``(o, final_state)``, the final state ``None`` unless asked for."""
        self.record(
            "fused_recurrent_gated_delta_rule", q, k, v, g, beta=beta, scale=scale,
            initial_state=initial_state, output_final_state=output_final_state,
            cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        )  # fmt: skip
        self.RECURRENT_SCALE.check(scale is None or scale > 0, f"scale {scale}")
        heads_qk, heads_v = k.shape[-2], v.shape[-2]
        self.RECURRENT_HEADS.check(heads_v % heads_qk == 0, f"H={heads_qk}, HV={heads_v}")
        beta_heads = heads_qk if beta is None else beta.shape[2]
        self.RECURRENT_BETA.check(beta_heads == heads_v, f"beta with {beta_heads} heads")
        if cu_seqlens is not None:
            states = initial_state is None or initial_state.shape[0] == cu_seqlens.numel() - 1
            self.RECURRENT_VARLEN.check(q.shape[0] == 1 and states, f"batch {q.shape[0]}")
        reference = get_contract("fused_recurrent_gated_delta_rule").reference
        o, final = reference(
            None, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
            use_qk_l2norm_in_kernel,
        )  # fmt: skip
        return o, (final if output_final_state else None)

    def fused_recurrent_gated_delta_rule_packed_decode(
        self,
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
        """Writes ``out`` and the pool in place; returns both."""
        self.record(
            "fused_recurrent_gated_delta_rule_packed_decode", mixed_qkv=mixed_qkv, a=a, b=b,
            A_log=A_log, dt_bias=dt_bias, scale=scale, initial_state=initial_state, out=out,
            ssm_state_indices=ssm_state_indices, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        )  # fmt: skip
        layout = (
            mixed_qkv.dim() == a.dim() == b.dim() == 2
            and mixed_qkv.stride(-1) == a.stride(-1) == b.stride(-1) == 1
            and A_log.dim() == dt_bias.dim() == 1
            and A_log.stride(0) == dt_bias.stride(0) == 1
            and ssm_state_indices.dim() == 1
            and out.is_contiguous()
        )
        self.PACKED_LAYOUT.check(layout, "a strided or mis-ranked operand")
        self.PACKED_STATE.check(_dense_slots(initial_state), f"strides {initial_state.stride()}")
        batch = mixed_qkv.shape[0]
        heads_v, dv, dk = initial_state.shape[-3:]
        qk = mixed_qkv.shape[1] - heads_v * dv
        heads_qk = qk // (2 * dk) if qk > 0 and qk % (2 * dk) == 0 else 0
        shapes = (
            a.shape == b.shape == (batch, heads_v)
            and A_log.numel() == dt_bias.numel() == heads_v
            and ssm_state_indices.shape == (batch,)
            and out.shape == (batch, 1, heads_v, dv)
            and heads_qk > 0
            and heads_v % heads_qk == 0
        )
        self.PACKED_SHAPES.check(shapes, f"mixed_qkv {list(mixed_qkv.shape)}, a {list(a.shape)}")
        self.PACKED_INDEX.check(
            _in_pool(ssm_state_indices, initial_state.shape[0]),
            f"{ssm_state_indices.tolist()} for {initial_state.shape[0]} slots",
        )
        reference = get_contract("fused_recurrent_gated_delta_rule_packed_decode").reference
        got: tuple[torch.Tensor, torch.Tensor] = reference(
            None, mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
            use_qk_l2norm_in_kernel,
        )  # fmt: skip
        return got

    def fused_sigmoid_gating_delta_rule_update(
        self,
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
        **options: Any,
    ) -> torch.Tensor:
        """Returns ``o``; the final states are written into the pool."""
        self.record(
            "fused_sigmoid_gating_delta_rule_update", A_log=A_log, a=a, dt_bias=dt_bias,
            softplus_beta=softplus_beta, softplus_threshold=softplus_threshold, q=q, k=k, v=v,
            b=b, initial_state_source=initial_state_source,
            initial_state_indices=initial_state_indices, scale=scale,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens, **options,
        )  # fmt: skip
        _unmodeled(not options, f"the target-verify/KDA options {sorted(options)}")
        self.SIGMOID_SCALE.check(scale is None or scale > 0, f"scale {scale}")
        heads_qk, heads_v = k.shape[-2], v.shape[-2]
        self.SIGMOID_HEADS.check(heads_v % heads_qk == 0, f"H={heads_qk}, HV={heads_v}")
        layout = (
            all(_token_major(x) for x in (q, k, v))
            and a.stride(-1) == b.stride(-1) == 1
            and A_log.is_contiguous()
            and dt_bias.is_contiguous()
        )
        self.SIGMOID_LAYOUT.check(layout, f"q strides {q.stride()}, a strides {a.stride()}")
        self.SIGMOID_POOL.check(
            _dense_slots(initial_state_source), f"strides {initial_state_source.stride()}"
        )
        sequences = k.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
        self.SIGMOID_INDEX.check(
            initial_state_indices.numel() == sequences
            and _in_pool(initial_state_indices, initial_state_source.shape[0]),
            f"{initial_state_indices.tolist()} for {initial_state_source.shape[0]} slots",
        )
        reference = get_contract("fused_sigmoid_gating_delta_rule_update").reference
        o, _ = reference(
            None, A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b,
            initial_state_source, initial_state_indices, scale, use_qk_l2norm_in_kernel,
            cu_seqlens,
        )  # fmt: skip
        result: torch.Tensor = o
        return result

    def fused_gdn_gating(
        self,
        A_log: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        dt_bias: torch.Tensor,
        beta: float = 1.0,
        threshold: float = 20.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns float32 ``(g, beta_output)``, each ``[1, T, HV]``."""
        self.record("fused_gdn_gating", A_log, a, b, dt_bias, beta, threshold)
        heads = a.shape[-1]
        layout = (
            a.dim() == 2
            and b.shape == a.shape
            and a.stride(-1) == b.stride(-1) == 1
            and A_log.shape == dt_bias.shape == (heads,)
            and A_log.is_contiguous()
            and dt_bias.is_contiguous()
        )
        self.GATING_LAYOUT.check(layout, f"a {list(a.shape)} strides {a.stride()}")
        reference = get_contract("fused_gdn_gating").reference
        got: tuple[torch.Tensor, torch.Tensor] = reference(
            None, A_log, a, b, dt_bias, beta, threshold
        )
        return got

    def layer_norm_gated_fwd(
        self,
        x: torch.Tensor,
        g: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        activation: str = "swish",
        eps: float = 1e-5,
        residual: torch.Tensor | None = None,
        out_dtype: torch.dtype | None = None,
        residual_dtype: torch.dtype | None = None,
        is_rms_norm: bool = False,
        g_strided: tuple[int, int, int] | None = None,
    ) -> tuple[torch.Tensor, None, torch.Tensor, torch.Tensor]:
        """Returns ``(y, mean=None, rstd, x)`` for the RMS norm; ``y`` *is* ``x`` (written over)
        unless ``out_dtype`` is given, as in SGLang."""
        self.record(
            "layer_norm_gated_fwd", x=x, g=g, weight=weight, bias=bias, activation=activation,
            eps=eps, residual=residual, out_dtype=out_dtype, residual_dtype=residual_dtype,
            is_rms_norm=is_rms_norm, g_strided=g_strided,
        )  # fmt: skip
        _unmodeled(is_rms_norm and residual is None and residual_dtype is None, "layer norm, "
                   "residuals")  # fmt: skip
        _unmodeled(bias is None and weight is not None and g_strided is None, "bias, strided g")
        self.NORM_ROWS.check(
            x.dim() == 2 and g.shape == x.shape and x.is_contiguous() and g.is_contiguous(),
            f"x {list(x.shape)} strides {x.stride()}, g strides {g.stride()}",
        )
        self.NORM_WIDTH.check(x.shape[1] * x.element_size() <= 65536, f"D={x.shape[1]}")
        assert weight is not None  # for mypy: unmodeled above
        self.NORM_WEIGHT.check(weight.shape == (x.shape[1],), f"weight {list(weight.shape)}")
        self.NORM_ACTIVATION.check(activation in ("swish", "silu", "sigmoid"), activation)
        layer = SimpleNamespace(weight=weight, eps=eps, activation=activation)
        result = get_contract("rms_norm_gated").reference(layer, x, g)
        y = x if out_dtype is None else torch.empty_like(x, dtype=out_dtype)
        y.copy_(result)
        return y, None, torch.ones(x.shape[0]), x
