"""Graph-safe routing: every standard op as a ``torch.library`` custom op ``sglang_fl::<op>``.

A vendor kernel may be a C extension, read values back to the host or branch on data: dynamo
cannot trace it, so ``torch.compile`` breaks the graph there (or fails with
``fullgraph=True``). :func:`graph_safe` makes dynamo trace, in place of the implementation
chosen for an op, a call of the op's custom op: one opaque node whose schema says which
arguments it may write and whose fake implementation (the contract's reference, run on fake
tensors) gives the outputs' shapes. Eager calls are untouched: the implementation itself stays
bound, and the substitution exists only for dynamo (``torch.compiler.substitute_in_graph``).

The layer object cannot cross a custom op's boundary: its attributes declared in
:data:`sglang_fl.ops.graph_spec.GRAPH_SPECS` become leading arguments, and the custom op calls
the implementation with a stand-in carrying just those attributes. Which implementation runs
is the first argument, a key naming the implementation the substitution stands for; keys are
given out once per implementation object and process.

A planned op's plan (:mod:`sglang_fl.ops.attention.plan`) crosses the boundary as three
arguments: its type's name, its tensor fields (``Tensor?[]``) and its plain values
(``Scalar[]``, constants of the compiled graph: a change recompiles); the custom op rebuilds the
plan from them (:func:`plan_layout`).

Engine-agnostic: the SGLang integration wraps at its binding seam; other engines can call
:func:`graph_safe` the same way.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import inspect
import itertools
import logging
import os
import threading
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from ._strenum import StrEnum
from .ops import get_contract
from .ops.contract import OpContract
from .ops.graph_spec import GRAPH_SPECS, GraphSpec

__all__ = [
    "NAMESPACE",
    "GraphOp",
    "OutputForm",
    "PlanLayout",
    "compiled_calls",
    "custom_ops_supported",
    "graph_op",
    "graph_safe",
    "plan_layout",
    "register_impl",
    "traced_ops",
]

NAMESPACE = "sglang_fl"
_log = logging.getLogger(__name__)
# Prefix of the custom-op arguments that carry layer attributes (no clash with call arguments).
LAYER_PREFIX = "layer_"

# Contract parameter annotations -> schema types (annotations are strings: postponed).
_ARGUMENT_TYPES: Mapping[str, str] = {
    "torch.Tensor": "Tensor",
    "torch.Tensor | None": "Tensor?",
    "bool": "bool",
    "int": "int",
    "float": "float",
    "float | None": "float?",
    "str": "str",
    "str | bool | None": "str?",
}
# A ``str | bool | None`` argument (a convolution's activation: a name, or SGLang's
# True/False) crosses as ``str?``: a bool as one of these strings, read back inside the op.
_BOOL_AS_STR: Mapping[bool, str] = {True: "<sglang_fl:True>", False: "<sglang_fl:False>"}
_STR_AS_BOOL: Mapping[str, bool] = {text: flag for flag, text in _BOOL_AS_STR.items()}


class OutputForm(StrEnum):
    """What an op returns, read from its contract's return annotation."""

    TENSOR = "tensor"
    TUPLE = "tuple"  # a fixed number of tensors
    # One tensor alone, or a pair when an optional argument is given (rms_norm's residual).
    TENSOR_OR_PAIR = "tensor-or-pair"


# The annotation of a planned op's plan parameter (see ``sglang_fl.ops.attention.plan``).
PLAN_ANNOTATION = "AttentionPlan"
# A plan's field annotations -> whether the field is a tensor (else a plain value).
_PLAN_FIELD_TYPES: Mapping[str, bool] = {
    "torch.Tensor": True,
    "torch.Tensor | None": True,
    "int": False,
    "float": False,
    "bool": False,
}


@dataclass(frozen=True)
class PlanLayout:
    """How plans of one type cross a custom op: which fields are tensors, which plain values."""

    name: str
    cls: type
    tensor_fields: tuple[str, ...]
    value_fields: tuple[str, ...]

    def rebuild(self, tensors: Sequence[Any], values: Sequence[Any]) -> Any:
        """The plan whose fields are ``tensors`` and ``values``, in this layout's order."""
        fields = dict(zip(self.tensor_fields, tensors, strict=True))
        fields.update(zip(self.value_fields, values, strict=True))
        return self.cls(**fields)


