"""Graph-safe routing: each op's custom op, checked against its contract and under dynamo."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from sglang_fl import graph
from sglang_fl.config import Settings
from sglang_fl.ops import STANDARD_OPS, OpCase, OpContract
from sglang_fl.ops.graph_spec import GRAPH_SPECS, WITHOUT_GRAPH_SPEC

pytestmark = pytest.mark.skipif(
    not graph.custom_ops_supported(), reason="this torch has no schema-defined custom ops"
)


def _inputs(contract: OpContract, case: OpCase, dtype: torch.dtype = torch.float32) -> Any:
    return contract.make_inputs(case, dtype, torch.device("cpu"), torch.Generator().manual_seed(0))


def _flag_key(case: OpCase) -> tuple[tuple[str, Any], ...]:
    """A case's flags (booleans, strings, ``None``): what changes the schema path taken."""
    return tuple(
        (name, value)
        for name, value in sorted(case.params.items())
        if isinstance(value, (bool, str)) or value is None
    )


def representative_cases(contract: OpContract) -> Iterator[OpCase]:
    """One case per combination of flags, and every empty batch."""
    seen: set[tuple[tuple[str, Any], ...]] = set()
    for case in contract.cases:
        key = _flag_key(case)
        if key not in seen or case.params.get("tokens") == 0:
            seen.add(key)
            yield case


# Collectives have no sglang-fl custom op: SGLang's own (inplace_all_reduce,
# reg_all_gather_into_tensor, ...) keep them opaque to torch.compile around the routed method.
KERNELS = [op for op, contract in STANDARD_OPS.items() if contract.collective is None]


def test_every_standard_op_has_a_graph_spec() -> None:
    """Or is listed, with the reason, among the ops without a custom-op form (not both);
    collectives have neither (they run on several ranks)."""
    assert set(GRAPH_SPECS) | set(WITHOUT_GRAPH_SPEC) == set(KERNELS)
    assert not set(GRAPH_SPECS) & set(WITHOUT_GRAPH_SPEC)
    assert all(WITHOUT_GRAPH_SPEC.values())


def test_a_collective_has_no_custom_op_and_says_why() -> None:
    with pytest.raises(KeyError, match="collective"):
        graph.graph_op("all_reduce")


@pytest.mark.parametrize("op_name", list(GRAPH_SPECS))
def test_graph_spec_declares_exactly_the_layer_attributes_of_the_contract(op_name: str) -> None:
    """Every attribute a contract stand-in carries is declared, with a type its values fit."""
    contract, spec = STANDARD_OPS[op_name], GRAPH_SPECS[op_name]
    declared = {field.name: field.type for field in spec.layer_fields or ()}
    required = {field.name for field in spec.layer_fields or () if not field.optional}
    for case in contract.cases:
        obj = _inputs(contract, case).obj
        if spec.layer_fields is None:
            assert obj is None, f"{case.name}: a kernel function's obj is None"
            continue
        attributes = vars(obj)
        assert required <= set(attributes) <= set(declared), case.name
        for name, value in attributes.items():
            assert declared[name].accepts(value), f"{case.name}: {name}={value!r}"


@pytest.mark.parametrize("op_name", list(GRAPH_SPECS))
def test_graph_spec_marks_every_argument_the_contract_lets_an_implementation_write(
    op_name: str,
) -> None:
    contract, spec = STANDARD_OPS[op_name], GRAPH_SPECS[op_name]
    may_write: set[str] = set()
    for case in contract.cases:
        inputs = _inputs(contract, case)
        for name in contract.parameter_names[1:]:
            value = inputs.argument(name, contract.signature)
            if isinstance(value, torch.Tensor) and name not in inputs.preserved:
                may_write.add(name)
    assert set(spec.mutates) == may_write


def _dense_if_empty(value: Any) -> Any:
    """An empty tensor with fresh row-major strides: opcheck's input copy
    (``torch._dynamo.utils.clone_input``) computes a negative storage size from the strides of
    an empty view. An empty tensor's strides carry no data, so the case is unchanged."""
    if isinstance(value, torch.Tensor) and value.numel() == 0:
        return value.new_empty(value.shape)
    return value


