"""MoE bridges: SGLang's ``TopK`` -> ``topk``, ``UnquantizedFusedMoEMethod`` -> ``fused_moe``.

Both SGLang classes are fused ops (``BaseFusedOp`` subclasses; the MoE method also derives
from ``FusedMoEMethodBase``), so the router's one ``AROUND`` hook on
``_resolve_forward_method`` reaches them like any other layer; no extra hook is needed.

``TopK``: the bridge replaces only the routing math (``select_experts``' choice of
``fused_topk``/``grouped_topk``/...) with ``fn(layer.topk_config, router_logits)`` and keeps
SGLang's own bookkeeping around it, looked up once: routing inputs of the forward context,
``_post_process_topk_ids`` (padded rows masked, routed experts captured, the platform's
logical->physical id step), the expert-distribution recorder, and the ``StandardTopKOutput``
the experts consume. Configurations the contract does not describe stay with SGLang.

``UnquantizedFusedMoEMethod``: its forward is ``forward_*(layer, dispatch_output)`` with the
``FusedMoE`` layer as an argument (the method object is what resolves). The bridge calls
``fn(layer, x, layer.w13_weight, layer.w2_weight, topk_weights, topk_ids, activation)`` and
wraps the result in SGLang's ``StandardCombineInput``.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from ....ops.moe import MoeActivation, ScoringFunc
from ...routing import Forward, Handoff
from ..compat import LAYER_CLASSES
from .base import Bridge

__all__ = ["FusedMoEBridge", "TopKBridge", "runner_config_problem"]

_TOKEN_DISPATCHER = "sglang.srt.layers.moe.token_dispatcher"


def _module_of(op_name: str) -> Any:
    return importlib.import_module(LAYER_CLASSES[op_name][0])


class TopKBridge(Bridge):
    op_name = "topk"
    # What SGLang's topk module must provide for the bridge to keep its bookkeeping.
    _HELPERS = (
        "StandardTopKOutput",
        "TopKOutputFormat",
        "_post_process_topk_ids",
        "get_global_expert_distribution_recorder",
        "envs",
    )

    def refuse_class(self, cls: type, layer_base: type) -> str | None:
        missing = [name for name in self._HELPERS if not hasattr(_module_of("topk"), name)]
        if not hasattr(cls, "_resolve_routing_inputs"):
            missing.append("TopK._resolve_routing_inputs")
        if missing:
            return (
                f"this SGLang's topk module lacks {', '.join(missing)}, which the topk bridge "
                "reuses; left to SGLang"
            )
        return super().refuse_class(cls, layer_base)

    def refuse_instance(self, layer: Any) -> str | None:
        config = layer.topk_config
        module = _module_of("topk")
        options = {
            "custom_routing_function": config.custom_routing_function is not None,
            "fused shared-expert slots": config.num_shared_topk_slots > 0,
            "sqrtsoftplus_log1p": bool(config.sqrtsoftplus_log1p),
            "fused_gate_packed_ids": bool(config.fused_gate_packed_ids),
            "waterfill": bool(getattr(layer, "enable_waterfill", False)),
            "routing simulation (SGLANG_SIMULATE_*_EXPERTS)": bool(
                module.envs.SGLANG_SIMULATE_UNIFORM_EXPERTS.get()
                or module.envs.SGLANG_SIMULATE_ROUND_ROBIN_EXPERTS.get()
            ),
        }
        used = [name for name, on in options.items() if on]
        if used:
            return f"TopK option(s) {', '.join(used)} are outside topk; left to SGLang"
        allowed = {s.value for s in ScoringFunc}
        if config.scoring_func not in allowed:
            return f"scoring_func {config.scoring_func!r} is outside topk ({sorted(allowed)})"
        if (
            config.use_grouped_topk
            and config.correction_bias is not None
            and config.scoring_func != ScoringFunc.SIGMOID
        ):
            return (
                "grouped routing with a correction bias and softmax scoring (SGLang scores it "
                "with sigmoid regardless) is outside topk; left to SGLang"
            )
        return None

    def bind(self, layer: Any, fn: Forward, sglang_forward: Forward, handoff: Handoff) -> Forward:
        module = _module_of("topk")
        config = layer.topk_config
        standard_formats = (None, module.TopKOutputFormat.STANDARD)
        standard_output = module.StandardTopKOutput
        post_process = module._post_process_topk_ids
        recorder = module.get_global_expert_distribution_recorder

        def sglang_path(reason: str, *args: Any, **kwargs: Any) -> Any:
            handoff(reason)
            return sglang_forward(*args, **kwargs)

        def topk(
            hidden_states: torch.Tensor,
            router_logits: torch.Tensor,
            *,
            num_token_non_padded: torch.Tensor | None = None,
            expert_location_dispatch_info: Any = None,
            dynamic_expert_bias: torch.Tensor | None = None,
            router_logits_partials: torch.Tensor | None = None,
        ) -> Any:
            reason = None
            if dynamic_expert_bias is not None:
                reason = "a per-token dynamic_expert_bias is SGLang's own path"
            elif router_logits_partials is not None:
                reason = "router_logits_partials (split-K router) is SGLang's own path"
            elif config.output_format not in standard_formats:
                reason = f"the {config.output_format.name} top-k output format is SGLang's own path"
            else:
                non_padded, dispatch_info = layer._resolve_routing_inputs(
                    num_token_non_padded, expert_location_dispatch_info
                )
                if dispatch_info is not None:
                    reason = "expert-location dispatch (EPLB) is SGLang's own path"
            if reason is not None:
                return sglang_path(
                    reason,
                    hidden_states,
                    router_logits,
                    num_token_non_padded=num_token_non_padded,
                    expert_location_dispatch_info=expert_location_dispatch_info,
                    dynamic_expert_bias=dynamic_expert_bias,
                    router_logits_partials=router_logits_partials,
                )
            weights, ids = fn(config, router_logits)
            ids, weights, recorded = post_process(
                topk_ids=ids,
                topk_weights=weights,
                topk_config=config,
                router_logits=router_logits,
                layer_id=layer.layer_id,
                num_token_non_padded=non_padded,
                expert_location_dispatch_info=None,
            )
            if recorded is not None:
                recorder().on_select_experts(topk_ids=recorded)
            return standard_output(weights, ids, router_logits)

        return topk


class FusedMoEBridge(Bridge):
    op_name = "fused_moe"

    def refuse_class(self, cls: type, layer_base: type) -> str | None:
        # Subclasses (SGLang's NPU MXFP8 online-quantized method, model-specific methods) change
        # weights, kernels or math in ways that need not show in forward_native.
        if cls is not layer_base:
            return (
                f"{cls.__qualname__} specialises {layer_base.__qualname__} (weights, kernels or "
                "math of its own); left to SGLang"
            )
        return None

    def refuse_instance(self, layer: Any) -> str | None:
        # ``layer`` is the UnquantizedFusedMoEMethod; its runner config is set before the first
        # forward (create_moe_runner), when SGLang resolves the method's forward.
        method = layer
        kernels = {
            "use_triton_kernels": method.use_triton_kernels,
            "use_flashinfer_trtllm_moe": method.use_flashinfer_trtllm_moe,
            "use_flashinfer_cutlass": method.use_flashinfer_cutlass,
            "use_deep_gemm": method.use_deep_gemm,
            "with_bias": method.with_bias,
            "w13_swiglu_interleaved": method.w13_swiglu_interleaved,
            "aiter runner": getattr(method, "_aiter_runner", None) is not None,
        }
        used = [name for name, on in kernels.items() if on]
        if used:
            return (
                f"{', '.join(used)}: expert weights laid out for SGLang's own kernel; "
                "left to SGLang"
            )
        config = getattr(method, "moe_runner_config", None)
        if config is None:
            return "no moe_runner_config on the MoE method; left to SGLang"
        problem = runner_config_problem(config)
        if problem is not None:
            return f"{problem} is outside fused_moe; left to SGLang"
        return None

    def bind(self, layer: Any, fn: Forward, sglang_forward: Forward, handoff: Handoff) -> Forward:
        method = layer
        activation = method.moe_runner_config.activation
        dispatcher = importlib.import_module(_TOKEN_DISPATCHER)
        combine_input = dispatcher.StandardCombineInput
        topk_module = _module_of("topk")
        is_standard = topk_module.TopKOutputChecker.format_is_standard
        # The FusedMoE layers this method serves whose own options the op covers (checked once
        # per layer: SGLang passes the layer per call, it is not known when the forward binds).
        checked: set[int] = set()

        def fused_moe(layer: Any, dispatch_output: Any) -> Any:  # SGLang passes both by name
            moe_layer = layer
            if id(moe_layer) not in checked:
                reason = _refuse_moe_layer(moe_layer)
                if reason is not None:
                    handoff(reason)
                    return sglang_forward(layer=moe_layer, dispatch_output=dispatch_output)
                checked.add(id(moe_layer))
            topk_output = dispatch_output.topk_output
            if not is_standard(topk_output) or dispatch_output.hidden_states_pre_quant is not None:
                handoff("a non-standard top-k output or a pre-quantized input is SGLang's own path")
                return sglang_forward(layer=moe_layer, dispatch_output=dispatch_output)
            out = fn(
                moe_layer,
                dispatch_output.hidden_states,
                moe_layer.w13_weight,
                moe_layer.w2_weight,
                topk_output.topk_weights,
                topk_output.topk_ids,
                activation,
            )
            return combine_input(hidden_states=out)

        return fused_moe


def runner_config_problem(config: Any) -> str | None:
    """What in SGLang's ``MoeRunnerConfig`` the expert ops (``fused_moe`` and its quantized
    variants) do not compute, in words, or ``None``."""
    allowed = {a.value for a in MoeActivation}
    if config.activation not in allowed:
        return f"activation {config.activation!r} (the ops have {sorted(allowed)})"
    options = {
        "not is_gated": not config.is_gated,
        "apply_router_weight_on_input": config.apply_router_weight_on_input,
        "no_combine": config.no_combine,
        "routed_scaling_factor": config.routed_scaling_factor not in (None, 1.0),
        "gemm1_alpha": config.gemm1_alpha is not None,
        "gemm1_beta": config.gemm1_beta is not None,
        "gemm1_clamp_limit": config.gemm1_clamp_limit is not None,
        "swiglu_limit": config.swiglu_limit is not None,
    }
    used = [name for name, on in options.items() if on]
    if used:
        return f"MoE runner option(s) {', '.join(used)}"
    return None


def _refuse_moe_layer(moe_layer: Any) -> str | None:
    """Why this FusedMoE layer's experts fall outside ``fused_moe``, or ``None``."""
    if getattr(moe_layer, "use_intel_amx_backend", False):
        return "Intel AMX packed expert weights are SGLang's own path"
    local, total = moe_layer.num_local_experts, moe_layer.num_experts
    if local != total:
        return f"expert parallelism ({local} of {total} experts here) is SGLang's own path"
    return None
