"""SGLang's ``sglang_fl`` attention backend: the attention ops, run by whichever kernels win.

A chip maker's wheel supplies only kernels (``store_kv_cache``, ``decode_attention``,
``extend_attention``); this module builds the complete SGLang ``AttentionBackend`` around
them. :func:`install` registers it under :data:`BACKEND_NAME` through SGLang's own registry
(``layers/attention/attention_registry.py`` ``register_attention_backend``) and adds the name
to ``--attention-backend``'s choices (``arg_groups/choices.py``
``add_attention_backend_choices``); sglang-fl's CPU platform makes it the default. What
:func:`create_backend` builds is a policy selection (:mod:`.backend_selection`): this
kernel-based backend, or a whole backend a vendor offers through ``sglang_fl_attention_backend``.

Each op is resolved once, when the backend is built; the decode and extend ops' candidates
bring their planners (:mod:`.attention_plans`). Per forward,
:meth:`SglangFlAttnBackend.init_forward_metadata` describes the batch once and plans it (the
sliding-window slot translation included, as ``torch_native`` does). Per layer, on its first
call, each op is bound through the layer routing's seam
(:meth:`~sglang_fl.integrations.routing.LayerRouter.bind`: the op's fallback chain, whose
declines are ``fallback`` records, custom ops and verify mode apply), and the dispatch report
gets one ``layer`` record per layer and op. A call then only passes tensors and the plan: no
policy read, no registry lookup, no host read.

Graph runners: SGLang's CPU graph runner (``--enable-torch-compile``) and CUDA graphs. The
plans then live in buffers allocated once for the runner's largest batch and updated in place
before each step; before anything is captured, :meth:`SglangFlAttnBackend.graph_problem`
asks every planner (and the KV pool) whether the runner's graph mode can replay it, and the
runner is refused with the reasons otherwise.

What the ops do not cover is handed to SGLang's own ``torch_native`` backend, reported once
per reason: cross-attention and encoder-decoder batches, and KV pools whose layout the store
op does not write (quantized, HND, 5-D); an op no implementation survives for is handed over
too, unless ``SGLANG_FL_STRICT=1`` makes that an error. A call that every candidate the policy
allows declines with ``Unsupported`` (``SGLANG_FL_PER_OP=decode_attention=vendor:x`` and x
declines it) is run by SGLang's code as well (the pool's own writer for the store), reported
once per op; under strict mode the first candidate's decline is already an error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch

from ...dispatch.binder import FallbackChain
from ...dispatch.resolve import Resolution
from ...dispatch_report import DispatchReport, ReportEvent, Runner
from ...errors import GraphModeRefused, NoImplementationError, StrictModeError, Unsupported
from ...guard import exception_text
from ...ops.attention import NO_WINDOW, attention_layer
from ...ops.attention.plan import (
    AttentionBatch,
    AttentionPlan,
    ForwardKind,
    GraphMode,
    PlanCapacity,
)
from ...runtime import Runtime, get_runtime
from ..routing import Bridge, Forward, Handoff, LayerRouter, qualname
from .attention_plans import BackendPlans, forward_batch_of
from .backend_selection import BACKEND_NAME, build_backend
from .router import get_router

__all__ = [
    "BACKEND_NAME",
    "AttentionOp",
    "ForwardMetadata",
    "SglangFlAttnBackend",
    "create_backend",
    "install",
    "kernel_backend_factory",
]


class AttentionOp:
    """The standard ops the backend runs (names as in :data:`sglang_fl.ops.STANDARD_OPS`)."""

    STORE = "store_kv_cache"
    DECODE = "decode_attention"
    EXTEND = "extend_attention"
    ALL = (STORE, DECODE, EXTEND)
    PLANNED: Mapping[str, ForwardKind] = MappingProxyType(
        {DECODE: ForwardKind.DECODE, EXTEND: ForwardKind.EXTEND}
    )


@dataclass(frozen=True)
class ForwardMetadata:
    """What every layer of one forward reads, made once in ``init_forward_metadata``."""

    plan: AttentionPlan | None  # the chosen implementation's plan (None: no op bound)
    out_cache_loc: torch.Tensor | None
    swa_out_cache_loc: torch.Tensor | None  # full->SWA translated slots (hybrid SWA pools)


class _OpBridge(Bridge):
    """Binds one attention op for one layer: the call passes the layer's stand-in first."""

    engine = "SGLang"

    def __init__(self, op_name: str, stand_in: Any) -> None:
        self.op_name = op_name
        self.stand_in = stand_in

    def bind(self, layer: Any, fn: Forward, engine_forward: Forward, handoff: Handoff) -> Forward:
        stand_in = self.stand_in

        def run(*args: Any) -> Any:
            return fn(stand_in, *args)

        return run


