"""The typed registration objects every backend hands to the registry."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .._strenum import StrEnum

__all__ = [
    "Availability",
    "BackendImplKind",
    "BackendPriority",
    "OpImpl",
    "PreparedKernel",
    "Provenance",
]


class BackendImplKind(StrEnum):
    """What family an implementation belongs to.

    The values are the selection-order tokens of the families, and the declaration order is the
    default order (``flagos, vendor, reference``).
    """

    DEFAULT = "flagos"
    VENDOR = "vendor"
    REFERENCE = "reference"


class BackendPriority(enum.IntEnum):
    """Default priorities; higher wins among candidates the policy ranks equally."""

    DEFAULT = 150
    VENDOR = 100
    REFERENCE = 50


@dataclass(frozen=True)
class Provenance:
    """Where a registration came from: the plugin (entry-point name) and its distribution."""

    plugin: str
    distribution: str
    version: str

    def __str__(self) -> str:
        return f"{self.plugin} ({self.distribution} {self.version})"


@dataclass(frozen=True)
class Availability:
    """Outcome of an availability probe, with the reason a user sees in ``sglang-fl explain``."""

    available: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.available


@dataclass(frozen=True)
class OpImpl:
    """One implementation of one operator, as a backend registers it.

    ``fn`` takes the op's standard arguments (see :mod:`sglang_fl.ops`). If ``fn`` carries an
    ``_is_available`` attribute (the seed layout), or ``available`` is given, that no-argument
    callable returning ``bool`` or :class:`Availability` is probed lazily, at most once per
    process; a plain ``True``/``False`` there is a fixed answer (``False``: never chosen).
    ``priority`` defaults to the kind's :class:`BackendPriority` (a vendor implementation that
    gives none gets ``VENDOR``, not ``DEFAULT``). ``planner`` is for the planned ops
    (``decode_attention``, ``extend_attention``): an
    :class:`~sglang_fl.ops.attention.plan.AttentionPlanner` that plans each forward for ``fn``
    (``None``: the default plan; the registry fills it in). ``graph_problems`` maps each graph
    mode ``fn`` cannot run under (``"captured"``: CUDA/NPU graphs; ``"compiled"``:
    torch.compile) to the reason, e.g. a kernel that reads a device value on the host (a planned
    op's planner answers for its calls too); a graph runner is refused, before capture, when a
    chosen implementation declares its mode. ``traceable`` says that ``fn`` is plain PyTorch
    that dynamo traces whole and that inductor's code for it rounds as eager does (elementwise
    maps and copies, no reduction, no host read): under ``torch.compile`` it is then traced
    into the compiled step, where inductor fuses it with its neighbours, instead of running
    behind the op's opaque custom op (what an untraceable kernel needs, and what every
    implementation gets by default). ``provenance`` is filled in by the loader; a backend
    never sets it.

    ``prepare`` (ops whose contract has ``weights``, the quantized ones): called once per layer
    when its weights are final, ``prepare(obj, *weights)`` with the weights in the contract's
    (checkpoint) layout, it returns a tuple of as many values, the layout ``fn`` wants (a
    transposed view, a repacked tensor, a device format); each call of ``fn`` then receives
    those in the weights' places. It must not write the weights it is given (a fallback reads
    them) and may raise :class:`~sglang_fl.Unsupported` for a layer it cannot serve. Without
    one, ``fn`` receives the checkpoint layout.
    """

    op_name: str
    impl_id: str
    kind: BackendImplKind
    fn: Callable[..., Any]
    vendor: str | None = None
    priority: int = None  # type: ignore[assignment]  # set from ``kind`` in __post_init__
    available: Callable[[], object] | bool | None = field(default=None, compare=False)
    provenance: Provenance | None = field(default=None, compare=False)
    prepare: Callable[..., tuple[Any, ...]] | None = field(default=None, compare=False)
    planner: Any = field(default=None, compare=False)
    graph_problems: Mapping[str, str] | None = field(default=None, compare=False)
    traceable: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        given: object = self.priority  # None when the author left it out
        if given is None and isinstance(self.kind, BackendImplKind):
            object.__setattr__(self, "priority", BackendPriority[self.kind.name])

    @property
    def availability_probe(self) -> Callable[[], object] | bool | None:
        """``available`` if given, else ``fn._is_available``; a bool is a fixed answer."""
        probe = self.available
        if probe is None:
            probe = getattr(self.fn, "_is_available", None)
        return probe if isinstance(probe, bool) or callable(probe) else None

    def graph_problem(self, mode: str) -> str | None:
        """Why this implementation cannot run under graph mode ``mode``, or ``None``: what it
        declares (``graph_problems``), else what its planner says (a planned op)."""
        declared = (self.graph_problems or {}).get(str(mode))
        if declared is not None:
            return declared
        ask = getattr(self.planner, "graph_problem", None)
        answer = ask(mode) if ask is not None else None
        return None if answer is None else str(answer)

    def with_provenance(self, provenance: Provenance) -> OpImpl:
        return replace(self, provenance=provenance)


@dataclass(frozen=True)
class PreparedKernel:
    """A kernel adapter with its weight-preparation step (see :attr:`OpImpl.prepare`), as a
    value of :meth:`Backend.implementations`' ``{op: adapter}`` mapping."""

    fn: Callable[..., Any]
    prepare: Callable[..., tuple[Any, ...]]
