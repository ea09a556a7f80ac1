"""The one description of an operator that the registry, the conformance kit and the docs read."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from ..schema import ContractJson, InPlaceJson

__all__ = [
    "Collective",
    "OpCase",
    "OpContract",
    "OpInputs",
    "PlanStage",
    "Rule",
    "Tolerance",
    "binding_problem",
]


@dataclass(frozen=True)
class Tolerance:
    """Allowed deviation from the reference: ``|got - want| <= atol + rtol * |want|``."""

    atol: float
    rtol: float


@dataclass(frozen=True)
class Rule:
    """A rule of an op's math that the signature cannot show (a mask, a cap, a scale), written
    as a formula over the call's arguments and the layer's attributes."""

    name: str
    formula: str


@dataclass(frozen=True)
class OpCase:
    """One point of an op's test space (shapes and flags), named for failure messages."""

    name: str
    params: Mapping[str, Any]


@dataclass
class OpInputs:
    """Materialised inputs of one case: the layer stand-in and the call's arguments."""

    obj: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    # Argument names whose tensors the contract says must not change.
    preserved: tuple[str, ...] = ()
    # Output index -> argument name whose storage the contract says holds that output.
    written_in_place: Mapping[int, str] = field(default_factory=dict)
    # A planned op's batch description (:class:`~sglang_fl.ops.attention.plan.AttentionBatch`):
    # what each implementation's planner plans from; ``args`` carry the reference's plan.
    batch: Any = None

    def argument(self, name: str, signature: inspect.Signature) -> Any:
        """The value passed for parameter ``name`` (positional or keyword)."""
        bound = signature.bind(self.obj, *self.args, **self.kwargs)
        bound.apply_defaults()
        return bound.arguments[name]


def axis(name: str, values: Sequence[Any]) -> tuple[dict[str, Any], ...]:
    """One parameter of a :func:`case_grid` taking each of ``values``."""
    return tuple({name: value} for value in values)


def case_grid(
    name: Callable[[Mapping[str, Any]], str], *axes: Sequence[Mapping[str, Any]]
) -> tuple[OpCase, ...]:
    """One case per combination of one entry of each axis, in ``itertools.product`` order.

    An axis is a sequence of parameter mappings: :func:`axis` for one parameter, or explicit
    mappings for parameters that vary together (query and key heads). A case's params are its
    entries merged; ``name(params)`` names it.
    """
    cases = []
    for entries in itertools.product(*axes):
        params = {key: value for entry in entries for key, value in entry.items()}
        cases.append(OpCase(name(params), params))
    return tuple(cases)


def same_output(output: Any) -> Any:
    """The default :attr:`OpContract.canonical_output`: outputs compare as they are."""
    return output


def layer(**attributes: Any) -> SimpleNamespace:
    """A stand-in for an SGLang layer: only the attributes the op contract reads."""
    return SimpleNamespace(**attributes)


# A rank's inputs: (case, dtype, device, rank, world_size) -> OpInputs. Seeded from the case
# and the rank alone, so every rank can rebuild every other rank's inputs.
RankInputs = Callable[[OpCase, torch.dtype, torch.device, int, int], OpInputs]
# What rank ``rank`` must hold after the call, computed from every rank's inputs alone (no
# communication): (case, inputs of ranks 0..n-1, rank) -> output; ``None`` for no output.
Expected = Callable[[OpCase, Sequence[OpInputs], int], Any]
# Runs one case on one rank: (implementations by op name, group, case, this rank's inputs) ->
# output. Most collectives call their own op; a point-to-point pair calls both halves.
CaseRunner = Callable[[Mapping[str, Callable[..., Any]], Any, OpCase, OpInputs], Any]


@dataclass(frozen=True)
class Collective:
    """What makes an op a collective: every rank of a group calls it at once.

    A collective's case cannot run in one process: the kit
    (:func:`sglang_fl.testing.collectives.run_collective_checks`) starts ``world_size``
    processes for each of ``world_sizes``, joins them in one gloo group, builds each rank's
    inputs with ``rank_inputs``, runs the case through ``run`` and compares each rank's output
    with ``expected``. ``peers`` are the ops a case also calls (``send`` needs ``recv``); the
    kit checks them as one unit with the same vendor's implementations.
    """

    world_sizes: tuple[int, ...]
    rank_inputs: RankInputs
    expected: Expected
    run: CaseRunner
    peers: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlanStage:
    """A planned op's plan stage (:mod:`sglang_fl.ops.attention.plan`): once per forward, each
    implementation's planner (``OpImpl.planner``, else ``default_planner``) plans the batch;
    the op's last parameter takes that plan.

    ``kind`` is the :class:`~sglang_fl.ops.attention.plan.ForwardKind` the op serves;
    ``reference_planner`` plans for the contract's reference; ``adapt_legacy`` wraps an
    implementation written for the op's signature before plans (``None`` when ``fn`` does not
    take that one either), which then gets ``legacy_planner``.
    """

    kind: Any
    reference_planner: Any
    default_planner: Any
    legacy_planner: Any
    adapt_legacy: Callable[[Callable[..., Any]], Callable[..., Any] | None]


