"""A TEST DOUBLE of ``sgl_kernel_npu``: the functions SGLang's NPU GDN path calls, on the CPU.

Not the real package (Triton-Ascend kernels that need an NPU). :class:`SglKernelNpuDouble` is
the package; its submodules (``fla.fused_gdn_gating``, ``fla.utils``, ``fla.layernorm_gated``,
``mamba.causal_conv1d``) go into ``sys.modules`` with it, one release's functions each, with
their names, parameters and return values as that release's source defines them (file and line
of sgl-kernel-npu ``python/sgl_kernel_npu/sgl_kernel_npu``, ``main`` at f425bdf1 unless said):

- ``fused_gdn_gating_npu(A_log, a, b, dt_bias, beta=1.0, threshold=20.0) -> (g, beta_output)``,
  ``g`` float32 ``[1, B, HV]`` (``[B, HV]`` with ``gating="flat"``, the layout of sgl-kernel-npu
  #747), or with ``gating="g-only"`` the release whose function is ``(A_log, a, dt_bias, beta,
  threshold) -> g`` (5c3d28b7);
- ``fused_qkvzba_split_reshape_cat(_contiguous)(mixed_qkvz, mixed_ba, num_heads_qk,
  num_heads_v, head_qk, head_v) -> (mixed_qkv, z, b, a)``;
- ``layer_norm_fwd_npu(x, weight, bias, eps, z=None, out=None, group_size=None,
  norm_before_gate=True, is_rms_norm=False, activation=None) -> (out, mean, rstd)``;
- ``causal_conv1d_update_npu(...)`` as its torch path computes it (no ``cache_seqlens`` or
  ``num_accepted_tokens``): one window per row, the bias ignored, the pool indexed with every
  index; ``causal_conv1d_fn_npu(...)`` as ``prepare_data`` and ``causal_conv1d_fn_native``
  compute it, final states included (a mixed call places a fresh sequence's state as they do).

Each precondition is a :class:`~sglang_fl.testing.doubles.Constraint` naming its source; the
conv functions compute what the real torch code computes (it runs on any device), the others
compute with core's references. ``missing`` leaves functions out, as an older release would.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from sglang_fl_ascend.backend import SGL_KERNEL_NPU

from sglang_fl.ops import get_contract
from sglang_fl.testing.doubles import Call, Constraint, SdkDouble, install_double

REPO = "sgl-kernel-npu python/sgl_kernel_npu/sgl_kernel_npu"
GATING_SOURCE = f"{REPO}/fla/fused_gdn_gating.py"
UTILS = f"{REPO}/fla/utils.py"
NORM = f"{REPO}/fla/layernorm_gated.py"
CONV = f"{REPO}/mamba/causal_conv1d.py"


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


class _Submodule(SdkDouble):
    """One submodule of the package double; its calls go to the package's list."""

    def __init__(self, name: str, calls: list[Call]) -> None:
        super().__init__(f"sgl_kernel_npu.{name}")
        self.calls = calls


class FusedGdnGating(_Submodule):
    """``fla.fused_gdn_gating``: ``fused_gdn_gating_npu`` with ``b`` (main)."""

    GATING_LAYOUT = Constraint(
        "fused_gdn_gating_npu",
        "contiguous a (and b) [B, HV], contiguous A_log and dt_bias [HV]",
        f"{GATING_SOURCE}:11-77, fused_gdn_gating_kernel: off = batch_off * seq_len * NUM_HEADS "
        "+ i_s * NUM_HEADS + head_off, A_log + head_off (no strides); fused_gdn_gating_npu: "
        "`batch, num_heads = a.shape`",
        "reads the wrong elements (not checked)",
    )
    GATING_ROWS = Constraint(
        "fused_gdn_gating_npu",
        "at least one row",
        f"{GATING_SOURCE}:80-137, fused_gdn_gating_npu: progs = batch when batch <= num_cores, "
        "grid (progs, seq_len)",
        "launches an empty grid",
    )

    def __init__(self, calls: list[Call], *, flat_g: bool = False) -> None:
        super().__init__("fla.fused_gdn_gating", calls)
        self.flat_g = flat_g

    def _check(self, A_log: torch.Tensor, a: torch.Tensor, *rest: torch.Tensor) -> None:
        heads = a.shape[-1]
        self.GATING_LAYOUT.check(
            a.dim() == 2
            and all(t.shape == a.shape and t.is_contiguous() for t in (a, *rest[:-1]))
            and A_log.shape == rest[-1].shape == (heads,)
            and A_log.is_contiguous()
            and rest[-1].is_contiguous(),
            f"a {list(a.shape)} strides {a.stride()}",
        )
        self.GATING_ROWS.check(a.shape[0] > 0, "no rows")

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
        self._check(A_log, a, b, dt_bias)
        reference = get_contract("fused_gdn_gating").reference
        g, beta_out = reference(None, A_log, a, b, dt_bias, beta, threshold)
        return (g[0] if self.flat_g else g), beta_out.to(b.dtype)