@pytest.mark.parametrize("op_name", list(GRAPH_SPECS))
def test_opcheck_passes_on_the_contract_cases(op_name: str) -> None:
    """``torch.library.opcheck``: schema, fake implementation and functionalization agree."""
    contract = STANDARD_OPS[op_name]
    graph_op = graph.graph_op(op_name)
    key = graph.register_impl(op_name, "reference", contract.reference)
    op = getattr(torch.ops.sglang_fl, op_name).default
    checked = 0
    for case in representative_cases(contract):
        inputs = _inputs(contract, case)
        arguments = graph_op.flatten(key, inputs.obj, inputs.args, inputs.kwargs)
        torch.library.opcheck(op, tuple(_dense_if_empty(value) for value in arguments))
        checked += 1
    assert checked >= 1


def test_schema_says_what_rms_norm_and_rope_may_write() -> None:
    assert graph.graph_op("rms_norm").schema() == (
        "(str impl, Tensor layer_weight, float layer_variance_epsilon, int layer_hidden_size, "
        "Tensor(a0!) x, Tensor(a1!)? residual) -> Tensor"
    )
    schema = graph.graph_op("rotary_embedding").schema()
    assert "Tensor(a0!) query, Tensor(a1!) key, Tensor cos, Tensor sin" in schema
    assert schema.endswith("-> (Tensor, Tensor)")
    assert graph.graph_op("silu_and_mul").schema() == "(str impl, Tensor x) -> Tensor"


def test_custom_op_runs_the_implementation_given_by_its_key() -> None:
    """Two implementations of one op, two keys: each call runs the one its key names."""
    calls: list[str] = []

    def first(obj: Any, x: torch.Tensor) -> torch.Tensor:
        calls.append("first")
        return x * 2

    def second(obj: Any, x: torch.Tensor) -> torch.Tensor:
        calls.append("second")
        return x * 3

    keys = [
        graph.register_impl("gelu_new", impl_id, fn)
        for impl_id, fn in [("a", first), ("b", second)]
    ]
    assert keys[0] != keys[1]
    assert graph.register_impl("gelu_new", "a", first) == keys[0]
    x = torch.ones(2, 4)
    doubled = torch.ops.sglang_fl.gelu_new(keys[0], x)
    tripled = torch.ops.sglang_fl.gelu_new(keys[1], x)
    assert calls == ["first", "second"]
    torch.testing.assert_close(doubled, x * 2)
    torch.testing.assert_close(tripled, x * 3)


def test_the_implementation_itself_stays_bound_on_or_off() -> None:
    """Eager calls cost what they cost without custom ops: nothing wraps the function."""
    fn = make_untraceable_rms_norm()
    assert graph.graph_safe("rms_norm", fn, "test.off", enabled=False) is fn
    assert graph.graph_safe("rms_norm", fn, "test.on") is fn


def test_a_function_already_standing_for_another_op_is_wrapped_instead() -> None:
    fn = make_untraceable_rms_norm()
    assert graph.graph_safe("rms_norm", fn, "test.first") is fn
    wrapped = graph.graph_safe("gemma_rms_norm", fn, "test.second")
    assert wrapped is not fn
    assert inspect.unwrap(wrapped) is fn


def test_setting_custom_ops_defaults_on_and_parses_from_the_environment() -> None:
    assert Settings.from_environment({}).custom_ops is True
    assert Settings.from_environment({"SGLANG_FL_CUSTOM_OPS": "0"}).custom_ops is False


def test_wrong_arguments_name_the_contract_parameters() -> None:
    graph_op = graph.graph_op("rms_norm")
    with pytest.raises(TypeError, match=r"unexpected or repeated keyword.*'bogus'.*x, residual"):
        graph_op.arguments((torch.ones(1, 2),), {"bogus": 1})
    with pytest.raises(TypeError, match="missing argument 'x'"):
        graph_op.arguments((), {})


# --- under dynamo -------------------------------------------------------------------------


class Norm(torch.nn.Module):
    """A layer as SGLang's RMSNorm carries it: ``weight``, ``variance_epsilon``, ``hidden_size``."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, hidden), requires_grad=False)
        self.variance_epsilon = 1e-6
        self.hidden_size = hidden


def make_untraceable_rms_norm() -> Any:
    """A new kernel dynamo cannot trace: a host round trip and a branch on the value it read.

    A new function object each time: a substitution for dynamo is per function object.
    """

    def untraceable_rms_norm(
        obj: Any, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        peak = float(x.abs().max().item()) if x.numel() else 0.0
        if peak > 1e30:  # data-dependent Python
            raise ValueError("overflow")
        out = STANDARD_OPS["rms_norm"].reference(obj, x, residual)
        if residual is None:
            return out
        normed, summed = out
        x.copy_(normed)  # a fused kernel's in-place results, returned as the inputs themselves
        residual.copy_(summed)
        return x, residual

    return untraceable_rms_norm


class CallableKernel:
    """An implementation that is not a plain function (a kernel object): it gets wrapped."""

    def __init__(self, kernel: Any = None) -> None:
        self.kernel = kernel or make_untraceable_rms_norm()

    def __call__(self, *args: Any) -> Any:
        return self.kernel(*args)


class GraphRecorder:
    """A dynamo backend that keeps each graph's call targets and runs it with aot_eager."""

    def __init__(self) -> None:
        self.targets: list[str] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from torch._dynamo.backends.common import aot_autograd

        self.targets += [str(node.target) for node in gm.graph.nodes if node.op == "call_function"]
        return aot_autograd(fw_compiler=lambda g, _: g)(gm, example_inputs)


