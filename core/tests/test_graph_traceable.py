"""Traceable implementations: traced into a compiled graph instead of called as a custom op.

An implementation that declares ``traceable`` (the references of the elementwise ops and the KV
store) is left for dynamo to trace, so inductor fuses it with the code around it; every other
implementation stays behind its ``sglang_fl::<op>`` custom op (``test_graph.py``). Declared
traceable means: it traces whole (``fullgraph=True``) on every case of its contract, gives
the eager results there, and inductor's code for it, with eager's casts kept
(``emulate_precision_casts``, as sglang-fl's CPU graph runner compiles), is bit for bit the
eager result in every dtype.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_graph import _inputs

from sglang_fl import graph
from sglang_fl.dispatch.binder import FallbackChain
from sglang_fl.dispatch.registry import OpRegistry, RegistrationError
from sglang_fl.dispatch.types import BackendImplKind, OpImpl
from sglang_fl.errors import Unsupported
from sglang_fl.ops import STANDARD_OPS, OpContract
from sglang_fl.ops.attention.store import STORE_KV_CACHE

pytestmark = pytest.mark.skipif(
    not graph.custom_ops_supported(), reason="this torch has no schema-defined custom ops"
)

TRACEABLE = sorted(op for op, c in STANDARD_OPS.items() if c.reference_traceable)


def test_the_elementwise_references_and_the_kv_store_are_traceable() -> None:
    assert TRACEABLE == ["rotary_embedding", "silu_and_mul", "store_kv_cache"]
    for op in TRACEABLE:
        assert STANDARD_OPS[op].plan_stage is None
        assert STANDARD_OPS[op].collective is None


def _run(fn: Any, contract: OpContract, case: Any, dtype: torch.dtype) -> Any:
    inputs = _inputs(contract, case, dtype)
    out = fn(inputs.obj, *inputs.args, **inputs.kwargs)
    return out, inputs


def _assert_identical(eager: Any, compiled: Any) -> None:
    flat_eager = eager if isinstance(eager, (tuple, list)) else (eager,)
    flat_compiled = compiled if isinstance(compiled, (tuple, list)) else (compiled,)
    for want, got in zip(flat_eager, flat_compiled, strict=True):
        if isinstance(want, torch.Tensor):
            assert got.dtype == want.dtype
            assert got.shape == want.shape
            assert torch.equal(got, want), (got - want).abs().max()


@pytest.mark.parametrize("op_name", TRACEABLE)
def test_a_traceable_reference_traces_whole_on_every_case(op_name: str) -> None:
    contract = STANDARD_OPS[op_name]
    for case in contract.cases:
        torch._dynamo.reset()
        compiled = torch.compile(contract.reference, fullgraph=True, backend="eager")
        eager_out, eager_inputs = _run(contract.reference, contract, case, torch.float32)
        compiled_out, compiled_inputs = _run(compiled, contract, case, torch.float32)
        _assert_identical(eager_out, compiled_out)
        _assert_identical(eager_inputs.args, compiled_inputs.args)  # what it wrote in place


def _decode_case(contract: OpContract) -> Any:
    """The contract's first non-empty contiguous case: a decode step's shape."""
    return next(
        c
        for c in contract.cases
        if c.params.get("tokens", 1) and c.params.get("contiguous", True) is not False
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("op_name", TRACEABLE)
def test_inductors_code_for_a_traceable_reference_is_eagers_bit_for_bit(
    op_name: str, dtype: torch.dtype
) -> None:
    contract = STANDARD_OPS[op_name]
    if dtype not in contract.dtypes:
        pytest.skip(f"{op_name} has no {dtype} cases")
    case = _decode_case(contract)
    torch._dynamo.reset()
    with torch._inductor.config.patch(emulate_precision_casts=True):
        compiled = torch.compile(contract.reference, fullgraph=True, backend="inductor")
        compiled_out, compiled_inputs = _run(compiled, contract, case, dtype)
    eager_out, eager_inputs = _run(contract.reference, contract, case, dtype)
    _assert_identical(eager_out, compiled_out)
    _assert_identical(eager_inputs.args, compiled_inputs.args)


class _TracedCode:
    """A dynamo backend that notes the routed ops whose code each graph traced."""

    def __init__(self) -> None:
        self.ops: set[str] = set()
        self.targets: list[str] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from torch._guards import TracingContext

        self.ops |= graph.traced_ops(TracingContext.get_traced_code() or ())
        self.targets += [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        return gm.forward


def _silu_kernel() -> Any:
    def silu_kernel(obj: Any, x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.nn.functional.silu(x[..., :half]) * x[..., half:]

    return silu_kernel


def test_a_traceable_implementation_is_traced_into_the_graph_not_called() -> None:
    kernel = _silu_kernel()
    routed = graph.graph_safe("silu_and_mul", kernel, "test.traceable", traceable=True)
    assert routed is kernel
    before = graph.compiled_calls().get("silu_and_mul", 0)
    backend = _TracedCode()
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: routed(None, x) + 1, fullgraph=True, backend=backend)
    x = torch.randn(3, 8)
    assert torch.equal(compiled(x), kernel(None, x) + 1)
    assert backend.ops == {"silu_and_mul"}
    assert not any("sglang_fl" in t for t in backend.targets), backend.targets
    assert graph.compiled_calls().get("silu_and_mul", 0) == before


def test_an_implementation_not_declared_traceable_stays_a_custom_op() -> None:
    kernel = _silu_kernel()
    assert graph.graph_safe("silu_and_mul", kernel, "test.opaque") is kernel
    backend = _TracedCode()
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: kernel(None, x) + 1, fullgraph=True, backend=backend)
    compiled(torch.randn(3, 8))
    assert backend.ops == set()
    assert "sglang_fl.silu_and_mul.default" in backend.targets


def test_a_function_already_behind_a_custom_op_is_not_claimed_traced() -> None:
    """One function object, one way dynamo sees it: bound opaque first, it stays opaque."""
    kernel = _silu_kernel()
    graph.graph_safe("silu_and_mul", kernel, "test.first")
    graph.graph_safe("silu_and_mul", kernel, "test.again", traceable=True)
    backend = _TracedCode()
    torch._dynamo.reset()
    torch.compile(lambda x: kernel(None, x), fullgraph=True, backend=backend)(torch.randn(2, 4))
    assert backend.ops == set()
    assert "sglang_fl.silu_and_mul.default" in backend.targets


def _impl(fn: Any, impl_id: str, *, traceable: bool = False) -> OpImpl:
    return OpImpl(
        "silu_and_mul", impl_id, BackendImplKind.VENDOR, fn, vendor="v", traceable=traceable
    )


def test_a_chain_is_traceable_only_as_one_traceable_implementation_itself() -> None:
    def declines(obj: Any, x: torch.Tensor) -> torch.Tensor:
        raise Unsupported("never")

    alone = FallbackChain("silu_and_mul", [_impl(_silu_kernel(), "v.a", traceable=True)])
    assert alone.traceable
    assert alone.fn is alone.impls[0].fn
    opaque = FallbackChain("silu_and_mul", [_impl(_silu_kernel(), "v.b")])
    assert not opaque.traceable
    # A fallback closure (a try around the first) is the chain's own code: a custom op.
    chained = FallbackChain(
        "silu_and_mul",
        [_impl(declines, "v.c", traceable=True), _impl(_silu_kernel(), "v.d", traceable=True)],
    )
    assert not chained.traceable
    strict = FallbackChain(
        "silu_and_mul",
        [_impl(declines, "v.e", traceable=True), _impl(_silu_kernel(), "v.f")],
        strict=True,
    )
    assert not strict.traceable


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_registering_a_non_bool_traceable_is_refused_by_name(value: object) -> None:
    registry = OpRegistry()
    with pytest.raises(RegistrationError, match=r"traceable=.*expected True .* or False"):
        registry.register(_impl(_silu_kernel(), "v.bad", traceable=value))  # type: ignore[arg-type]


def test_a_planned_op_cannot_be_traceable() -> None:
    registry = OpRegistry()
    impl = OpImpl(
        "decode_attention",
        "v.attn",
        BackendImplKind.VENDOR,
        STANDARD_OPS["decode_attention"].reference,
        vendor="v",
        traceable=True,
    )
    with pytest.raises(RegistrationError, match="is planned"):
        registry.register(impl)


def test_the_reference_backend_declares_what_its_contracts_say() -> None:
    class Collecting:
        def __init__(self) -> None:
            self.impls: list[OpImpl] = []

        def register_many(self, impls: Any) -> None:
            self.impls.extend(impls)

    from sglang_fl import reference

    collected = Collecting()
    reference.sglang_fl_register_ops(collected)  # type: ignore[arg-type]
    assert {impl.op_name for impl in collected.impls if impl.traceable} == set(TRACEABLE)
    assert STORE_KV_CACHE.reference_traceable