class FusedGdnGatingWithoutB(FusedGdnGating):
    """``fla.fused_gdn_gating`` of the release whose function has no ``b``: ``g`` only,
    ``[B, HV]`` float32 (5c3d28b7, ``fused_gdn_gating.py``:45-75)."""

    def fused_gdn_gating_npu(  # type: ignore[override]
        self,
        A_log: torch.Tensor,
        a: torch.Tensor,
        dt_bias: torch.Tensor,
        beta: float = 1.0,
        threshold: float = 20.0,
    ) -> torch.Tensor:
        self.record("fused_gdn_gating_npu", A_log, a, dt_bias, beta, threshold)
        self._check(A_log, a, dt_bias)
        reference = get_contract("fused_gdn_gating").reference
        g, _ = reference(None, A_log, a, torch.zeros_like(a), dt_bias, beta, threshold)
        return g[0]


class FlaUtils(_Submodule):
    """``fla.utils``: the two projection splits."""

    SPLIT_LAYOUT = Constraint(
        "fused_qkvzba_split_reshape_cat(_contiguous)",
        "contiguous mixed_qkvz [B, H * (2 * head_qk + 2 * r * head_v)] (or [B, 2 * H * head_qk "
        "+ 2 * HV * head_v]) and mixed_ba [B, 2 * HV], HV a multiple of H",
        f"{UTILS}:377-462, 590-667: row strides computed from the head counts "
        "(QKVZ_ROW_STRIDE = num_heads_qk * qkvz_dim_t, ...), no strides read",
        "reads the wrong elements",
    )
    SPLIT_RANGES = Constraint(
        "fused_qkvzba_split_reshape_cat(_contiguous)",
        "power-of-two tl.arange extents: head_qk, r * head_v and r (interleaved), num_heads_v "
        "(contiguous)",
        f"{UTILS}:247-374 (tl.arange(0, HEAD_QK), (0, V_DIM_PER_QK), (0, V_HEADS_PER_QK)), "
        "477-587 (tl.arange(0, NUM_HEADS_V)); Triton: arange's range must be a power of 2",
        "fails to compile",
    )
    SPLIT_ROWS = Constraint(
        "fused_qkvzba_split_reshape_cat",
        "at least one row",
        f"{UTILS}:423-439: rows_per_iter = min(..., rows_per_vec) = 0 for no rows, "
        "tl.arange(0, ROWS_PER_ITER)",
        "fails to launch",
    )

    def __init__(self, calls: list[Call]) -> None:
        super().__init__("fla.utils", calls)

    def _split(
        self,
        op: str,
        qkvz: torch.Tensor,
        ba: torch.Tensor,
        h: int,
        hv: int,
        dk: int,
        dv: int,
        widths: tuple[int, int],
        extents: tuple[int, ...],
        rows_needed: bool,
    ) -> tuple[torch.Tensor, ...]:
        self.record(op, qkvz, ba, h, hv, dk, dv)
        self.SPLIT_LAYOUT.check(
            hv % h == 0
            and qkvz.is_contiguous()
            and ba.is_contiguous()
            and qkvz.dim() == ba.dim() == 2
            and (qkvz.shape[1], ba.shape[1]) == widths
            and qkvz.shape[0] == ba.shape[0],
            f"{tuple(qkvz.shape)}/{tuple(ba.shape)} strides {qkvz.stride()}, heads {h}/{hv}",
        )
        self.SPLIT_RANGES.check(all(_power_of_two(n) for n in extents), str(extents))
        self.SPLIT_ROWS.check(qkvz.shape[0] > 0 or not rows_needed, "no rows")
        result: tuple[torch.Tensor, ...] = get_contract(op).reference(None, qkvz, ba, h, hv, dk, dv)
        return result

    def fused_qkvzba_split_reshape_cat(
        self,
        mixed_qkvz: torch.Tensor,
        mixed_ba: torch.Tensor,
        num_heads_qk: int,
        num_heads_v: int,
        head_qk: int,
        head_v: int,
    ) -> tuple[torch.Tensor, ...]:
        r = num_heads_v // num_heads_qk
        widths = (num_heads_qk * (2 * head_qk + 2 * r * head_v), 2 * num_heads_v)
        op = "fused_qkvzba_split_reshape_cat"
        args = (mixed_qkvz, mixed_ba, num_heads_qk, num_heads_v, head_qk, head_v)
        return self._split(op, *args, widths, (head_qk, r * head_v, r), rows_needed=True)

    def fused_qkvzba_split_reshape_cat_contiguous(
        self,
        mixed_qkvz: torch.Tensor,
        mixed_ba: torch.Tensor,
        num_heads_qk: int,
        num_heads_v: int,
        head_qk: int,
        head_v: int,
        block_size_col: int = 1024,
    ) -> tuple[torch.Tensor, ...]:
        widths = (2 * num_heads_qk * head_qk + 2 * num_heads_v * head_v, 2 * num_heads_v)
        op = "fused_qkvzba_split_reshape_cat_contiguous"
        args = (mixed_qkvz, mixed_ba, num_heads_qk, num_heads_v, head_qk, head_v)
        # Its rows_per_vec is at least rows_per_iter: no rows launch an empty loop.
        return self._split(op, *args, widths, (num_heads_v,), rows_needed=False)