def _forward(fn: Any, layer: Norm) -> Any:
    def forward(x: torch.Tensor, residual: torch.Tensor) -> Any:
        normed, summed = fn(layer, x * 1.0, residual * 1.0)
        return normed + 1.0, summed

    return forward


@pytest.mark.parametrize(
    "make_kernel", [make_untraceable_rms_norm, CallableKernel], ids=["function", "kernel-object"]
)
def test_untraceable_kernel_compiles_fullgraph_as_one_custom_op_with_eager_results(
    make_kernel: Any,
) -> None:
    torch._dynamo.reset()
    layer = Norm(32)
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(1))
    residual = torch.randn(5, 32, generator=torch.Generator().manual_seed(2))
    routed = graph.graph_safe("rms_norm", make_kernel(), "test.untraceable")
    eager = _forward(routed, layer)(x, residual)
    recorder = GraphRecorder()
    compiled = torch.compile(_forward(routed, layer), fullgraph=True, backend=recorder)
    got = compiled(x, residual)
    assert "sglang_fl.rms_norm.default" in recorder.targets
    for want, have in zip(eager, got, strict=True):
        assert torch.equal(want, have)


def test_without_the_custom_op_the_same_kernel_breaks_fullgraph() -> None:
    """The control: the kernel above really is untraceable, so the custom op is what helps."""
    torch._dynamo.reset()
    kernel = make_untraceable_rms_norm()
    compiled = torch.compile(_forward(kernel, Norm(32)), fullgraph=True, backend="eager")
    with pytest.raises(torch._dynamo.exc.TorchDynamoException):
        compiled(torch.randn(5, 32), torch.randn(5, 32))


def test_a_wrapped_kernel_is_called_directly_in_eager_mode() -> None:
    calls: list[bool] = []

    def kernel(obj: Any, x: torch.Tensor) -> torch.Tensor:
        calls.append(torch.compiler.is_compiling())
        return x + 1

    wrapped = graph.graph_safe("gelu_quick", CallableKernel(kernel), "test.eager")
    assert torch.equal(wrapped(None, torch.zeros(2)), torch.ones(2))
    assert calls == [False]


class FusedNormGated(torch.nn.Module):
    """SGLang's ``FusedRMSNormGated``'s attributes: no ``norm_before_gate``, ``group_size``."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.hidden_size, self.eps, self.activation = hidden, 1e-6, "silu"
        self.weight = torch.nn.Parameter(torch.rand(hidden, generator=torch.Generator()))


def test_a_layer_without_an_optional_attribute_compiles_fullgraph_with_the_default() -> None:
    """A missing optional attribute crosses as ``None`` and the stand-in lacks it: the
    contract's default applies, as in eager mode, without a graph break."""
    torch._dynamo.reset()
    layer = FusedNormGated(16)
    generator = torch.Generator().manual_seed(3)
    x, gate = torch.randn(4, 16, generator=generator), torch.randn(4, 16, generator=generator)
    seen: list[dict[str, Any]] = []

    def kernel(obj: Any, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        seen.append(dict(vars(obj)) if not torch.compiler.is_compiling() else {})
        return STANDARD_OPS["rms_norm_gated"].reference(obj, x, gate)

    routed = graph.graph_safe("rms_norm_gated", kernel, "test.gated")
    recorder = GraphRecorder()
    compiled = torch.compile(lambda a, b: routed(layer, a, b), fullgraph=True, backend=recorder)
    with torch.no_grad():  # as SGLang runs its layers
        want, got = routed(layer, x, gate), compiled(x, gate)
    assert "sglang_fl.rms_norm_gated.default" in recorder.targets
    assert torch.equal(want, got)
    assert set(seen[-1]) == {"weight", "eps", "activation", "hidden_size"}
