"""SGLang's per-step bookkeeping objects made traceable by ``torch.compile``, for its graph runner.

SGLang 0.5.23's layer boundaries (``layers/layer_boundary``, the residual stream every model's
decoder layer goes through) build two ``msgspec.Struct`` objects per layer and step:
``residual.stream.Contribution`` (a producer's output awaiting the next residual update, also
released by assigning its fields) and ``exit.ExitDecision`` (an FFN output's completion). Dynamo
cannot construct a ``msgspec.Struct`` (its ``__new__`` is C code: "Unsupported object.__new__
user-defined class construction") nor assign to one, so each construction is a graph break:
the compiled decode step falls apart into one graph per piece between them, every decoder
layer's resumed frame is compiled again per layer (its guards name the layer's own
parameters), and the step runs slower than eager.

Both classes are used only inside their own modules (constructed by name, read by attribute,
compared by identity), so :func:`make_traceable` rebinds each module's name to a plain Python
class with the same fields (in ``__slots__``), defaults, methods and properties. Behaviour is
SGLang's own; only the type differs. It runs when sglang-fl's graph runner is built (in the
process that serves the model, before anything is compiled) and is reported on the
``graph_capture`` record. A class that is not the struct this was written against (a different
SGLang) is left alone, with the reason.
"""

from __future__ import annotations

import importlib
import threading
import types
from dataclasses import dataclass
from typing import Any

__all__ = ["TRACEABLE_STRUCTS", "Rebound", "make_traceable", "plain_class"]

# (module, class name, fields as SGLang 0.5.23 declares them)
TRACEABLE_STRUCTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "sglang.srt.layers.layer_boundary.residual.stream",
        "Contribution",
        ("value", "update", "owed"),
    ),
    (
        "sglang.srt.layers.layer_boundary.exit",
        "ExitDecision",
        ("defer_moe_finalize", "sum_in_reduce_scatter", "complete"),
    ),
)

_MEMBERS = (types.FunctionType, property, staticmethod, classmethod)


def plain_class(struct: type) -> type:
    """A plain Python class standing for the ``msgspec.Struct`` class ``struct``: the same
    name, fields (``__slots__``, positional or keyword, with the same defaults), methods,
    properties and ``__post_init__``; field-wise ``==``, and ``hash`` for a frozen struct, as
    msgspec's. A frozen struct's fields are not write-protected (SGLang never writes them)."""
    fields: tuple[str, ...] = tuple(struct.__struct_fields__)  # type: ignore[attr-defined]
    defaults: tuple[Any, ...] = tuple(struct.__struct_defaults__)  # type: ignore[attr-defined]
    frozen = bool(struct.__struct_config__.frozen)  # type: ignore[attr-defined]
    required = len(fields) - len(defaults)
    parameters = [
        name if index < required else f"{name}=_default_{index - required}"
        for index, name in enumerate(fields)
    ]
    body = "".join(f"\n    self.{name} = {name}" for name in fields)
    if hasattr(struct, "__post_init__"):
        body += "\n    self.__post_init__()"
    namespace: dict[str, Any] = {f"_default_{i}": value for i, value in enumerate(defaults)}
    source = f"def __init__(self, {', '.join(parameters)}):{body or chr(10) + '    pass'}"
    exec(source, namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{struct.__qualname__}.__init__"

    def __repr__(self: Any) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in fields)
        return f"{type(self).__name__}({shown})"

    def __eq__(self: Any, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in fields)

    members: dict[str, Any] = {
        "__slots__": fields,
        "__struct_fields__": fields,
        "__module__": struct.__module__,
        "__qualname__": struct.__qualname__,
        "__doc__": struct.__doc__,
        "__init__": init,
        "__repr__": __repr__,
        "__eq__": __eq__,
        "__hash__": (lambda self: hash(tuple(getattr(self, n) for n in fields)))
        if frozen
        else None,
    }
    for klass in reversed(struct.__mro__[:-1]):
        for name, member in vars(klass).items():
            if isinstance(member, _MEMBERS) and (
                not name.startswith("__") or name == "__post_init__"
            ):
                members[name] = member
    return type(struct.__name__, (), members)


def _hash(fields: tuple[str, ...]) -> Any:
    def __hash__(self: Any) -> int:
        return hash(tuple(getattr(self, name) for name in fields))

    return __hash__


@dataclass(frozen=True)
class Rebound:
    """One struct :func:`make_traceable` considered: what it did, or why not."""

    name: str  # module.Class
    rebound: bool
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "rebound": self.rebound, "reason": self.reason}


_lock = threading.Lock()
_done: tuple[Rebound, ...] | None = None


def make_traceable() -> tuple[Rebound, ...]:
    """Rebind :data:`TRACEABLE_STRUCTS` in their modules to plain classes (once per process;
    later calls return the first call's outcome)."""
    global _done
    with _lock:
        if _done is None:
            _done = tuple(_rebind(*entry) for entry in TRACEABLE_STRUCTS)
        return _done


def _rebind(module_name: str, class_name: str, fields: tuple[str, ...]) -> Rebound:
    name = f"{module_name}.{class_name}"
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        return Rebound(name, False, f"not importable: {exc}")
    struct = getattr(module, class_name, None)
    declared = getattr(struct, "__struct_fields__", None)
    if not (isinstance(struct, type) and hasattr(struct, "__struct_config__") and declared):
        return Rebound(name, False, f"not a msgspec.Struct here: {struct!r}")
    if tuple(declared) != fields:
        return Rebound(name, False, f"fields {tuple(declared)} are not the expected {fields}")
    setattr(module, class_name, plain_class(struct))
    return Rebound(name, True)