class LayernormGated(_Submodule):
    """``fla.layernorm_gated``: ``layer_norm_fwd_npu`` (RMS, SiLU gate)."""

    NORM_LAYOUT = Constraint(
        "layer_norm_fwd_npu",
        "x [M, N] and z [M, N] with unit stride along N, weight [N] contiguous",
        f"{NORM}:255-274 (assert x.stride(-1) == 1, z.shape == (M, N), weight.shape == (N,), "
        "weight.stride(-1) == 1)",
        "raises AssertionError",
    )
    NORM_GROUP = Constraint(
        "layer_norm_fwd_npu",
        "group_size dividing N and at most 65536 bytes of the dtype",
        f"{NORM}:256-257 (assert N % group_size == 0), 282-285 ('Feature dim too large.')",
        "raises",
    )
    NORM_ROWS = Constraint(
        "layer_norm_fwd_npu",
        "at least one row",
        f"{NORM}:290-293: grid (min(cdiv(M, BLOCK_M), num_vectorcore), ngroups) is empty for M = 0",
        "launches an empty grid",
    )

    def __init__(self, calls: list[Call]) -> None:
        super().__init__("fla.layernorm_gated", calls)

    def layer_norm_fwd_npu(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        eps: float,
        z: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
        group_size: int | None = None,
        norm_before_gate: bool = True,
        is_rms_norm: bool = False,
        activation: str | None = None,
    ) -> tuple[torch.Tensor, None, torch.Tensor]:
        self.record(
            "layer_norm_fwd_npu",
            x,
            weight,
            bias,
            eps,
            z=z,
            out=out,
            group_size=group_size,
            norm_before_gate=norm_before_gate,
            is_rms_norm=is_rms_norm,
            activation=activation,
        )
        if not (is_rms_norm and bias is None and z is not None and out is None):
            raise NotImplementedError("the test double models the gated RMS norm only")
        m, n = x.shape
        group = group_size or n
        self.NORM_LAYOUT.check(
            x.stride(-1) == 1
            and z.stride(-1) == 1
            and tuple(z.shape) == (m, n)
            and tuple(weight.shape) == (n,)
            and weight.is_contiguous(),
            f"x {tuple(x.shape)} {x.stride()}, z {tuple(z.shape)} {z.stride()}",
        )
        self.NORM_GROUP.check(n % group == 0 and group * x.element_size() <= 65536, str(group))
        self.NORM_ROWS.check(m > 0, "no rows")
        layer = SimpleNamespace(
            weight=weight,
            eps=eps,
            activation="swish",
            norm_before_gate=norm_before_gate,
            group_size=group_size,
        )
        y = get_contract("rms_norm_gated").reference(layer, x, z)
        rstd = torch.ones(m * (n // group), dtype=torch.float32)
        return y, None, rstd


class CausalConv1d(_Submodule):
    """``mamba.causal_conv1d``: the prefill and decode convolutions, as their torch code runs."""

    UPDATE_INDEXED = Constraint(
        "causal_conv1d_update_npu",
        "conv_state_indices given, each in [0, num_cache_lines)",
        f"{CONV}:1369-1378: conv_state[conv_state_indices] (None adds a dimension; -1 is the "
        "last slot, written back)",
        "reads and writes the wrong slots",
    )
    UPDATE_ONE_TOKEN = Constraint(
        "causal_conv1d_update_npu",
        "x [B, dim] or [B, dim, 1] and a state of width - 1 positions",
        f"{CONV}:1239-1263, torch_causal_conv1d_update_npu: out = sum(cat(state, x) * weight, "
        "-1, keepdim=True): one window of `width` positions per row",
        "returns one position for several tokens, or fails to broadcast",
    )
    UPDATE_NO_BIAS = Constraint(
        "causal_conv1d_update_npu",
        "no bias",
        f"{CONV}:1239-1263, torch_causal_conv1d_update_npu: bias is accepted and never added",
        "returns the convolution without its bias",
    )
    FN_INDICES = Constraint(
        "causal_conv1d_fn_npu",
        "cache_indices and has_initial_state given, one per sequence, indices in "
        "[0, num_cache_lines)",
        f"{CONV}:699-734 (index_select(conv_states, 0, cache_indices)), 686-687 "
        "(~has_initial_state), 800 (index_copy_)",
        "raises",
    )
    FN_DTYPES = Constraint(
        "causal_conv1d_fn_npu",
        "x, weight and conv_states of one dtype; query_start_loc[-1] <= x.shape[-1]",
        f"{CONV}:731 (x_flat of weight.dtype .index_copy_ x), 800 (conv_states.index_copy_ "
        "of x's dtype), 784 (assert query_start_loc[-1] <= x.shape[-1])",
        "raises",
    )

    def __init__(self, calls: list[Call]) -> None:
        super().__init__("mamba.causal_conv1d", calls)

    def causal_conv1d_update_npu(
        self,
        x: torch.Tensor,
        conv_state: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        activation: bool | str | None = None,
        cache_seqlens: torch.Tensor | None = None,
        conv_state_indices: torch.Tensor | None = None,
        num_accepted_tokens: torch.Tensor | None = None,
        intermediate_conv_window: torch.Tensor | None = None,
        pad_slot_id: int = -1,
        metadata: Any = None,
        validate_data: bool = False,
    ) -> torch.Tensor:
        self.record(
            "causal_conv1d_update_npu",
            x,
            conv_state,
            weight,
            bias=bias,
            activation=activation,
            conv_state_indices=conv_state_indices,
        )
        if cache_seqlens is not None or num_accepted_tokens is not None:
            raise NotImplementedError("the test double models the torch path only")
        self.UPDATE_INDEXED.check(
            conv_state_indices is not None
            and bool(
                ((conv_state_indices >= 0) & (conv_state_indices < conv_state.shape[0])).all()
            ),
            str(conv_state_indices),
        )
        assert conv_state_indices is not None
        width = weight.shape[-1]
        x3 = x.unsqueeze(-1) if x.dim() == 2 else x
        self.UPDATE_ONE_TOKEN.check(
            x3.shape[-1] == 1 and conv_state.shape[-1] == width - 1,
            f"x {tuple(x.shape)}, state {tuple(conv_state.shape)}, width {width}",
        )
        self.UPDATE_NO_BIAS.check(bias is None, "a bias")
        index = conv_state_indices.long()
        window = torch.cat([conv_state[index], x3], dim=-1).to(weight.dtype)
        out = torch.sum(window * weight, dim=-1, keepdim=True)
        if activation in (True, "silu", "swish"):
            out = F.silu(out)
        conv_state[index] = window[..., -(width - 1) :].to(conv_state.dtype)
        out = out.to(x.dtype)
        return out.squeeze(-1) if x.dim() == 2 else out

    def causal_conv1d_fn_npu(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        query_start_loc: torch.Tensor | None = None,
        cache_indices: torch.Tensor | None = None,
        has_initial_state: torch.Tensor | None = None,
        conv_states: torch.Tensor | None = None,
        activation: str | None = "silu",
        pad_slot_id: int = -1,
        **kwargs: Any,
    ) -> torch.Tensor:
        self.record(
            "causal_conv1d_fn_npu",
            x,
            weight,
            bias,
            query_start_loc=query_start_loc,
            cache_indices=cache_indices,
            has_initial_state=has_initial_state,
            conv_states=conv_states,
            activation=activation,
        )
        if x.dim() != 2 or query_start_loc is None or conv_states is None:
            raise NotImplementedError("the test double models the varlen form with a pool")
        batch = query_start_loc.numel() - 1
        self.FN_INDICES.check(
            cache_indices is not None
            and has_initial_state is not None
            and cache_indices.numel() == has_initial_state.numel() == batch
            and bool(((cache_indices >= 0) & (cache_indices < conv_states.shape[0])).all()),
            f"{cache_indices}, {has_initial_state}",
        )
        assert cache_indices is not None
        assert has_initial_state is not None
        self.FN_DTYPES.check(
            x.dtype == weight.dtype == conv_states.dtype
            and int(query_start_loc[-1]) <= x.shape[-1],
            f"{x.dtype}/{weight.dtype}/{conv_states.dtype}",
        )
        return _conv_fn_native(
            x,
            weight,
            bias,
            query_start_loc,
            cache_indices,
            has_initial_state,
            conv_states,
            activation,
        )


def _conv_fn_native(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    query_start_loc: torch.Tensor,
    cache_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
    conv_states: torch.Tensor,
    activation: str | None,
) -> torch.Tensor:
    """What ``causal_conv1d_fn_npu`` computes for a varlen ``[dim, T]`` input: the sequences
    padded to the longest, one batched conv, the final states gathered at ``seqlens - (width -
    1) * (~has_initial_state)`` of the (maybe state-prefixed) padded input, written back with
    ``index_copy_`` (``causal_conv1d.py``:651-812)."""
    dim, width = weight.shape
    seqlens = (query_start_loc[1:] - query_start_loc[:-1]).long()
    batch, longest = seqlens.numel(), int(seqlens.max())
    padded = x.new_zeros((batch, dim, longest))
    for i in range(batch):
        start = int(query_start_loc[i])
        padded[i, :, : int(seqlens[i])] = x[:, start : start + int(seqlens[i])]
    flags = has_initial_state.bool()
    if bool(flags.any()):
        initial = conv_states[cache_indices.long()] * flags[:, None, None]
        source = torch.cat([initial, padded], dim=-1)
        out = F.conv1d(source, weight.unsqueeze(1), bias, groups=dim)
    else:
        source = padded
        out = F.conv1d(padded, weight.unsqueeze(1), bias, padding=width - 1, groups=dim)
    out = out[..., :longest]
    base = seqlens - (width - 1) * (~flags).long()
    positions = base[:, None] + torch.arange(width - 1)[None, :]
    index = positions.clamp(min=0)[:, None, :].expand(-1, dim, -1)
    final = source.gather(2, index).masked_fill(positions[:, None, :] < 0, 0)
    if activation is not None:
        out = F.silu(out)
    conv_states.index_copy_(0, cache_indices.long(), final.to(x.dtype))
    result = x.new_zeros(x.shape)
    for i in range(batch):
        start = int(query_start_loc[i])
        result[:, start : start + int(seqlens[i])] = out[i, :, : int(seqlens[i])].to(x.dtype)
    return result


RECURRENT = f"{REPO}/fla/fused_sigmoid_gating_recurrent"
CHUNK = f"{REPO}/fla/chunk.py"
FUSED_CHUNK = f"{REPO}/fla/chunk_gated_delta_rule_npu.py"


def _v_major(states: torch.Tensor, k_major: bool) -> torch.Tensor:
    """A view of kernel-ordered states as the reference's ``[N, HV, V, K]`` (writes go through)."""
    return states.transpose(-1, -2) if k_major else states


class _Recurrent(_Submodule):
    """The recurrent decode kernels' shared checks and math (core's reference, on the pool
    viewed in the release's state order)."""

    DECODE_SHAPES = Constraint(
        "fused_sigmoid_gating_delta_rule_update(_decode)_npu",
        "q/k [B, T, H, K], v [B, T, HV, V] with HV a multiple of H, a/b [B * T, HV], A_log and "
        "dt_bias [HV], one state index per sequence (-1: none), each in the pool [N, HV, K, V] "
        "before #747 ([N, HV, V, K] after), scale > 0",
        f"{RECURRENT}.py:18-165 (h0_source + idx * HV * K * V + i_hv * K * V + o_k[:, None] * V "
        "+ o_v: K-major; sgl-kernel-npu issue #640), :203-205 (assert scale > 0)",
        "reads and writes outside the pool",
    )

    def __init__(self, name: str, calls: list[Call], *, k_major: bool) -> None:
        super().__init__(name, calls)
        self.k_major = k_major

    def _run(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        (A_log, a, dt_bias, sb, st, q, k, v, b, pool, indices) = args
        scale = kwargs.get("scale")
        cu = kwargs.get("cu_seqlens")
        batch, tokens, heads, dk = k.shape
        heads_v, dv = v.shape[-2], v.shape[-1]
        sequences = batch if cu is None else cu.numel() - 1
        state_shape = (heads_v, dk, dv) if self.k_major else (heads_v, dv, dk)
        self.DECODE_SHAPES.check(
            q.shape == k.shape
            and v.shape[:2] == k.shape[:2]
            and heads_v % heads == 0
            and a.shape == b.shape == (batch * tokens, heads_v)
            and A_log.shape == dt_bias.shape == (heads_v,)
            and tuple(pool.shape[1:]) == state_shape
            and indices.numel() == sequences
            and bool(((indices >= -1) & (indices < pool.shape[0])).all())
            and (scale is None or scale > 0),
            f"q {tuple(q.shape)}, v {tuple(v.shape)}, pool {tuple(pool.shape)}, indices "
            f"{indices.tolist()}",
        )
        reference = get_contract("fused_sigmoid_gating_delta_rule_update").reference
        o, _ = reference(
            None, A_log, a, dt_bias, sb, st, q, k, v, b, _v_major(pool, self.k_major), indices,
            scale, kwargs.get("use_qk_l2norm_in_kernel", False), cu,
        )  # fmt: skip
        result: torch.Tensor = o
        return result


class Recurrent(_Recurrent):
    """``fla.fused_sigmoid_gating_recurrent``: the general decode kernel, two value heads per
    program (``BHV = 2``)."""

    DECODE_HEADS = Constraint(
        "fused_sigmoid_gating_delta_rule_update_npu",
        "an even number of value heads",
        f"{RECURRENT}.py:207-209 (BHV = 2, NHV = HV // BHV, grid (NV, N, NHV))",
        "leaves the last value head unwritten",
    )

    def __init__(self, calls: list[Call], *, k_major: bool) -> None:
        super().__init__("fla.fused_sigmoid_gating_recurrent", calls, k_major=k_major)

    def fused_sigmoid_gating_delta_rule_update_npu(
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
        is_kda: bool = False,
    ) -> torch.Tensor:
        args = (A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b,
                initial_state_source, initial_state_indices)  # fmt: skip
        options = {"scale": scale, "use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel,
                   "cu_seqlens": cu_seqlens}  # fmt: skip
        self.record("fused_sigmoid_gating_delta_rule_update_npu", *args, **options)
        self.DECODE_HEADS.check(v.shape[-2] % 2 == 0, f"{v.shape[-2]} value heads")
        return self._run(*args, **options)


class RecurrentDecode(_Recurrent):
    """``fla.fused_sigmoid_gating_recurrent_decode_optimized`` (#740): one token per sequence,
    ``o`` ``[N, HV, V]``."""

    DECODE_ONE_TOKEN = Constraint(
        "fused_sigmoid_gating_delta_rule_update_decode_npu",
        "one token per sequence",
        f"{RECURRENT}_decode_optimized.py:3 ('Specialized for the decode (T=1) path'), 238 "
        "(o = q.new_empty(N, HV, V))",
        "writes one token's output per sequence",
    )

    def __init__(self, calls: list[Call], *, k_major: bool) -> None:
        super().__init__(
            "fla.fused_sigmoid_gating_recurrent_decode_optimized", calls, k_major=k_major
        )

    def fused_sigmoid_gating_delta_rule_update_decode_npu(
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
    ) -> torch.Tensor:
        args = (A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b,
                initial_state_source, initial_state_indices)  # fmt: skip
        options = {"scale": scale, "use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel,
                   "cu_seqlens": cu_seqlens}  # fmt: skip
        self.record("fused_sigmoid_gating_delta_rule_update_decode_npu", *args, **options)
        one = (
            q.shape[1] == 1
            if cu_seqlens is None
            else bool((cu_seqlens[1:] - cu_seqlens[:-1] == 1).all())
        )
        self.DECODE_ONE_TOKEN.check(one, f"q {tuple(q.shape)}, cu_seqlens {cu_seqlens}")
        o = self._run(*args, **options)
        return o.reshape(-1, *o.shape[-2:])


class Chunk(_Submodule):
    """``fla.chunk`` before #747: the Triton chunked kernel, states K-major, on gathered
    states (one per sequence), returning ``(o, final_state, h)``."""

    CHUNK_DTYPES = Constraint(
        "chunk_gated_delta_rule_npu (fla.chunk)",
        "q, k and v of one dtype, not float32",
        f"{CHUNK}:341-344 (assert q.dtype == k.dtype == v.dtype; 'does not support float32')",
        "raises AssertionError",
    )
    CHUNK_SHAPES = Constraint(
        "chunk_gated_delta_rule_npu (fla.chunk)",
        "beta [B, T, HV]; with cu_seqlens a batch of 1 and one initial state [HV, K, V] per "
        "sequence; K <= 256",
        f"{CHUNK}:345-376 (beta 3-dim, 'The batch size is expected to be 1', 'The number of "
        "initial states is expected to be equal to the number of input sequences'); "
        "chunk_delta_h.py:240 (assert K <= 256), 241-244 (h [B, NT, H, K, V], final [N, H, K, V])",
        "raises",
    )

    def __init__(self, calls: list[Call]) -> None:
        super().__init__("fla.chunk", calls)

    def chunk_gated_delta_rule_npu(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        scale: float | None = None,
        initial_state: torch.Tensor | None = None,
        output_final_state: bool = True,
        cu_seqlens: torch.Tensor | None = None,
        head_first: bool = False,
        use_qk_l2norm_in_kernel: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        self.record(
            "chunk_gated_delta_rule_npu", q, k, v, g, beta, scale=scale,
            initial_state=initial_state, output_final_state=output_final_state,
            cu_seqlens=cu_seqlens, head_first=head_first,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        )  # fmt: skip
        if head_first or initial_state is None or cu_seqlens is None:
            raise NotImplementedError("the test double models varlen calls with states only")
        self.CHUNK_DTYPES.check(q.dtype == k.dtype == v.dtype != torch.float32, str(q.dtype))
        batch, _, _, dk = k.shape
        heads_v, dv = v.shape[-2], v.shape[-1]
        self.CHUNK_SHAPES.check(
            beta.dim() == 3
            and batch == 1
            and tuple(initial_state.shape) == (cu_seqlens.numel() - 1, heads_v, dk, dv)
            and dk <= 256,
            f"beta {tuple(beta.shape)}, q {tuple(q.shape)}, states {tuple(initial_state.shape)}",
        )
        states = initial_state.transpose(-1, -2).float().clone()
        reference = get_contract("chunk_gated_delta_rule").reference
        o, h, final = reference(
            None, q, k, v, g, beta, scale, states, None, cu_seqlens, use_qk_l2norm_in_kernel
        )
        final_k_major = final.transpose(-1, -2).contiguous() if output_final_state else None
        return o, final_k_major, h.transpose(-1, -2).contiguous()


class FusedChunk(_Submodule):
    """``fla.chunk_gated_delta_rule_npu`` (#747): ``torch.ops.npu.chunk_gated_delta_rule`` on
    ``(T, N, D)`` rows, V-major states, the entering state of every chunk into ``chunk_state``."""

    FUSED_DTYPES = Constraint(
        "chunk_gated_delta_rule_npu (#747)",
        "bfloat16 query/key/value/beta, float32 g, a bfloat16 initial_state (float32 on "
        "Ascend 950) and chunk_state of its dtype",
        f"{FUSED_CHUNK}:20-32 (the documented dtypes)",
    )
    FUSED_SHAPES = Constraint(
        "chunk_gated_delta_rule_npu (#747)",
        "query/key (T, Nk, Dk), value (T, Nv, Dv), beta/g (T, Nv), initial_state (B, Nv, Dv, "
        "Dk), int32 actual_seq_lengths (B,) summing to T, chunk_state (sum ceil(len / 64), Nv, "
        "Dv, Dk)",
        f"{FUSED_CHUNK}:20-36 (the documented shapes)",
    )

    def __init__(self, calls: list[Call], *, soc_version: int) -> None:
        super().__init__("fla.chunk_gated_delta_rule_npu", calls)
        self.soc_version = soc_version

    def chunk_gated_delta_rule_npu(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        beta: torch.Tensor | None = None,
        initial_state: torch.Tensor | None = None,
        actual_seq_lengths: torch.Tensor | None = None,
        scale: float | None = None,
        g: torch.Tensor | None = None,
        chunk_state: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.record(
            "chunk_gated_delta_rule_npu", query, key, value, beta=beta,
            initial_state=initial_state, actual_seq_lengths=actual_seq_lengths, scale=scale, g=g,
            chunk_state=chunk_state,
        )  # fmt: skip
        if beta is None or g is None or initial_state is None or chunk_state is None:
            raise NotImplementedError("the test double models gated calls with states only")
        assert actual_seq_lengths is not None
        bf16 = torch.bfloat16
        state_dtypes = (bf16, torch.float32) if self.soc_version >= 260 else (bf16,)
        self.FUSED_DTYPES.check(
            query.dtype == key.dtype == value.dtype == beta.dtype == bf16
            and g.dtype == torch.float32
            and initial_state.dtype in state_dtypes
            and chunk_state.dtype == initial_state.dtype,
            f"{query.dtype}/{beta.dtype}/{g.dtype}/{initial_state.dtype}/{chunk_state.dtype}",
        )
        lengths = actual_seq_lengths.tolist()
        tokens, heads_v, dv, dk = query.shape[0], value.shape[1], value.shape[2], key.shape[2]
        chunks = sum(-(-n // 64) for n in lengths)
        self.FUSED_SHAPES.check(
            actual_seq_lengths.dtype == torch.int32
            and sum(lengths) == tokens
            and key.shape == query.shape
            and value.shape[0] == tokens
            and beta.shape == g.shape == (tokens, heads_v)
            and tuple(initial_state.shape) == (len(lengths), heads_v, dv, dk)
            and tuple(chunk_state.shape) == (chunks, heads_v, dv, dk),
            f"lengths {lengths}, query {tuple(query.shape)}, states {tuple(initial_state.shape)}, "
            f"chunk_state {tuple(chunk_state.shape)}",
        )
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
        states = initial_state.float().clone()
        reference = get_contract("chunk_gated_delta_rule").reference
        o, h, final = reference(
            None, query[None], key[None], value[None], g[None], beta[None].float(), scale,
            states, None, cu, False,
        )  # fmt: skip
        chunk_state.copy_(h[0])
        return o[0], final.to(initial_state.dtype)


class SglKernelNpuDouble(SdkDouble):
    """``sgl_kernel_npu`` with its GDN submodules (:attr:`submodules`, by full name), one
    release: ``release="main"`` (f425bdf1: K-major delta-rule states, the Triton chunked
    kernel) or ``"unified"`` (sgl-kernel-npu #747 and #740: V-major states, the fused chunked
    operator, the decode-optimised kernel; ``soc_version`` says whether its states may be
    float32); ``gating`` is ``"with-sigmoid"`` (main), ``"flat"`` (#747's ``[B, HV]`` g) or
    ``"g-only"`` (the release without ``b``); ``missing`` names functions left out."""

    def __init__(
        self,
        *,
        release: str = "main",
        gating: str = "with-sigmoid",
        soc_version: int = 220,
        missing: tuple[str, ...] = (),
    ) -> None:
        super().__init__("sgl_kernel_npu")
        gate = (
            FusedGdnGatingWithoutB(self.calls)
            if gating == "g-only"
            else FusedGdnGating(self.calls, flat_g=gating == "flat")
        )
        unified = release == "unified"
        modules: list[_Submodule] = [
            gate,
            FlaUtils(self.calls),
            LayernormGated(self.calls),
            CausalConv1d(self.calls),
            Recurrent(self.calls, k_major=not unified),
        ]
        if unified:
            modules += [
                RecurrentDecode(self.calls, k_major=False),
                FusedChunk(self.calls, soc_version=soc_version),
            ]
        else:
            modules.append(Chunk(self.calls))
        self.submodules = {module.__name__: module for module in modules}
        for name in missing:
            for module in modules:
                if hasattr(type(module), name):
                    setattr(module, name, None)


def install_sgl_kernel_npu(
    monkeypatch: pytest.MonkeyPatch, double: SglKernelNpuDouble
) -> SglKernelNpuDouble:
    """``double`` as ``sgl_kernel_npu`` and its submodules as theirs, for one test."""
    for name, module in double.submodules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return install_double(monkeypatch, double, SGL_KERNEL_NPU)