@dataclass(frozen=True)
class OpContract:
    """Everything sglang-fl knows about one standard operator.

    ``signature`` is what every implementation must accept positionally (the bridges call it
    that way); ``details`` is the contract in words (shapes, dtypes, what the layer carries,
    what may be written), ``rules`` the math the signature cannot show, as formulas;
    ``reference`` is the pure-PyTorch implementation whose numerics every backend is checked
    against; ``cases`` and ``make_inputs`` span the shapes and flags an implementation must
    handle, for every dtype in ``dtypes``, within ``tolerances``. :meth:`describe` gathers it
    all for ``sglang-fl explain OP`` and the API pages.
    """

    name: str
    sglang_layer: str
    summary: str
    signature: inspect.Signature
    reference: Callable[..., Any]
    dtypes: tuple[torch.dtype, ...]
    tolerances: Mapping[torch.dtype, Tolerance]
    cases: tuple[OpCase, ...]
    make_inputs: Callable[[OpCase, torch.dtype, torch.device, torch.Generator], OpInputs]
    # Puts an output in the form it is compared in, where the contract leaves something open
    # (e.g. the order of the experts in a top-k row); identity for most ops.
    canonical_output: Callable[[Any], Any] = same_output
    # Set for collectives (``all_reduce``, ...): their cases run on several ranks at once, and
    # ``make_inputs`` gives rank 0's inputs of a case's smallest world (for single-process
    # inspection: shapes, dtypes); ``obj`` is then a group stand-in, not a real group.
    collective: Collective | None = None
    # The docstring of the standard call (``inspect.getdoc`` of the function the signature
    # comes from): shapes, dtypes, the layer's attributes, the in-place rules, in words.
    details: str = ""
    rules: tuple[Rule, ...] = ()

    # The parameters holding a layer's weights (quantized ops): fixed from load on, so an
    # implementation may prepare its own layout of them once (``OpImpl.prepare``) and then
    # receives what it prepared in their place; the contract describes the checkpoint layout.
    weights: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = [name for name in self.weights if name not in self.signature.parameters]
        if unknown:
            raise ValueError(f"op {self.name!r}: weights {unknown} are not parameters")

    # Set for planned ops (the attention ops): their per-forward plan stage.
    plan_stage: PlanStage | None = None
    # Graph modes (``"captured"``, ``"compiled"``) the reference cannot run under, and why:
    # its ``OpImpl.graph_problems`` (a reference reading values on the host cannot be captured).
    reference_graph_problems: Mapping[str, str] = field(default_factory=dict)
    # The reference is an elementwise map or a copy that dynamo traces whole, rounding under
    # inductor as eagerly: its ``OpImpl.traceable`` (traced into a compiled step, not called
    # behind the custom op). Not a reduction: inductor sums in another order than eager.
    reference_traceable: bool = False

    @property
    def parameter_names(self) -> tuple[str, ...]:
        return tuple(self.signature.parameters)

    def weight_positions(self) -> tuple[int, ...]:
        """Where the :attr:`weights` sit in a call's positional arguments (after ``obj``)."""
        names = self.parameter_names[1:]
        return tuple(names.index(name) for name in self.weights)

    @property
    def required_parameters(self) -> tuple[str, ...]:
        return tuple(
            name
            for name, param in self.signature.parameters.items()
            if param.default is inspect.Parameter.empty
        )

    def signature_text(self) -> str:
        """``rms_norm(obj, x, residual=None)``: the contract without annotations."""
        plain = self.signature.replace(
            parameters=[
                p.replace(annotation=inspect.Parameter.empty)
                for p in self.signature.parameters.values()
            ],
            return_annotation=inspect.Signature.empty,
        )
        return f"{self.name}{plain}"

    def signature_problem(self, fn: Callable[..., Any]) -> str | None:
        """Why ``fn`` cannot take this op's standard arguments, or ``None`` if it can.

        Every parameter of the contract is passed positionally by the bridges; the conformance
        kit also passes the optional ones by keyword, so names must match too.
        """
        return binding_problem(self.signature, fn)

    def describe(self) -> ContractJson:
        """The whole contract as data, for ``sglang-fl explain OP`` and the API pages.

        The in-place rules and the layer attributes are read from the cases' own inputs (what
        the kit checks), so they cannot drift from the cases; building them costs a few
        milliseconds per case.
        """
        in_place: dict[str, InPlaceJson] = {
            name: {"argument": name, "untouched": 0, "written": 0, "outputs": []}
            for name in self.parameter_names[1:]
        }
        attributes: dict[str, None] = {}
        generator = torch.Generator().manual_seed(0)
        for case in self.cases:
            inputs = self.make_inputs(case, self.dtypes[0], torch.device("cpu"), generator)
            if isinstance(inputs.obj, SimpleNamespace):
                attributes.update(dict.fromkeys(vars(inputs.obj)))
            # A pair's inputs (``recv`` runs ``send``'s cases) may name the peer's arguments.
            for name in inputs.preserved:
                if name in in_place:
                    in_place[name]["untouched"] += 1
            for output, name in inputs.written_in_place.items():
                if name in in_place:
                    entry = in_place[name]
                    entry["written"] += 1
                    if output not in entry["outputs"]:
                        entry["outputs"].append(output)
        collective = self.collective
        runs = len(collective.world_sizes) if collective is not None else 1
        return {
            "op": self.name,
            "summary": self.summary,
            "signature": self.signature_text(),
            "sglang_layer": self.sglang_layer,
            "details": self.details,
            "rules": [{"name": rule.name, "formula": rule.formula} for rule in self.rules],
            "layer_attributes": list(attributes),
            "dtypes": [_dtype_name(dtype) for dtype in self.dtypes],
            "tolerances": [
                {"dtype": _dtype_name(dtype), "atol": tol.atol, "rtol": tol.rtol}
                for dtype, tol in self.tolerances.items()
            ],
            "in_place": [e for e in in_place.values() if e["untouched"] or e["written"]],
            "cases": [case.name for case in self.cases],
            "checks": len(self.cases) * len(self.dtypes) * runs,
            "world_sizes": list(collective.world_sizes) if collective is not None else None,
            "peers": list(collective.peers) if collective is not None else [],
        }

    def tolerance(self, dtype: torch.dtype) -> Tolerance:
        try:
            return self.tolerances[dtype]
        except KeyError:
            allowed = ", ".join(str(d) for d in self.tolerances)
            raise ValueError(
                f"op {self.name!r} has no tolerance for dtype {dtype}; contract dtypes: {allowed}"
            ) from None


