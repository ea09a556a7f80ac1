"""What every engine integration shares: bridges, and the once-per-class routing plan.

An engine integration (SGLang's, vLLM's) finds the moment its engine picks the forward of one
layer instance, and asks a :class:`LayerRouter` subclass what to cache instead. The router
plans once per layer class (which standard op, which bridge, which implementation, or why the
engine keeps the layer), reports that plan, and reports refusals and handoffs once each. The
engine-specific part is only the hook and the bridges: how the engine's call arguments map to
the standard op signatures.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .._forksafe import reset_locks_in_child
from ..dispatch.binder import FallbackChain
from ..dispatch.resolve import Resolution
from ..dispatch_report import DispatchReport, ReportEvent, Runner
from ..errors import NoImplementationError
from ..graph import graph_safe
from ..runtime import Runtime
from ..verify import Verifier

__all__ = [
    "Bridge",
    "CosSinHalves",
    "Forward",
    "Handoff",
    "LayerRouter",
    "NormResult",
    "Plan",
    "Rotate",
    "norm_rows",
    "qualname",
    "rotate_heads",
    "rows_forward",
]

# handoff(reason) hands one call to the engine's own forward; it logs once per class/reason.
Handoff = Callable[[str], None]
Forward = Callable[..., Any]
NormResult = torch.Tensor | tuple[torch.Tensor, torch.Tensor]  # a norm: x, or (x, residual)


def qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _method_name(method: Any) -> str:
    return getattr(method, "__name__", None) or repr(method)


class Bridge:
    """How one standard op is bridged to one engine's layer class.

    A bridge is built once per layer instance, when the engine resolves that instance's
    forward. It closes over the chosen implementation (``fn``), the layer, and the engine's own
    forward for the few argument combinations the standard ops do not cover. Per call it only
    translates arguments: no policy read, no registry lookup, no pluggy call.
    """

    op_name: str
    engine: ClassVar[str]  # the engine's name in refusal reasons: "SGLang", "vLLM"

    def refuse_class(self, cls: type, layer_base: type) -> str | None:
        """Why ``cls`` (a subclass of ``layer_base``) must stay with the engine, or ``None``.

        A subclass that overrides ``forward_native`` computes something the standard op does
        not (e.g. a Gemma-style norm applying ``1 + weight``), so it is never bridged.
        """
        below_base = cls.__mro__[: cls.__mro__.index(layer_base)]  # empty for the base itself
        for klass in below_base:
            if "forward_native" in klass.__dict__:
                return (
                    f"{klass.__qualname__} overrides forward_native, so its math is not "
                    f"{self.op_name}'s; left to {self.engine}"
                )
        return None

    def refuse_instance(self, layer: Any) -> str | None:
        """Why this instance's options fall outside the standard op, or ``None``."""
        return None

    def bind(self, layer: Any, fn: Forward, engine_forward: Forward, handoff: Handoff) -> Forward:
        """The forward to cache on ``layer``: the engine's forward signature, calling ``fn``."""
        raise NotImplementedError


