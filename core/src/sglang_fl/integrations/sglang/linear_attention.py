"""Route SGLang's gated-delta-rule (GDN) linear-attention kernels (``ops.linear_attention``).

SGLang 0.5.23's Qwen3-Next path (``models/qwen3_next.py`` -> ``RadixLinearAttention`` ->
``layers/attention/linear/gdn_backend.py`` -> ``kernels/gdn_triton.py``) calls Triton-only
functions from ``sglang.kernels.ops`` and two plain ``nn.Module`` norms (Qwen3.5's,
``models/qwen3_5.py``, two more: its contiguous projection split and the full-attention output
gate ``fused_sigmoid_mul``, whose FP8 ``quant`` form stays with SGLang); none has a fused-op
class the router's ``_resolve_forward_method`` hook would see. Each is wrapped here with one
``AROUND`` hook in SGLang's ``HookRegistry`` (applied right after the plugins load, before the
model and backend modules import them by name, so their bindings get the wrapper too).

The wrapper serves what the op's contract covers through the implementation sglang-fl chose,
walking its fallbacks when one declines with :class:`~sglang_fl.Unsupported` (each first
decline per implementation and reason is a ``function`` record in the dispatch report, naming
who served instead); calls outside the contract (SGLang's speculative-decoding and KDA
options, ``head_first``, a paged conv block table, the norm's fused residual) go to SGLang's
own function. As for ``kernel_functions``, a route is left to SGLang where its Triton kernel
runs here and only the reference implements the op. The decode step's functions have graph
specs: under ``torch.compile`` (SGLang's CPU graph runner) each is one ``sglang_fl::<op>``
custom op, its pooled states written in place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...dispatch_report import DispatchReport
from ...runtime import Runtime
from ...verify import Verifier
from .compat import SglangApi
from .function_routes import Forward, FunctionRoute, route_functions

__all__ = ["GDN_ROUTES", "route_linear_attention"]

# An AROUND hook: SGLang calls it as hook(original, *args, **kwargs).
Around = Callable[..., Any]

_FLA = "sglang.kernels.ops.attention.fla"
_LINEAR = "sglang.kernels.ops.attention.linear"
_CONV = "sglang.kernels.ops.mamba.causal_conv1d_triton"
_PROJ = "sglang.kernels.ops.attention.triton_gdn_fused_proj"
_PAD_SLOT_ID = -1


def _split(fn: Forward) -> Around:
    """Both q/k/v/z/b/a splits (Qwen3-Next's interleaved, Qwen3.5's contiguous): same call."""

    def fused_qkvzba_split_reshape_cat(
        original: Forward,
        mixed_qkvz: torch.Tensor,
        mixed_ba: torch.Tensor,
        num_heads_qk: int,
        num_heads_v: int,
        head_qk: int,
        head_v: int,
    ) -> Any:
        return fn(None, mixed_qkvz, mixed_ba, num_heads_qk, num_heads_v, head_qk, head_v)

    return fused_qkvzba_split_reshape_cat


def _sigmoid_mul(fn: Forward) -> Around:
    def fused_sigmoid_mul(
        original: Forward,
        attn_output: torch.Tensor,
        gate: torch.Tensor,
        inplace: bool = False,
        quant: bool = False,
    ) -> Any:
        if quant:  # the per-token FP8 output: outside the contract
            return original(attn_output, gate, inplace=inplace, quant=quant)
        return fn(None, attn_output, gate, inplace)

    return fused_sigmoid_mul


def _conv_fn(fn: Forward) -> Around:
    def causal_conv1d_fn(
        original: Forward,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        conv_states: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens_cpu: Any,
        cache_indices: torch.Tensor | None = None,
        has_initial_state: torch.Tensor | None = None,
        activation: Any = "silu",
        pad_slot_id: int = _PAD_SLOT_ID,
        validate_data: bool = False,
        block_table: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        if block_table is not None or kwargs:
            return original(
                x, weight, bias, conv_states, query_start_loc, seq_lens_cpu, cache_indices,
                has_initial_state, activation, pad_slot_id, validate_data, block_table, **kwargs,
            )  # fmt: skip
        out, _ = fn(
            None, x, weight, bias, conv_states, query_start_loc, seq_lens_cpu,
            cache_indices, has_initial_state, activation, pad_slot_id,
        )  # fmt: skip
        return out

    return causal_conv1d_fn


_UPDATE_SPECULATIVE = (
    "cache_seqlens",
    "num_accept_tokens",
    "intermediate_conv_window",
    "intermediate_state_indices",
    "retrieve_next_token",
    "retrieve_next_sibling",
    "retrieve_parent_token",
    "metadata",
)


def _conv_update(fn: Forward) -> Around:
    def causal_conv1d_update(
        original: Forward,
        x: torch.Tensor,
        conv_state: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        activation: Any = None,
        *rest: Any,
        **kwargs: Any,
    ) -> Any:
        speculative = rest or any(kwargs.get(name) is not None for name in _UPDATE_SPECULATIVE)
        if speculative:
            return original(x, conv_state, weight, bias, activation, *rest, **kwargs)
        out, _ = fn(
            None, x, conv_state, weight, bias, activation,
            kwargs.get("conv_state_indices"), kwargs.get("pad_slot_id", _PAD_SLOT_ID),
        )  # fmt: skip
        return out

    return causal_conv1d_update


def _gating(fn: Forward) -> Around:
    def fused_gdn_gating(
        original: Forward,
        A_log: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        dt_bias: torch.Tensor,
        beta: float = 1.0,
        threshold: float = 20.0,
    ) -> Any:
        return fn(None, A_log, a, b, dt_bias, beta, threshold)

    return fused_gdn_gating


def _chunk(fn: Forward) -> Around:
    def chunk_gated_delta_rule(
        original: Forward,
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
    ) -> Any:
        if head_first:
            return original(
                q, k, v, g, beta, scale, initial_state, initial_state_indices, cu_seqlens,
                head_first, use_qk_l2norm_in_kernel, inplace_update,
            )  # fmt: skip
        o, h, _ = fn(
            None, q, k, v, g, beta, scale, initial_state, initial_state_indices, cu_seqlens,
            use_qk_l2norm_in_kernel, inplace_update,
        )  # fmt: skip
        return o, None, h  # SGLang's (o, final_state=None, h): the final state is in the pool

    return chunk_gated_delta_rule


def _recurrent(fn: Forward) -> Around:
    def fused_recurrent_gated_delta_rule(
        original: Forward,
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
    ) -> Any:
        o, final = fn(
            None, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
            use_qk_l2norm_in_kernel,
        )  # fmt: skip
        return o, (final if output_final_state else None)

    return fused_recurrent_gated_delta_rule


def _packed(fn: Forward) -> Around:
    def fused_recurrent_gated_delta_rule_packed_decode(
        original: Forward,
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
    ) -> Any:
        got, state = fn(
            None, mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
            ssm_state_indices, use_qk_l2norm_in_kernel,
        )  # fmt: skip
        if got is not out:
            out.copy_(got)  # SGLang reads the caller's `out`
        return out, state

    return fused_recurrent_gated_delta_rule_packed_decode


# fused_sigmoid_gating_delta_rule_update's options outside the contract, with their defaults.
_SIGMOID_DEFAULTS: dict[str, Any] = {
    "is_kda": False,
    "lower_bound": None,
    "disable_state_update": False,
    "intermediate_states_buffer": None,
    "intermediate_state_indices": None,
    "cache_steps": None,
    "retrieve_parent_token": None,
    "cache_ring": False,
    "replayssm_rawv": None,
    "replayssm_rawk": None,
    "replayssm_g": None,
    "replayssm_beta": None,
    "match_cutedsl_decode": False,
}


def _sigmoid(fn: Forward) -> Around:
    def fused_sigmoid_gating_delta_rule_update(
        original: Forward,
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
        *rest: Any,
        **kwargs: Any,
    ) -> Any:
        outside = rest or any(
            kwargs.get(name, default) != default if default is not None else
            kwargs.get(name) is not None
            for name, default in _SIGMOID_DEFAULTS.items()
        ) or set(kwargs) - set(_SIGMOID_DEFAULTS)  # fmt: skip
        if outside:
            return original(
                A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b,
                initial_state_source, initial_state_indices, scale, use_qk_l2norm_in_kernel,
                cu_seqlens, *rest, **kwargs,
            )  # fmt: skip
        o, _ = fn(
            None, A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b,
            initial_state_source, initial_state_indices, scale, use_qk_l2norm_in_kernel,
            cu_seqlens,
        )  # fmt: skip
        return o

    return fused_sigmoid_gating_delta_rule_update


def _fused_norm(fn: Forward) -> Around:
    def forward(
        original: Forward,
        module: Any,
        x: torch.Tensor,
        g: torch.Tensor,
        residual: torch.Tensor | None = None,
        prenorm: bool = False,
        residual_in_fp32: bool = False,
    ) -> Any:
        if residual is not None or prenorm:
            return original(module, x, g, residual, prenorm, residual_in_fp32)
        return fn(module, x, g)

    return forward


def _gated_norm(fn: Forward) -> Around:
    def forward(
        original: Forward, module: Any, x: torch.Tensor, z: torch.Tensor | None = None
    ) -> Any:
        if z is None:  # no gate: a plain RMS norm, which this op does not cover
            return original(module, x, z)
        return fn(module, x, z)

    return forward


def _track(*, all_layers: bool) -> Callable[[Forward], Around]:
    """The adapter for ``track_mamba_states_if_needed`` (one layer's ``[N, ...]`` pools) or
    ``track_mamba_states_all_layers`` (``[L, N, ...]``): same arguments, same copies; the op
    takes the layered form, so one layer's pools gain a leading ``L = 1`` view."""

    def adapt(fn: Forward) -> Around:
        def track_mamba_states(
            original: Forward,
            conv_states: torch.Tensor,
            ssm_states: torch.Tensor,
            cache_indices: torch.Tensor,
            mamba_track_mask: torch.Tensor,
            mamba_track_indices: torch.Tensor,
            batch_size: int,
            check_freed_slots: bool = False,
        ) -> Any:
            if check_freed_slots:  # the unified pool's freed-slot marks: not in the contract
                return original(
                    conv_states, ssm_states, cache_indices, mamba_track_mask,
                    mamba_track_indices, batch_size, check_freed_slots,
                )  # fmt: skip
            if not all_layers:
                conv_states, ssm_states = conv_states.unsqueeze(0), ssm_states.unsqueeze(0)
            fn(
                None, conv_states, ssm_states, cache_indices, mamba_track_mask,
                mamba_track_indices, batch_size,
            )  # fmt: skip

        return track_mamba_states

    return adapt


_TRACK = "sglang.kernels.ops.mamba.mamba_state_scatter_triton"

GDN_ROUTES: tuple[FunctionRoute, ...] = (
    FunctionRoute(
        f"{_PROJ}.fused_qkvzba_split_reshape_cat",
        "fused_qkvzba_split_reshape_cat",
        _split,
    ),
    FunctionRoute(
        f"{_PROJ}.fused_qkvzba_split_reshape_cat_contiguous",
        "fused_qkvzba_split_reshape_cat_contiguous",
        _split,
    ),
    # Not a GDN kernel: Qwen3.5's full-attention output gate, routed here for its quant option.
    FunctionRoute(
        "sglang.kernels.ops.elementwise.elementwise.fused_sigmoid_mul",
        "fused_sigmoid_mul",
        _sigmoid_mul,
    ),
    FunctionRoute(f"{_CONV}.causal_conv1d_fn", "causal_conv1d_fn", _conv_fn),
    FunctionRoute(f"{_CONV}.causal_conv1d_update", "causal_conv1d_update", _conv_update),
    FunctionRoute(f"{_LINEAR}.fused_gdn_gating.fused_gdn_gating", "fused_gdn_gating", _gating),
    FunctionRoute(f"{_FLA}.chunk.chunk_gated_delta_rule", "chunk_gated_delta_rule", _chunk),
    FunctionRoute(
        f"{_FLA}.fused_recurrent.fused_recurrent_gated_delta_rule",
        "fused_recurrent_gated_delta_rule",
        _recurrent,
    ),
    FunctionRoute(
        f"{_FLA}.fused_recurrent.fused_recurrent_gated_delta_rule_packed_decode",
        "fused_recurrent_gated_delta_rule_packed_decode",
        _packed,
    ),
    FunctionRoute(
        f"{_LINEAR}.fused_sigmoid_gating_recurrent.fused_sigmoid_gating_delta_rule_update",
        "fused_sigmoid_gating_delta_rule_update",
        _sigmoid,
    ),
    FunctionRoute(
        f"{_FLA}.fused_norm_gate.FusedRMSNormGated.forward", "rms_norm_gated", _fused_norm
    ),
    FunctionRoute(f"{_FLA}.layernorm_gated.RMSNorm.forward", "rms_norm_gated", _gated_norm),
    FunctionRoute(
        f"{_TRACK}.track_mamba_states_if_needed", "track_mamba_states", _track(all_layers=False)
    ),
    FunctionRoute(
        f"{_TRACK}.track_mamba_states_all_layers", "track_mamba_states", _track(all_layers=True)
    ),
)


PREPARE_FOR_DECODE = "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode"


def pageable_when_unpinnable(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND hook on ``ScheduleBatch.prepare_for_decode`` where no accelerator is present.

    With the hybrid models' radix cache (``extra_buffer``) SGLang 0.5.23 stages the decode
    tracking mask with ``tensor.pin_memory()`` unconditionally (``schedule_batch.py``), which
    fails where nothing can pin memory; every other staging site asks
    ``is_pin_memory_available()`` first, which this platform answers ``False``. For the
    duration of the call, ``pin_memory()`` returns the (pageable) tensor itself: the same data,
    as ``.to(device, non_blocking=True)`` on a CPU then is a plain copy.
    """
    if torch.accelerator.is_available():
        return original(*args, **kwargs)
    pin = torch.Tensor.pin_memory
    torch.Tensor.pin_memory = lambda self, *a, **k: self  # type: ignore[method-assign]
    try:
        return original(*args, **kwargs)
    finally:
        torch.Tensor.pin_memory = pin  # type: ignore[method-assign]


def route_linear_attention(
    api: SglangApi, runtime: Runtime, report: DispatchReport, verifier: Verifier | None = None
) -> None:
    """Register an ``AROUND`` hook for each GDN function whose op runs through sglang-fl."""
    if runtime.platform() is None and not torch.accelerator.is_available():
        # sglang-fl's CPU platform serves: make SGLang's hybrid radix cache run there.
        api.hook_registry.register(
            PREPARE_FOR_DECODE, pageable_when_unpinnable, api.hook_type_around
        )
    # A decode step's functions are custom ops under torch.compile (SGLang's CPU graph runner
    # compiles the decode step); the prefill-only ones never run compiled.
    route_functions(api, runtime, report, GDN_ROUTES, api.hook_type_around, verifier=verifier)