@dataclass
class _LayerKernels:
    """The bound kernels of one attention layer (``None``: SGLang's torch_native runs it)."""

    store: Forward | None  # None: the pool's own set_kv_buffer writes (reported)
    decode: Forward | None
    extend: Forward | None


def _layer_stand_in(layer: Any) -> Any:
    """The attention ops' layer from a ``RadixAttention``, as torch_native reads its options."""
    from sglang.srt.layers.radix_attention import AttentionType

    window = layer.sliding_window_size
    causal = not (layer.is_cross_attention or layer.attn_type == AttentionType.ENCODER_ONLY)
    return attention_layer(
        scaling=layer.scaling if layer.scaling is not None else layer.qk_head_dim**-0.5,
        logit_cap=float(layer.logit_cap or 0.0),
        sliding_window_size=window if window is not None and window > NO_WINDOW else NO_WINDOW,
        is_causal=causal,
    )


class SglangFlAttnBackend:  # the AttentionBackend base is mixed in by create_backend
    """SGLang's attention backend running sglang-fl's attention ops (see the module doc)."""

    def __init__(self, model_runner: Any, router: LayerRouter) -> None:
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc
        from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

        super().__init__()
        self._kv_write_loc = KVWriteLoc
        self.model_runner = model_runner
        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.page_size = int(getattr(model_runner, "page_size", None) or 1)
        pool = self.token_to_kv_pool
        self.use_sliding_window_kv_pool = isinstance(pool, SWAKVPool) and pool.swa_layer_nums > 0
        self.router = router
        self.runtime: Runtime = router.runtime
        self.report: DispatchReport = router.report
        self.forward_metadata: ForwardMetadata | None = None
        self._layers: dict[int, _LayerKernels] = {}
        self._resolutions: dict[str, Resolution | None] = {}
        self._no_impl: dict[str, str] = {}  # op -> why no implementation survived
        self._torch_native: Any = None
        self._reported: set[tuple[str, ...]] = set()
        self._lock = threading.Lock()
        self.store_problem = _pool_store_problem(pool)
        self.plans = BackendPlans()
        self._chains: dict[str, FallbackChain] = {}
        for op_name, kind in AttentionOp.PLANNED.items():
            resolution = self._resolution(op_name)
            if resolution is not None:
                self._chains[op_name] = self.plans.chain(
                    kind, resolution, router.report.report_decline
                )

    # --- per forward ------------------------------------------------------------------------

    def init_forward_metadata(self, forward_batch: Any) -> None:
        """Plan the batch once for all layers (a graph step's plan in place); translate the
        new tokens' slots for a sliding-window pool (as torch_native does)."""
        batch = forward_batch_of(forward_batch, self.req_to_token_pool.req_to_token, self.page_size)
        self._set_metadata(self.plans.plan(batch), forward_batch.out_cache_loc)
        if self._torch_native is not None:
            self._torch_native.init_forward_metadata(forward_batch)

    def _set_metadata(self, plan: AttentionPlan | None, out_cache_loc: Any) -> None:
        swa_loc = None
        if self.use_sliding_window_kv_pool and out_cache_loc is not None:
            swa_loc = self.token_to_kv_pool.translate_loc_from_full_to_swa(out_cache_loc)
        self.forward_metadata = ForwardMetadata(plan, out_cache_loc, swa_loc)

    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: Any,
        forward_batch: Any,
        save_kv_cache: bool = True,
        **kwargs: Any,
    ) -> torch.Tensor:
        return self._forward(
            AttentionOp.EXTEND, q, k, v, layer, forward_batch, save_kv_cache, kwargs
        )

    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: Any,
        forward_batch: Any,
        save_kv_cache: bool = True,
        **kwargs: Any,
    ) -> torch.Tensor:
        return self._forward(
            AttentionOp.DECODE, q, k, v, layer, forward_batch, save_kv_cache, kwargs
        )

    def _forward(
        self,
        op_name: str,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: Any,
        forward_batch: Any,
        save_kv_cache: bool,
        kwargs: dict[str, Any],
    ) -> torch.Tensor:
        """Both forwards: the layer's bound kernel over the pool, or SGLang's torch_native for
        what the ops do not cover and for a call every allowed kernel declined."""
        served = self._begin(op_name, layer, forward_batch, kwargs, k, v, save_kv_cache)
        if isinstance(served, str):
            native = self._sglang(served)
            return _native_forward(native, op_name, q, k, v, layer, forward_batch, save_kv_cache)
        kernel, md = served
        heads, v_dim = layer.tp_q_head_num, layer.v_head_dim
        args = [
            # As torch_native: a compiled rope may hand over a 3-D q.
            q.reshape(-1, heads, layer.qk_head_dim),
            self.token_to_kv_pool.get_key_buffer(layer.layer_id),
            self.token_to_kv_pool.get_value_buffer(layer.layer_id),
            md.plan,
        ]
        try:
            out: torch.Tensor = kernel(*args)
        except Unsupported as exc:  # every allowed candidate declined: torch_native runs it
            native = self._declined(op_name, exc)
            # The new K/V are already stored.
            return _native_forward(native, op_name, q, k, v, layer, forward_batch, False)
        return out.view(-1, heads * v_dim)

    def _begin(
        self,
        op_name: str,
        layer: Any,
        forward_batch: Any,
        kwargs: dict[str, Any],
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        save_kv_cache: bool,
    ) -> tuple[Forward, ForwardMetadata] | str:
        """The prologue both forwards share: the layer's bound kernel for ``op_name`` and the
        forward's metadata, the new K/V stored; or why SGLang's torch_native runs the call."""
        kernels = self._kernels(layer)
        kernel = kernels.decode if op_name == AttentionOp.DECODE else kernels.extend
        reason = self._handoff_reason(layer, forward_batch, kwargs)
        if reason is not None:
            return reason
        if kernel is None:
            return f"no {op_name} implementation"
        md = self.forward_metadata
        assert md is not None, "init_forward_metadata was not called for this forward"
        if save_kv_cache and k is not None and v is not None:
            self._store(kernels, layer, md, k, v)
        return kernel, md

    def support_triton(self) -> bool:
        return False

    # --- graph runners ----------------------------------------------------------------------

    def graph_problem(self, mode: GraphMode) -> str | None:
        """Why a ``mode`` graph runner cannot replay this backend's decode step, or ``None``:
        what each decode candidate's planner declares, and what every other implementation
        bound in this process so far declares (those bound later are checked as they bind:
        ``Runtime.bound``)."""
        problems = self.plans.problems(mode, (ForwardKind.DECODE,))
        problems += self.runtime.graph_problems(mode, skip=AttentionOp.PLANNED)
        if AttentionOp.DECODE not in self._chains:
            problems.append(self._no_impl[AttentionOp.DECODE])
        if mode is GraphMode.COMPILED and not self.runtime.config.custom_ops:
            problems.append(
                "SGLANG_FL_CUSTOM_OPS=0: the attention kernels would be traced into the "
                "compiled step (their per-request loops) instead of running as custom ops"
            )
        return "; ".join(problems) or None

    def _graph_state(self, mode: GraphMode, max_bs: int, max_num_tokens: int) -> None:
        problem = self.graph_problem(mode)
        if problem is not None:
            raise GraphModeRefused(
                f"the sglang_fl attention backend cannot run under a {mode} graph runner: {problem}"
            )
        capacity = PlanCapacity(
            kind=ForwardKind.DECODE,
            max_batch=max_bs,
            max_tokens=max_num_tokens,
            max_context=self.req_to_token_pool.req_to_token.shape[1],
            page_size=self.page_size,
            device=torch.device(self.device),
        )
        self.plans.allocate(capacity)
        self.runtime.enter_graph_mode(mode)
        self.report.emit(
            ReportEvent.GRAPH_STATE,
            runner=Runner.SGLANG_FL,
            attention_backend=BACKEND_NAME,
            mode=str(mode),
            max_bs=max_bs,
            max_context=capacity.max_context,
            # decode_attention's candidates, grouped by the plan they share
            plans=list(self.plans.owners.get(ForwardKind.DECODE, {}).values()),
        )

    @staticmethod
    def _decode_only(forward_mode: Any) -> None:
        if not forward_mode.is_decode_or_idle():
            raise GraphModeRefused(
                f"the sglang_fl attention backend captures decode steps only, not {forward_mode}"
            )

    # SGLang's CPU graph runner (--enable-torch-compile on the CPU)

    def init_cpu_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self._graph_state(GraphMode.COMPILED, max_bs, max_num_tokens)

    def get_cpu_graph_seq_len_fill_value(self) -> int:
        return 1  # a padding row attends to one key, in the padding slot

    def init_forward_metadata_capture_cpu_graph(
        self,
        bs: int,
        num_tokens: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        out_cache_loc: torch.Tensor,
        encoder_lens: torch.Tensor | None,
        forward_mode: Any,
        spec_info: Any,
    ) -> None:
        self._decode_only(forward_mode)
        batch = AttentionBatch.decode(
            self.req_to_token_pool.req_to_token, req_pool_indices, seq_lens, self.page_size
        )
        self._set_metadata(self.plans.plan(batch), out_cache_loc)

    # CUDA graphs (SGLang 0.5.23's graph-runner interface)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self._graph_state(GraphMode.CAPTURED, max_bs, max_num_tokens)

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1

    def init_forward_metadata_out_graph(self, forward_batch: Any, in_capture: bool = False) -> None:
        """The host side of a graph step's plans, outside the capture (every replay too)."""
        self._decode_only(forward_batch.forward_mode)
        batch = forward_batch_of(forward_batch, self.req_to_token_pool.req_to_token, self.page_size)
        if self.plans.graph is None or not self.plans.graph.serves(batch):
            raise AssertionError("init_cuda_graph_state did not allocate plans for this batch")
        self.plans.update(batch)
        self._graph_step = batch
        head = self.plans.head_plan(ForwardKind.DECODE)
        self._set_metadata(head, forward_batch.out_cache_loc)

    def init_forward_metadata_in_graph(self, forward_batch: Any) -> None:
        """The device side: recorded into the graph and recomputed at every replay."""
        self.plans.record(self._graph_step)

    # --- binding, once per layer ------------------------------------------------------------

    def _kernels(self, layer: Any) -> _LayerKernels:
        kernels = self._layers.get(layer.layer_id)
        if kernels is None:
            with self._lock:
                kernels = self._layers.get(layer.layer_id)
                if kernels is None:
                    kernels = self._bind_layer(layer)
                    self._layers[layer.layer_id] = kernels
        return kernels

    def _bind_layer(self, layer: Any) -> _LayerKernels:
        stand_in = _layer_stand_in(layer)
        bound: dict[str, Forward | None] = {}
        for op_name in AttentionOp.ALL:
            resolution = self._resolution(op_name)
            fields: dict[str, Any] = {
                # RadixAttention[<op>]: the verify label too; one layer runs three ops, and
                # readers keyed by ``layer`` (one row per layer class) keep all three.
                "layer": _op_label(layer, op_name),
                "layer_id": layer.layer_id,
                "op": op_name,
                "attention_backend": BACKEND_NAME,
            }
            reason = None
            if op_name == AttentionOp.STORE and self.store_problem is not None:
                reason = self.store_problem
            elif resolution is None:
                reason = self._no_impl[op_name]
            if reason is not None:
                bound[op_name] = None
                self.report.emit(
                    ReportEvent.LAYER,
                    runner=Runner.SGLANG,
                    reason=reason,
                    sglang_forward="TorchNativeAttnBackend",
                    **fields,
                )
                continue
            assert resolution is not None
            bound[op_name] = self._bind_op(layer, op_name, stand_in, resolution)
            self.report.emit(
                ReportEvent.LAYER,
                runner=Runner.SGLANG_FL,
                **self.report.decision_fields(resolution.decision),
                **fields,
            )
        return _LayerKernels(
            store=bound[AttentionOp.STORE],
            decode=bound[AttentionOp.DECODE],
            extend=bound[AttentionOp.EXTEND],
        )

    def _resolution(self, op_name: str) -> Resolution | None:
        if op_name in self._resolutions:
            return self._resolutions[op_name]
        resolution: Resolution | None
        try:
            resolution = self.runtime.resolve(op_name)
        except NoImplementationError as exc:
            if self.runtime.config.strict:
                raise
            self._no_impl[op_name] = f"{exc}; left to SGLang's torch_native"
            resolution = None
        self._resolutions[op_name] = resolution
        return resolution

    def _bind_op(self, layer: Any, op_name: str, stand_in: Any, resolution: Resolution) -> Forward:
        bridge = _OpBridge(op_name, stand_in)
        label = _op_label(layer, op_name)  # a verify budget per op, not one shared by the class
        chain = self._chains.get(op_name)  # planned ops: this backend's plans per candidate
        return self.router.bind(
            layer, bridge, resolution, _unreachable(op_name), label, chain=chain
        )

    # --- the store step ---------------------------------------------------------------------

    def _store(
        self,
        kernels: _LayerKernels,
        layer: Any,
        md: ForwardMetadata,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        loc = md.out_cache_loc
        pool = self.token_to_kv_pool
        if kernels.store is None:
            pool.set_kv_buffer(layer, self._kv_write_loc(loc, md.swa_out_cache_loc), k, v)
            return
        if self.use_sliding_window_kv_pool and pool.layers_mapping[layer.layer_id][1]:
            loc = md.swa_out_cache_loc
        try:
            kernels.store(
                pool.get_key_buffer(layer.layer_id),
                pool.get_value_buffer(layer.layer_id),
                loc,
                k.view(-1, layer.tp_k_head_num, layer.qk_head_dim),
                v.view(-1, layer.tp_v_head_num, layer.v_head_dim),
            )
        except Unsupported as exc:  # every allowed candidate declined: the pool writes it
            self._declined(AttentionOp.STORE, exc)
            pool.set_kv_buffer(
                layer, self._kv_write_loc(md.out_cache_loc, md.swa_out_cache_loc), k, v
            )

    # --- SGLang's own backend, for what the ops do not cover ---------------------------------

    def _handoff_reason(self, layer: Any, forward_batch: Any, kwargs: dict[str, Any]) -> str | None:
        if layer.is_cross_attention or forward_batch.encoder_lens is not None:
            return "cross-attention and encoder-decoder batches are not in the attention ops"
        if kwargs:
            return f"attention arguments the ops do not take: {sorted(kwargs)}"
        return None

    def _declined(self, op_name: str, exc: Unsupported) -> Any:
        """Every candidate the policy allows for ``op_name`` declined a call (the last one's
        ``Unsupported`` reached here): SGLang's own code runs it, reported once per op."""
        declined = (
            f"every candidate the policy allows for {op_name} declined a call (the last: "
            f"{exception_text(exc)})"
        )
        if self.runtime.config.strict:
            raise StrictModeError(
                f"SGLANG_FL_STRICT=1: {declined}; without strict mode SGLang's own code would "
                "run it"
            ) from exc
        return self._sglang(f"{declined}; SGLang's own code ran it", key=f"declined:{op_name}")

    def _sglang(self, reason: str, key: str | None = None) -> Any:
        self._report_once(
            ReportEvent.HANDOFF,
            "handoff",
            key or reason,
            layer="sglang.srt.layers.radix_attention.RadixAttention",
            runner=Runner.SGLANG,
            sglang_forward="TorchNativeAttnBackend",
            reason=reason,
            attention_backend=BACKEND_NAME,
        )
        if self._torch_native is None:
            from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

            self._torch_native = TorchNativeAttnBackend(self.model_runner)
            if self.forward_metadata is not None:
                self._torch_native.swa_out_cache_loc = self.forward_metadata.swa_out_cache_loc
        return self._torch_native

    def _report_once(self, event: ReportEvent, *key: str, **fields: Any) -> None:
        marker = (str(event), *key)
        if marker in self._reported:
            return
        with self._lock:
            if marker in self._reported:
                return
            self._reported.add(marker)
        self.report.emit(event, **fields)


def _native_forward(
    native: Any,
    op_name: str,
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    layer: Any,
    forward_batch: Any,
    save_kv_cache: bool,
) -> torch.Tensor:
    """SGLang's torch_native running one call of ``op_name`` (extend or decode)."""
    forward = native.forward_decode if op_name == AttentionOp.DECODE else native.forward_extend
    ran: torch.Tensor = forward(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache)
    return ran


def _op_label(layer: Any, op_name: str) -> str:
    """``sglang.srt.layers.radix_attention.RadixAttention[decode_attention]``."""
    return f"{qualname(type(layer))}[{op_name}]"


def _unreachable(op_name: str) -> Forward:
    def sglang_forward(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{op_name}: the attention bridges never hand a call back")

    return sglang_forward


def _pool_store_problem(pool: Any) -> str | None:
    """Why ``store_kv_cache`` cannot write this KV pool (SGLang's writer then runs), or None."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    pools = [pool.full_kv_pool, pool.swa_kv_pool] if isinstance(pool, SWAKVPool) else [pool]
    for sub in pools:
        if type(sub) is not MHATokenToKVPool:
            return f"the KV pool {type(sub).__name__} is not the token-level MHA pool"
        if sub.is_quantized_kv_cache or sub.store_dtype != sub.dtype:
            return f"the KV pool stores {sub.store_dtype} for {sub.dtype} (quantized)"
        if getattr(sub, "use_hnd", False) or getattr(sub, "kv_cache_layout", None) not in (
            None,
            "nhd",
            "NHD",
        ):
            return "the KV pool's layout is not token-major (HND or 5-D)"
    return None


def _backend_class() -> type:
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

    return type("SglangFlAttnBackend", (SglangFlAttnBackend, AttentionBackend), {})


_cls: type | None = None


def create_backend(model_runner: Any) -> Any:
    """``ATTENTION_BACKENDS["sglang_fl"]``: SGLang calls it once per model runner.

    The policy chooses between this module's kernel-based backend and the whole backends
    vendors offer (:mod:`.backend_selection`); one ``attention_backend`` record says which.
    """
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

    router = get_router() or _private_router(get_runtime())
    return build_backend(
        router.runtime,
        router.report,
        model_runner,
        kernel_backend_factory(router),
        AttentionBackend,
    )


def kernel_backend_factory(router: LayerRouter) -> Callable[[Any], Any]:
    """The kernel-based backend's factory (the selection's reference candidate)."""

    def build(model_runner: Any) -> Any:
        global _cls
        if _cls is None:
            _cls = _backend_class()
        return _cls(model_runner, router)

    return build


def _private_router(runtime: Runtime) -> LayerRouter:
    """A router for a process SGLang loaded no plugins in (a backend built by hand)."""
    report = DispatchReport(runtime.config.dispatch_log)
    return LayerRouter({}, {}, runtime, report, Runner.SGLANG, "SGLang")


def install() -> None:
    """Register ``sglang_fl`` in SGLang's attention registry and CLI choices (idempotent)."""
    from sglang.srt.arg_groups.choices import (
        ATTENTION_BACKEND_CHOICES,
        add_attention_backend_choices,
    )
    from sglang.srt.layers.attention.attention_registry import (
        ATTENTION_BACKENDS,
        register_attention_backend,
    )

    if BACKEND_NAME not in ATTENTION_BACKENDS:
        register_attention_backend(BACKEND_NAME)(create_backend)
    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