def rows_forward(layer: Any, fn: Forward, *, halves: bool) -> Forward:
    """``forward(x)`` calling ``fn(layer, x_2d)``; ``halves``: the op halves the last dim.

    Activation layers take ``x`` of any rank; the standard ops take ``[num_tokens, width]``,
    so leading dims are flattened and restored around the call.
    """

    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            rows: torch.Tensor = fn(layer, x)
            return rows
        lead, width = x.shape[:-1], x.shape[-1]
        out: torch.Tensor = fn(layer, x.reshape(-1, width))
        return out.reshape(*lead, width // 2 if halves else width)

    return forward


def norm_rows(fn: Forward, obj: Any, x: torch.Tensor, residual: torch.Tensor | None) -> NormResult:
    """``fn(obj, x[, residual])`` of a residual norm on 2-D rows, the results in the callers'
    shapes (norm layers take ``x`` of any rank; the standard ops ``[num_tokens, hidden]``)."""
    if x.dim() == 2:
        normed: NormResult = fn(obj, x) if residual is None else fn(obj, x, residual)
        return normed
    shape, hidden = x.shape, x.shape[-1]
    if residual is None:
        rows: torch.Tensor = fn(obj, x.reshape(-1, hidden))
        return rows.reshape(shape)
    out: torch.Tensor
    res: torch.Tensor
    out, res = fn(obj, x.reshape(-1, hidden), residual.reshape(-1, hidden))
    return out.reshape(shape), res.reshape(residual.shape)


class CosSinHalves:
    """A rotary layer's ``cos_sin_cache`` as the two halves ``rotary_embedding`` takes.

    Memoised per query dtype and rebuilt only when the engine replaces the cache (growth,
    device move), so a call never converts the whole cache.
    """

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        # query dtype -> (source cos_sin_cache, cos, sin)
        self.halves: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def __call__(
        self, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cache = self.layer.cos_sin_cache
        memo = self.halves.get(dtype)
        if memo is None or memo[0] is not cache:
            cos, sin = cache.to(device=device, dtype=dtype).chunk(2, dim=-1)
            memo = (cache, cos.contiguous(), sin.contiguous())
            self.halves[dtype] = memo
        return memo[1], memo[2]


Rotate = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def rotate_heads(layer: Any, fn: Forward) -> tuple[Rotate, CosSinHalves]:
    """``rotary_embedding`` applied the way both engines' rope layers are called.

    The returned ``rotate(positions, query, key)`` takes flat ``[tokens]`` positions and
    ``query``/``key`` of ``[tokens, heads * head_size]`` (or with a heads dimension), rotates
    the rotary part of each head in place, as the engines' kernels do, and returns
    ``(query, key)``. The :class:`CosSinHalves` it reads comes with it, for inspection.
    """
    head_size = layer.head_size
    rotary_dim = layer.rotary_dim
    partial = rotary_dim < head_size
    interleaved = not layer.is_neox_style
    cos_sin = CosSinHalves(layer)

    def rotate(
        positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        num_tokens = positions.shape[0]
        q = query.view(num_tokens, -1, head_size)
        k = key.view(num_tokens, -1, head_size)
        if partial:
            q = q[..., :rotary_dim]
            k = k[..., :rotary_dim]
        cos, sin = cos_sin(query.dtype, query.device)
        q_out, k_out = fn(layer, q, k, cos, sin, positions, interleaved, True)
        if q_out is not q:
            q.copy_(q_out)
        if k_out is not k:
            k.copy_(k_out)
        return query, key

    return rotate, cos_sin


@dataclass(frozen=True)
class Plan:
    """What happens to every instance of one layer class in this process."""

    op_name: str | None
    bridge: Bridge | None
    resolution: Resolution | None


class LayerRouter:
    """Plans once per layer class, and reports plans, refusals and handoffs once each.

    ``layers`` maps the engine's layer classes to the standard op each stands for; a class is
    routed to the op of its nearest listed class. ``runner`` is the engine's own runner in the
    report (``forward`` fields are named after it: ``sglang_forward``, ``vllm_forward``).
    """

    def __init__(
        self,
        layers: Mapping[type, str],
        bridges: Mapping[str, Bridge],
        runtime: Runtime,
        report: DispatchReport,
        runner: Runner,
        engine: str,
    ) -> None:
        self.layers = layers
        self.bridges = bridges
        self.runtime = runtime
        self.report = report
        self.runner = runner
        self.engine = engine
        self.forward_field = f"{runner}_forward"
        self._plans: dict[type, Plan] = {}
        self._chains: dict[str, FallbackChain] = {}  # op -> its binding, declines reported
        # (event, layer class, reason) already reported: refusals and handoffs, once each.
        self._reported: set[tuple[ReportEvent, type, str]] = set()
        self._lock = threading.RLock()
        reset_locks_in_child(self)
        config = runtime.config
        self.verifier = Verifier(
            config.verify, config.verify_ops, lambda rec: report.emit(ReportEvent.VERIFY, **rec)
        )

    def _reset_locks_after_fork(self) -> None:
        self._lock = threading.RLock()

    def _layer_base(self, cls: type) -> type | None:
        """The nearest class in ``cls``'s MRO that stands for a standard op, if any."""
        return next((klass for klass in cls.__mro__ if klass in self.layers), None)

    def _op_of(self, cls: type) -> str | None:
        base = self._layer_base(cls)
        return None if base is None else self.layers[base]

    def _plan(self, cls: type, engine_forward: Forward) -> Plan:
        with self._lock:
            plan = self._plans.get(cls)
            if plan is not None:
                return plan
            layer_base = self._layer_base(cls)
            op_name = None if layer_base is None else self.layers[layer_base]
            bridge = self.bridges.get(op_name) if op_name else None
            resolution = None
            rejected: dict[str, Any] = {}
            reason = f"no standard sglang-fl op for this layer; {self.engine} runs it"
            if bridge is not None and op_name is not None and layer_base is not None:
                refusal = bridge.refuse_class(cls, layer_base)
                if refusal is not None:
                    reason = refusal
                else:
                    try:
                        resolution = self.runtime.resolve(op_name)
                    except NoImplementationError as exc:
                        if self.runtime.config.strict:
                            raise
                        reason = f"{exc}; left to {self.engine}"
                        rejected = self.report.rejected_once(exc.decision)
            plan = Plan(op_name, bridge, resolution)
            self._plans[cls] = plan
            fields: dict[str, Any] = {
                "layer": qualname(cls),
                "op": op_name,
                self.forward_field: _method_name(engine_forward),
            }
            if resolution is not None:
                fields.update(
                    runner=Runner.SGLANG_FL, **self.report.decision_fields(resolution.decision)
                )
            else:
                fields.update(runner=self.runner, reason=reason, **rejected)
            self.report.emit(ReportEvent.LAYER, **fields)
            return plan

    def bind(
        self,
        layer: Any,
        bridge: Bridge,
        resolution: Resolution,
        engine_forward: Forward,
        label: str | None = None,
        *,
        chain: FallbackChain | None = None,
    ) -> Forward:
        """The forward ``layer`` keeps: a bridge to the chosen implementation, or the engine's.

        The one place where a chosen implementation reaches a layer, in either engine (and in
        SGLang's attention backend, per layer and op; ``label`` names what verify counts
        calls of, the layer class by default): the op's fallback chain, whose declines are
        ``fallback`` records, bound once per op and process; wrappers that compile it (custom
        ops) and observe it (verify mode) are applied here, once per layer; the verifier is
        outermost, so under compile it steps aside for the custom op. ``chain``: a binding the
        caller made of the same candidates (the attention backend's, whose candidates each
        read their own plan), reporting its declines through :meth:`report_decline`.
        """
        cls = type(layer)
        reason = bridge.refuse_instance(layer)
        if reason is not None:
            self._note_refusal(cls, bridge.op_name, reason, engine_forward)
            return engine_forward
        chosen = resolution.decision.chosen
        config = self.runtime.config
        self.runtime.bound(resolution.op, chosen)
        chain = chain or self._chain(resolution)
        # Both return chain.fn itself when off: eager calls then cost what they did before.
        fn = graph_safe(
            resolution.op,
            chain.fn,
            chosen.impl_id,
            enabled=config.custom_ops,
            traceable=chain.traceable,
        )
        fn = self.verifier.wrap(fn, chosen, label or qualname(cls), chain=chain)
        forward = bridge.bind(layer, fn, engine_forward, self._handoff(cls, engine_forward))
        # Engines' traces label a cached forward by its name: make it say who runs.
        forward.__name__ = forward.__qualname__ = f"sglang_fl[{chosen.impl_id}]"
        forward.sglang_fl_impl_id = chosen.impl_id  # type: ignore[attr-defined]
        return forward

    def _chain(self, resolution: Resolution) -> FallbackChain:
        """The op's binding, shared by every layer: each decline is reported once per process."""
        chain = self._chains.get(resolution.op)
        if chain is None:
            with self._lock:
                chain = self._chains.get(resolution.op)
                if chain is None:
                    chain = resolution.bind(self.report.report_decline)
                    self._chains[resolution.op] = chain
        return chain

    def _note_refusal(
        self, cls: type, op_name: str | None, reason: str, engine_forward: Forward
    ) -> None:
        self._report_once(ReportEvent.LAYER, cls, op_name, reason, engine_forward, scope="instance")

    def _handoff(self, cls: type, engine_forward: Forward) -> Handoff:
        def handoff(reason: str) -> None:
            self._report_once(ReportEvent.HANDOFF, cls, self._op_of(cls), reason, engine_forward)

        return handoff

    def _report_once(
        self,
        event: ReportEvent,
        cls: type,
        op_name: str | None,
        reason: str,
        engine_forward: Forward,
        **extra: str,
    ) -> None:
        """Report that the engine runs ``cls`` (or one call of it) for ``reason``, once."""
        key = (event, cls, reason)
        if key in self._reported:  # the common case per call: no lock
            return
        with self._lock:
            if key in self._reported:
                return
            self._reported.add(key)
        self.report.emit(
            event,
            layer=qualname(cls),
            op=op_name,
            runner=self.runner,
            reason=reason,
            **{self.forward_field: _method_name(engine_forward)},
            **extra,
        )