_plan_layouts: dict[type, PlanLayout] = {}
_plan_layouts_by_name: dict[str, PlanLayout] = {}


def plan_layout(cls: type) -> PlanLayout:
    """The layout of plan type ``cls`` (a dataclass whose fields are annotated tensors or
    ``int``/``float``/``bool``), made once per type; a ``TypeError`` names a field that is
    neither, for plans that cannot cross into a compiled graph."""
    layout = _plan_layouts.get(cls)
    if layout is not None:
        return layout
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"plan type {qualified(cls)} is not a dataclass")
    tensors: list[str] = []
    values: list[str] = []
    for spec in dataclasses.fields(cls):
        annotation = spec.type if isinstance(spec.type, str) else getattr(spec.type, "__name__", "")
        is_tensor = _PLAN_FIELD_TYPES.get(annotation)
        if is_tensor is None or not spec.init:
            raise TypeError(
                f"plan type {qualified(cls)}: field {spec.name!r} ({annotation!r}) is neither a "
                f"tensor nor a plain int/float/bool init field, so its plans cannot cross "
                f"into a compiled graph; allowed annotations: {', '.join(_PLAN_FIELD_TYPES)}"
            )
        (tensors if is_tensor else values).append(spec.name)
    with _lock:
        layout = _plan_layouts.get(cls)
        if layout is None:
            name = qualified(cls)
            if name in _plan_layouts_by_name:  # two classes of one name: keep both apart
                name = f"{name}#{len(_plan_layouts)}"
            layout = PlanLayout(name, cls, tuple(tensors), tuple(values))
            _plan_layouts[cls] = layout
            _plan_layouts_by_name[name] = layout
        return layout


def qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@torch.compiler.assume_constant_result
def _plan_fields(cls: type) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """What dynamo reads of a plan's layout while it traces: constants (the plan's type is
    guarded anyway, by the attribute reads of its fields)."""
    layout = plan_layout(cls)
    return layout.name, layout.tensor_fields, layout.value_fields


def _split_plan(plan: Any) -> tuple[str, list[Any], list[Any]]:
    name, tensor_fields, value_fields = _plan_fields(type(plan))
    return (
        name,
        [getattr(plan, field) for field in tensor_fields],
        [getattr(plan, field) for field in value_fields],
    )


def _tuple_annotation(count: int) -> str:
    return f"tuple[{', '.join(['torch.Tensor'] * count)}]"


# Return annotation -> (form, number of outputs). The custom op's returns are fixed, since
# functionalization of an op that writes its arguments does not support a ``Tensor[]``
# return: its fresh outputs (those the GraphSpec does not name as arguments written in place);
# a TENSOR_OR_PAIR op writes its second output into the argument its GraphSpec names.
_OUTPUT_FORMS: Mapping[str, tuple[OutputForm, int]] = {
    "torch.Tensor": (OutputForm.TENSOR, 1),
    **{_tuple_annotation(n): (OutputForm.TUPLE, n) for n in (2, 3, 4)},
    "torch.Tensor | tuple[torch.Tensor, torch.Tensor]": (OutputForm.TENSOR_OR_PAIR, 1),
}


@functools.cache
def custom_ops_supported() -> bool:
    """Whether this torch can define custom ops from a schema and substitute them in graphs."""
    custom_op = getattr(torch.library, "custom_op", None)
    return (
        custom_op is not None
        and "schema" in inspect.signature(custom_op).parameters
        and hasattr(torch.compiler, "is_compiling")
        and hasattr(torch.compiler, "substitute_in_graph")
    )