def _dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32``: the name users pass and the kit's test ids show."""
    return str(dtype).removeprefix("torch.")


def binding_problem(signature: inspect.Signature, fn: Callable[..., Any]) -> str | None:
    """Why ``fn`` cannot be called as ``signature`` says (every parameter positionally, the
    optional ones also by name), or ``None`` if it can."""
    try:
        own = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        return f"its signature cannot be inspected ({exc})"
    names = tuple(signature.parameters)
    required = [n for n, p in signature.parameters.items() if p.default is inspect.Parameter.empty]
    placeholders = [object()] * len(names)
    try:
        own.bind(*placeholders)
    except TypeError as exc:
        return f"it cannot be called with {len(placeholders)} positional arguments ({exc})"
    optional = {name: object() for name in names if name not in required}
    try:
        own.bind(*placeholders[: len(required)], **optional)
    except TypeError as exc:
        return f"its optional parameters are not named as in the contract ({exc})"
    return None


STANDARD_TOLERANCES: Mapping[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(atol=1e-5, rtol=1e-5),
    torch.float16: Tolerance(atol=1e-3, rtol=1e-3),
    torch.bfloat16: Tolerance(atol=1.6e-2, rtol=1.6e-2),
}
STANDARD_DTYPES: tuple[torch.dtype, ...] = tuple(STANDARD_TOLERANCES)

# Token counts the newer contracts cover: an empty batch (a decode step with no request of this
# kind, a rank without tokens), one token (decode), and a few odd-sized prefills.
TOKEN_COUNTS: tuple[int, ...] = (0, 1, 7, 33)


def random_tensor(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    generator: torch.Generator,
    *,
    contiguous: bool = True,
) -> torch.Tensor:
    """A seeded normal tensor; ``contiguous=False`` gives a strided view of a wider buffer."""
    if contiguous:
        return torch.randn(shape, generator=generator, dtype=torch.float32).to(device, dtype)
    wide = (*shape[:-1], shape[-1] * 2)
    buffer = torch.randn(wide, generator=generator, dtype=torch.float32).to(device, dtype)
    return buffer[..., ::2]