@dataclass(frozen=True)
class GraphOp:
    """One standard op as a custom op: its schema, and how calls map onto it."""

    contract: OpContract
    spec: GraphSpec
    form: OutputForm
    outputs: int  # how many the op returns (TENSOR_OR_PAIR: counted as one)
    # The call parameters after ``obj``, and their defaults (``inspect.Parameter.empty``: none).
    parameters: tuple[str, ...]
    defaults: tuple[Any, ...]
    # A planned op's plan parameter (the last one): three custom-op arguments (see the module).
    plan: str | None = None
    # Positions of the ``str | bool | None`` call arguments (a bool crosses as a string).
    bool_or_str: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return self.contract.name

    @property
    def qualified_name(self) -> str:
        return f"{NAMESPACE}::{self.name}"

    @property
    def layer_names(self) -> tuple[str, ...]:
        fields = self.spec.layer_fields or ()
        return tuple(field.name for field in fields)

    def schema(self) -> str:
        """``(str impl, <layer attributes>, <call arguments>) -> <outputs>``, writes marked."""
        entries = ["str impl"]
        entries += [
            f"{field.type} {LAYER_PREFIX}{field.name}" for field in self.spec.layer_fields or ()
        ]
        aliases = itertools.count()
        for name in self.parameters:
            if name == self.plan:
                entries += [
                    f"str {name}_type",
                    f"Tensor?[] {name}_tensors",
                    f"Scalar[] {name}_values",
                ]
                continue
            annotation = self.contract.signature.parameters[name].annotation
            schema_type = _ARGUMENT_TYPES[annotation]
            if name in self.spec.mutates:
                optional = schema_type.endswith("?")
                schema_type = f"Tensor(a{next(aliases)}!)" + ("?" if optional else "")
            entries.append(f"{schema_type} {name}")
        fresh = self.outputs - len(self.spec.in_place_outputs)
        returns = "Tensor" if fresh == 1 else f"({', '.join(['Tensor'] * fresh)})"
        return f"({', '.join(entries)}) -> {returns}"

    @property
    def second_output_index(self) -> int:
        """Position, among the call arguments, of the one a TENSOR_OR_PAIR op writes into."""
        return self.parameters.index(self.spec.second_output_into or "")

    def layer_values(self, obj: Any) -> tuple[Any, ...]:
        """The declared attributes of the layer ``obj``, in schema order (an optional one the
        layer lacks: ``None``). A plain loop: dynamo resumes after a break in it, not in a
        generator."""
        values = []
        for field in self.spec.layer_fields or ():
            if field.optional:
                values.append(getattr(obj, field.name, None))
            else:
                values.append(getattr(obj, field.name))
        return tuple(values)

    def stand_in(self, values: Sequence[Any]) -> Any:
        """A layer carrying ``values`` as its declared attributes, an optional one only when it
        is not ``None`` (``None``: kernel function)."""
        if self.spec.layer_fields is None:
            return None
        attributes = {
            field.name: value
            for field, value in zip(self.spec.layer_fields, values, strict=True)
            if value is not None or not field.optional
        }
        return SimpleNamespace(**attributes)

    def arguments(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
        """Every call argument after ``obj``, positionally, defaults filled in."""
        if len(args) > len(self.parameters):
            raise TypeError(
                f"{self.name}: {len(args)} positional arguments after obj; the contract takes "
                f"{len(self.parameters)}: {', '.join(self.parameters)}"
            )
        unknown = set(kwargs) - set(self.parameters[len(args) :])
        if unknown:
            raise TypeError(
                f"{self.name}: unexpected or repeated keyword argument(s) {sorted(unknown)}; "
                f"parameters: {', '.join(self.parameters)}"
            )
        rest = []
        for name, default in zip(
            self.parameters[len(args) :], self.defaults[len(args) :], strict=True
        ):
            value = kwargs.get(name, default)
            if value is inspect.Parameter.empty:
                raise TypeError(f"{self.name}: missing argument {name!r}")
            rest.append(value)
        return (*args, *rest)

    def flatten(
        self, key: str, obj: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[Any, ...]:
        """The custom op's arguments for the call ``fn(obj, *args, **kwargs)``."""
        return (key, *self.layer_values(obj), *self.op_arguments(self.arguments(args, kwargs)))

    def op_arguments(self, arguments: tuple[Any, ...]) -> tuple[Any, ...]:
        """The call ``arguments`` as the custom op takes them: a plan split in three, a bool
        of a ``str | bool | None`` argument as a string."""
        if self.bool_or_str:
            arguments = tuple(
                _BOOL_AS_STR[value] if i in self.bool_or_str and isinstance(value, bool) else value
                for i, value in enumerate(arguments)
            )
        if self.plan is None:
            return arguments
        *rest, plan = arguments
        return (*rest, *_split_plan(plan))

    def pack(self, outputs: Any, arguments: tuple[Any, ...]) -> Any:
        """The custom op's outputs as the op returns them, given the call ``arguments``:
        the arguments written in place where the op returns them."""
        if self.form is OutputForm.TENSOR_OR_PAIR:
            second = arguments[self.second_output_index]
            return outputs if second is None else (outputs, second)
        if self.form is OutputForm.TENSOR:
            return outputs
        in_place = self.spec.in_place_outputs
        fresh = iter(_as_tuple(outputs, self.outputs - len(in_place)))
        return tuple(
            arguments[self.parameters.index(in_place[i])] if i in in_place else next(fresh)
            for i in range(self.outputs)
        )

    def unflatten(self, values: Sequence[Any]) -> tuple[Any, tuple[Any, ...]]:
        """``(stand-in layer, call arguments)`` from the custom op's arguments after ``impl``."""
        count = len(self.layer_names)
        arguments = tuple(values[count:])
        if self.bool_or_str:
            arguments = tuple(
                _STR_AS_BOOL.get(value, value) if i in self.bool_or_str else value
                for i, value in enumerate(arguments)
            )
        if self.plan is not None:
            *rest, name, tensors, plan_values = arguments
            layout = _plan_layouts_by_name[name]
            arguments = (*rest, layout.rebuild(tensors, plan_values))
        return self.stand_in(values[:count]), arguments

    def fresh_outputs(self, result: Any, values: Sequence[Any]) -> Any:
        """``result`` of ``fn`` as the custom op returns it; ``values``: its arguments.

        No output may alias an argument (a custom op's rule): an implementation that returns
        a tensor it wrote in place (``x``, ``query``) has it copied, which only happens while
        compiled code runs. A TENSOR_OR_PAIR op's second output lands in its argument.
        """
        if self.form is OutputForm.TUPLE:
            fresh = []
            for index, out in enumerate(result):
                name = self.spec.in_place_outputs.get(index)
                if name is None:
                    fresh.append(_fresh(out, values))
                    continue
                target = values[len(self.layer_names) + self.parameters.index(name)]
                if out is not target:
                    target.copy_(out)
            if not fresh:
                return None
            return fresh[0] if len(fresh) == 1 else tuple(fresh)
        if self.form is OutputForm.TENSOR_OR_PAIR and not isinstance(result, torch.Tensor):
            out, second = result
            out = _fresh(out, values)
            target = values[len(self.layer_names) + self.second_output_index]
            if second is not target:
                target.copy_(second)
            return out
        return _fresh(result, values)


def _as_tuple(outputs: Any, count: int) -> tuple[Any, ...]:
    """A custom op's fresh outputs as a tuple (one is returned bare, none as ``None``)."""
    if count == 0:
        return ()
    return (outputs,) if count == 1 else tuple(outputs)


def _fresh(output: torch.Tensor, values: Sequence[Any]) -> torch.Tensor:
    return output.clone() if _aliases(output, values) else output


def _aliases(output: torch.Tensor, inputs: Sequence[Any]) -> bool:
    """Whether ``output`` shares storage with one of ``inputs`` (real or fake tensors).

    ``torch._C._is_alias_of`` is the check torch's own custom-op tooling uses; unlike
    comparing ``data_ptr()``s it also holds for fake tensors, whose storages have none.
    """
    is_alias_of = torch._C._is_alias_of  # type: ignore[attr-defined]
    return any(isinstance(value, torch.Tensor) and is_alias_of(output, value) for value in inputs)


_lock = threading.Lock()


def _renew_lock_in_child() -> None:
    """A parent thread binding a layer at fork time holds ``_lock``: the child gets a new one
    (the tables it guards are complete entries only: each is filled under the lock at once)."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_lock_in_child)

_graph_ops: dict[str, GraphOp] = {}
# Calls of each custom op: eager calls never go through one (dynamo alone is told to trace
# it), so these are the calls compiled code made.
_calls: collections.Counter[str] = collections.Counter()
_impls: dict[str, Callable[..., Any]] = {}  # key -> implementation (kept alive: keys stay valid)
_keys: dict[int, str] = {}  # id(implementation) -> key


def _describe(contract: OpContract, spec: GraphSpec) -> GraphOp:
    annotation = contract.signature.return_annotation
    described = _OUTPUT_FORMS.get(annotation)
    if described is None:
        raise TypeError(
            f"{contract.name}: return annotation {annotation!r} has no custom-op output form; "
            f"known: {', '.join(_OUTPUT_FORMS)}"
        )
    form, outputs = described
    unknown = set(spec.in_place_outputs.values()) - set(spec.mutates)
    if unknown or (spec.in_place_outputs and form is not OutputForm.TUPLE):
        raise TypeError(
            f"{contract.name}: outputs written in place must be arguments the spec marks as "
            f"written ({sorted(unknown)} are not), of an op returning a tuple"
        )
    if (form is OutputForm.TENSOR_OR_PAIR) != (spec.second_output_into is not None):
        raise TypeError(
            f"{contract.name}: an op returning a tensor or a pair needs its GraphSpec to name "
            "second_output_into (the argument the second output is written into), and only it"
        )
    parameters = tuple(contract.parameter_names[1:])  # after obj
    plan = None
    if contract.plan_stage is not None:
        plan = parameters[-1]
        if contract.signature.parameters[plan].annotation != PLAN_ANNOTATION:
            raise TypeError(
                f"{contract.name}: a planned op's last parameter takes the plan, annotated "
                f"{PLAN_ANNOTATION!r}"
            )
    for name in parameters:
        if name == plan:
            continue
        annotation = contract.signature.parameters[name].annotation
        if annotation not in _ARGUMENT_TYPES:
            raise TypeError(
                f"{contract.name}: parameter {name!r} annotated {annotation!r} has no schema "
                f"type; known: {', '.join(_ARGUMENT_TYPES)}"
            )
    defaults = tuple(contract.signature.parameters[name].default for name in parameters)
    bool_or_str = tuple(
        i
        for i, name in enumerate(parameters)
        if contract.signature.parameters[name].annotation == "str | bool | None"
    )
    return GraphOp(contract, spec, form, outputs, parameters, defaults, plan, bool_or_str)


def _define(graph: GraphOp) -> None:
    """Define ``sglang_fl::<op>`` with its implementation and fake implementation."""

    name = graph.name

    def run(key: str, *values: Any) -> Any:
        _calls[name] += 1
        obj, args = graph.unflatten(values)
        return graph.fresh_outputs(_impls[key](obj, *args), values)

    def fake(key: str, *values: Any) -> Any:
        obj, args = graph.unflatten(values)
        compute = graph.spec.fake or graph.contract.reference
        return graph.fresh_outputs(compute(obj, *args), values)

    mutates = tuple(name for name in graph.parameters if name in graph.spec.mutates)
    op = torch.library.custom_op(
        graph.qualified_name, run, mutates_args=mutates, schema=graph.schema()
    )
    op.register_fake(fake)


def graph_op(op_name: str) -> GraphOp:
    """The custom op of ``op_name``, defined on first use (once per process)."""
    graph = _graph_ops.get(op_name)
    if graph is not None:
        return graph
    with _lock:
        graph = _graph_ops.get(op_name)
        if graph is None:
            contract = get_contract(op_name)
            spec = GRAPH_SPECS.get(op_name)
            if spec is None and contract.collective is not None:
                raise KeyError(
                    f"op {op_name!r} is a collective: sglang-fl defines no custom op for it "
                    "(the engine's own collective custom ops stay around the routed method)"
                )
            if spec is None:
                raise KeyError(f"op {op_name!r} has no graph spec in sglang_fl.ops.graph_spec")
            graph = _describe(contract, spec)
            _define(graph)
            _graph_ops[op_name] = graph
        return graph


def compiled_calls() -> dict[str, int]:
    """How many times compiled code has called each ``sglang_fl::<op>`` in this process."""
    return dict(_calls)


def register_impl(op_name: str, impl_id: str, fn: Callable[..., Any]) -> str:
    """The key under which ``sglang_fl::<op_name>`` runs ``fn`` (one key per ``fn`` object);
    defines the op if needed."""
    graph_op(op_name)
    with _lock:
        key = _keys.get(id(fn))
        if key is None:
            key = f"{op_name}:{impl_id}#{len(_keys)}"
            _keys[id(fn)] = key
            _impls[key] = fn
        return key


def graph_safe(
    op_name: str,
    fn: Callable[..., Any],
    impl_id: str,
    *,
    enabled: bool = True,
    traceable: bool = False,
) -> Callable[..., Any]:
    """``fn`` (the implementation chosen for ``op_name``), reachable under ``torch.compile``.

    Returns ``fn`` itself when ``enabled`` is false or this torch lacks custom ops. A
    ``traceable`` ``fn`` (:attr:`~sglang_fl.dispatch.types.OpImpl.traceable`: plain PyTorch
    that inductor compiles as it runs eagerly) is returned as it is too, for dynamo to trace
    into the compiled graph, where inductor fuses it with the code around it; its tracing is
    observed (:func:`traced_ops`). Otherwise dynamo is told to trace, in place of ``fn``, a
    call of ``sglang_fl::<op_name>`` that runs ``fn`` when the compiled code runs
    (``torch.compiler.substitute_in_graph``), and ``fn`` itself is returned: eager calls cost
    exactly what they cost without custom ops. An ``fn`` that cannot be substituted (not a
    plain function, or already standing for another op) is returned wrapped: eager calls then
    pass one frame and ``is_compiling()`` on their way.
    """
    if not enabled or not custom_ops_supported():
        return fn
    if traceable and isinstance(fn, types.FunctionType):
        with _lock:
            if id(fn) not in _substituted:  # else dynamo already traces it as a custom op
                _traced_code[fn.__code__] = op_name
                return fn
    key = register_impl(op_name, impl_id, fn)

    def through_custom_op(obj: Any, *args: Any, **kwargs: Any) -> Any:
        # Closes over strings only: dynamo traces a substitute without sources for its
        # closure, so the op's description is read from this module's table.
        graph = _graph_ops[op_name]
        arguments = graph.arguments(args, kwargs)
        op = getattr(getattr(torch.ops, NAMESPACE), op_name).default
        outputs = op(key, *graph.layer_values(obj), *graph.op_arguments(arguments))
        return graph.pack(outputs, arguments)

    if _substitute(op_name, fn, through_custom_op):
        return fn
    is_compiling = torch.compiler.is_compiling

    def wrapped(obj: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_compiling():
            return fn(obj, *args, **kwargs)
        return through_custom_op(obj, *args, **kwargs)

    wrapped.__name__ = wrapped.__qualname__ = f"{op_name}[{impl_id}]"
    wrapped.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapped


_substituted: dict[int, str] = {}  # id(implementation) -> the op dynamo traces it as
# The code of each traceable implementation bound -> its op: how a compiled graph's traced
# code (``torch._guards.TracingContext.traced_code``) names the routed ops inlined in it.
_traced_code: dict[types.CodeType, str] = {}


def traced_ops(codes: Iterable[types.CodeType]) -> set[str]:
    """The routed ops whose traceable implementation (bound by :func:`graph_safe`) is among
    ``codes``, the code objects dynamo traced into a graph."""
    return {_traced_code[code] for code in codes if code in _traced_code}


def _substitute(op_name: str, fn: Callable[..., Any], traceable: Callable[..., Any]) -> bool:
    """Have dynamo trace ``traceable`` wherever it meets ``fn``; whether ``fn`` stands for
    ``op_name`` now (once per function object and process)."""
    with _lock:
        if id(fn) in _substituted:
            return _substituted[id(fn)] == op_name
        if not isinstance(fn, types.FunctionType):
            return False
        try:
            torch.compiler.substitute_in_graph(fn, skip_signature_check=True)(traceable)
        except ValueError as exc:  # dynamo already has a rule for fn: wrap it instead
            _log.debug("%s: %s; binding a wrapper", op_name, exc)
            return False
        _substituted[id(fn)] = op_name
        return True
