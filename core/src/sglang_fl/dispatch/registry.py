"""The registry of operator implementations, filled by plugins through their hooks."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .._strenum import StrEnum
from ..errors import RegistrationError, UnknownOpError
from ..guard import capped, plain_str, plugin_text, safe_repr
from ..ops import STANDARD_OPS, OpContract, unknown_op_message
from ..ops.attention.plan import AttentionPlanner, GraphMode
from .identity import DIRECT_PLUGIN, identity_problem, is_core_reference
from .types import BackendImplKind, BackendPriority, OpImpl, Provenance

__all__ = [
    "DIRECT_PROVENANCE",
    "NAME_LIMIT",
    "NoKernel",
    "OpRegistry",
    "RegistryState",
    "available_problem",
    "offered_candidate",
    "priority_problem",
]

# The longest impl_id or vendor name a registration may carry: they are shown in every report
# and log line, and compared (a name is no place for a plugin's megabytes).
NAME_LIMIT = 200

# Provenance of registrations made outside a plugin load (a test, an interactive session).
DIRECT_PROVENANCE = Provenance(plugin=DIRECT_PLUGIN, distribution="<none>", version="")


@dataclass(frozen=True)
class NoKernel:
    """A plugin's statement that it has no kernel for an op, and why (``sglang-fl ops`` shows
    it, so a user sees why a vendor is absent from an op's candidates)."""

    op_name: str
    reason: str
    provenance: Provenance


class RegistryState(StrEnum):
    """Who may register: anyone (a test's own registry), one plugin scope at a time, nobody."""

    OPEN = "open"  # direct registrations get DIRECT_PROVENANCE; scopes may open
    LOADING = "loading"  # the loader runs: only the open scope's own thread registers
    SEALED = "sealed"  # loading finished: every registration and scope is refused


@dataclass
class _Scope:
    """One plugin's open registration scope: who, from which thread, and what it staged."""

    provenance: Provenance
    thread: int  # the thread running the plugin's hook: the only one whose registrations count
    threads_before: frozenset[int]  # threads alive when it opened (not started by the plugin)
    staged: list[OpImpl] = field(default_factory=list)
    staged_no_kernel: list[NoKernel] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)


class OpRegistry:
    """Implementations per op, each stamped with the provenance of the plugin that added it.

    A plugin's registrations are staged inside :meth:`plugin_scope` and kept only if the whole
    hook succeeds and no registration was refused: a failing plugin leaves nothing behind.
    Provenance comes from the scope alone (what a plugin puts in ``OpImpl.provenance`` is
    replaced). While the loader runs (:meth:`begin_loading`) only the thread that opened the
    current scope may register; once loading ends (:meth:`seal`) nobody may.
    """

    def __init__(self) -> None:
        self._impls: dict[str, list[OpImpl]] = {name: [] for name in STANDARD_OPS}
        self._owners: dict[str, Provenance] = {}
        self._lock = threading.RLock()
        self._state = RegistryState.OPEN
        self._scope: _Scope | None = None
        self._committed_plugins: set[str] = set()
        self._loader_key: object | None = None
        self._no_kernel: dict[str, list[NoKernel]] = {name: [] for name in STANDARD_OPS}

    # -- plugin-facing API --------------------------------------------------------------------

    def register(self, impl: OpImpl) -> None:
        """Add one implementation; raises :class:`RegistrationError` naming what is wrong.

        Everything that reads the plugin's objects (its fields, ``inspect.signature`` of its
        ``fn``, which may be a lazy proxy) runs *before* the registry lock is taken: plugin code
        that blocks there blocks only its own hook, which the loader abandons after
        ``SGLANG_FL_PLUGIN_TIMEOUT`` (:meth:`abandon_scope` takes the lock). What is kept is a
        fresh :class:`OpImpl` of exact ``str``/``int``/enum values, not the plugin's object.
        """
        with self._lock:
            scope = self._caller_scope("registered an implementation")
        provenance = DIRECT_PROVENANCE if scope is None else scope.provenance
        try:
            clean = _normalised(impl, provenance)  # plugin code: no lock held
        except RegistrationError as exc:
            self._refuse_in(scope, str(exc))
            raise
        with self._lock:
            if scope is None:  # still a direct registration: loading may have begun meanwhile
                self._caller_scope("registered an implementation")
            elif self._scope is not scope:
                raise RegistrationError(
                    f"plugin {provenance.plugin!r} registered {clean.impl_id!r} after its "
                    "registration scope was closed (its hook did not return in time)"
                )
            try:
                self._validate_against_others(clean, provenance, scope)
            except RegistrationError as exc:
                if scope is not None:
                    scope.refusals.append(str(exc))
                raise
            stamped = clean.with_provenance(provenance)
            if scope is None:
                self._commit([stamped])
            else:
                scope.staged.append(stamped)

    def _refuse_in(self, scope: _Scope | None, problem: str) -> None:
        if scope is not None:
            with self._lock:
                scope.refusals.append(problem)

    def register_many(self, impls: Iterable[OpImpl]) -> None:
        """Add several implementations; the first refusal raises (and fails a plugin scope)."""
        for impl in impls:
            self.register(impl)

    def declare_no_kernel(self, op_name: str, reason: str) -> None:
        """Say why this plugin registers nothing for ``op_name``; staged like a registration."""
        with self._lock:
            scope = self._caller_scope(f"declared no kernel for {safe_repr(op_name)}")
        provenance = DIRECT_PROVENANCE if scope is None else scope.provenance
        who = f"plugin {provenance.plugin!r} ({provenance.distribution})"
        name, text = plain_str(op_name), plugin_text(reason)
        problem = None
        if name is None or name not in STANDARD_OPS:
            problem = (
                f"{who} declared no kernel for {unknown_op_message(name or safe_repr(op_name))}"
            )
        elif text is None or not text.strip():
            problem = f"{who} declared no kernel for {name!r} without a reason"
        if problem is not None:
            self._refuse_in(scope, problem)  # fails the plugin even if it is caught
            raise RegistrationError(problem)
        assert name is not None
        assert text is not None
        gap = NoKernel(name, text, provenance)
        with self._lock:
            if scope is None:
                self._no_kernel[name].append(gap)
            elif self._scope is scope:
                scope.staged_no_kernel.append(gap)

    # -- queries ------------------------------------------------------------------------------

    def implementations(self, op_name: str) -> tuple[OpImpl, ...]:
        """Every committed implementation of ``op_name``, in registration order.

        An op that is not a standard op raises :class:`~sglang_fl.errors.UnknownOpError`.
        """
        with self._lock:
            if op_name not in self._impls:
                raise UnknownOpError(unknown_op_message(op_name))
            return tuple(self._impls[op_name])

    def no_kernel(self, op_name: str) -> tuple[NoKernel, ...]:
        """The plugins' statements that they have no kernel for ``op_name``."""
        with self._lock:
            if op_name not in self._no_kernel:
                raise KeyError(unknown_op_message(op_name))
            return tuple(self._no_kernel[op_name])

    def ops(self) -> tuple[str, ...]:
        return tuple(self._impls)

    def owner(self, impl_id: str) -> Provenance | None:
        """The provenance of the plugin that owns ``impl_id``, if any."""
        with self._lock:
            return self._owners.get(impl_id)

    @property
    def state(self) -> RegistryState:
        return self._state

    def __repr__(self) -> str:
        count = sum(len(impls) for impls in self._impls.values())
        return f"<OpRegistry ({self._state}): {len(self._impls)} ops, {count} implementations>"

    # -- loader-facing API --------------------------------------------------------------------

    def begin_loading(self) -> object:
        """From now on, registrations are accepted only inside a plugin scope, from its thread.

        Returns the key the loader passes to :meth:`plugin_scope`: while loading, only the
        holder of this key opens scopes, so the provenance of every registration is the
        loader's, never one a plugin made up.
        """
        with self._lock:
            if self._state is not RegistryState.OPEN:
                raise RegistrationError(f"the registry is {self._state}; loading happens once")
            self._state = RegistryState.LOADING
            self._loader_key = object()
            return self._loader_key

    def seal(self, loader_key: object | None = None) -> None:
        """Loading is over: every later registration, and every later scope, is refused.

        While loading, only the loader (``loader_key``) seals: a plugin cannot shut out the
        plugins loaded after it.
        """
        with self._lock:
            self._check_loader(loader_key, "seal the registry")
            self._state = RegistryState.SEALED
            self._scope = None  # a hook abandoned for not returning keeps nothing
            self._loader_key = None

    def abandon_scope(self, provenance: Provenance, loader_key: object | None = None) -> None:
        """Close ``provenance``'s scope, keeping nothing: its hook did not return in time."""
        with self._lock:
            self._check_loader(loader_key, f"abandon the scope of {provenance}")
            if self._scope is not None and self._scope.provenance == provenance:
                self._scope = None

    @contextmanager
    def plugin_scope(
        self, provenance: Provenance, *, loader_key: object | None = None
    ) -> Iterator[None]:
        """Stage one plugin's registrations; commit only if the block and each of them succeed.

        The calling thread is the plugin's: registrations from any other thread are refused
        (and fail the plugin when that thread was started during the scope, i.e. by it). While
        loading, only the loader (``loader_key``) opens scopes; a plugin whose registrations
        were kept cannot get a second scope (nobody reopens ``reference``'s); none opens on a
        sealed registry. The lock is not held while the block runs, so a hook that waits for a
        worker thread cannot deadlock the registry.
        """
        with self._lock:
            if self._state is RegistryState.SEALED:
                raise RegistrationError(
                    f"cannot open a registration scope for {provenance}: the registry is sealed "
                    "(plugins register only from their sglang_fl_register_ops hook, while "
                    "sglang-fl loads them)"
                )
            self._check_loader(
                loader_key,
                f"open a registration scope for {provenance}",
                "provenance comes from the loader",
            )
            if self._scope is not None:
                raise RuntimeError(f"plugin scope for {self._scope.provenance} is still open")
            if provenance.plugin in self._committed_plugins:
                raise RegistrationError(
                    f"plugin {provenance.plugin!r} already registered its implementations; a "
                    "plugin registers once, when it loads"
                )
            alive = frozenset(t.ident for t in threading.enumerate() if t.ident is not None)
            scope = _Scope(provenance, threading.get_ident(), alive)
            self._scope = scope
        try:
            yield
            with self._lock:
                if self._scope is not scope:
                    raise RegistrationError(
                        f"the registration scope of {provenance} was closed before its hook "
                        "returned (it did not return in time); nothing of it is kept"
                    )
                if scope.refusals:
                    # The plugin caught our error and carried on: still all or nothing.
                    raise RegistrationError("; ".join(scope.refusals))
                self._commit(scope.staged)
                self._committed_plugins.add(provenance.plugin)
                for gap in scope.staged_no_kernel:
                    self._no_kernel[gap.op_name].append(gap)
        finally:
            with self._lock:
                if self._scope is scope:
                    self._scope = None

    # -- internals ----------------------------------------------------------------------------

    def _check_loader(self, loader_key: object | None, action: str, why: str = "") -> None:
        """While loading, ``action`` is the loader's alone: refuse it to anyone without its key."""
        if self._state is RegistryState.LOADING and loader_key is not self._loader_key:
            because = f" ({why})" if why else ""
            raise RegistrationError(
                f"cannot {action}: while sglang-fl loads plugins only its loader may{because}"
            )

    def _caller_scope(self, action: str) -> _Scope | None:
        """The scope the calling thread registers in (``None``: a direct registration).

        Raises :class:`RegistrationError` when the caller may not register now; the refusal
        also fails the open scope's plugin when the caller is a thread that plugin started.
        """
        scope = self._scope
        me = threading.get_ident()
        if scope is not None and scope.thread == me:
            return scope
        if scope is None and self._state is RegistryState.OPEN:
            return None
        who = threading.current_thread().name
        if self._state is RegistryState.SEALED:
            problem = (
                f"thread {who!r} {action} after sglang-fl finished loading plugins: the "
                "registry is sealed; plugins register only from their sglang_fl_register_ops "
                "hook, while it runs"
            )
        elif scope is None:
            problem = (
                f"thread {who!r} {action} outside any plugin's sglang_fl_register_ops hook "
                "while sglang-fl loads plugins; only the hook that is running may register"
            )
        else:
            problem = (
                f"thread {who!r} {action} while plugin {scope.provenance.plugin!r} loads, but "
                "only the thread running its sglang_fl_register_ops hook may register (register "
                "from the hook itself, not from a thread it starts)"
            )
            if me not in scope.threads_before:  # started during the scope: by this plugin
                scope.refusals.append(problem)
        raise RegistrationError(problem)

    def _commit(self, impls: list[OpImpl]) -> None:
        for impl in impls:
            assert impl.provenance is not None
            self._impls[impl.op_name].append(impl)
            self._owners.setdefault(impl.impl_id, impl.provenance)

    def _validate_against_others(
        self, impl: OpImpl, provenance: Provenance, scope: _Scope | None
    ) -> None:
        """The checks that need the registry's state (under its lock; no plugin code runs)."""
        who = f"plugin {provenance.plugin!r} ({provenance.distribution})"
        owner = self._owners.get(impl.impl_id)
        if owner is not None and owner.distribution != provenance.distribution:
            raise RegistrationError(
                f"impl_id {impl.impl_id!r} registered by {who} is already owned by plugin "
                f"{owner.plugin!r} ({owner.distribution})"
            )
        staged = () if scope is None else scope.staged
        for existing in (*self._impls[impl.op_name], *staged):
            if existing.impl_id == impl.impl_id and existing.op_name == impl.op_name:
                raise RegistrationError(
                    f"{who} registered {impl.impl_id!r} for op {impl.op_name!r} twice"
                )
        problem = identity_problem(impl, provenance)
        if problem is not None:
            raise RegistrationError(problem)


def _normalised(impl: object, provenance: Provenance) -> OpImpl:
    """``impl`` checked and rebuilt from exact values, or :class:`RegistrationError`.

    Plugins are not type-checked: anything may arrive here, and is named if refused. Each field
    is read once; strings become exact ``str`` (:func:`~sglang_fl.guard.plain_str`), so a
    ``str`` subclass cannot pass one check and answer another differently later.
    """
    who = f"plugin {provenance.plugin!r} ({provenance.distribution})"
    if not isinstance(impl, OpImpl):
        raise RegistrationError(
            f"{who} registered {safe_repr(type(impl).__name__)}; expected "
            "sglang_fl.dispatch.types.OpImpl"
        )
    raw_op, raw_id, kind, raw_vendor = impl.op_name, impl.impl_id, impl.kind, impl.vendor
    priority, fn, declared, prepare = impl.priority, impl.fn, impl.available, impl.prepare
    op_name, impl_id = plain_str(raw_op), plain_str(raw_id)
    if op_name is None or op_name not in STANDARD_OPS:
        raise RegistrationError(
            f"{who} registered {safe_repr(raw_id)} for "
            f"{unknown_op_message(op_name if op_name is not None else safe_repr(raw_op))}. "
            "Custom ops are not accepted: every op needs a contract in sglang_fl.ops"
        )
    if impl_id is None or not impl_id.strip():
        raise RegistrationError(
            f"{who} registered an op with impl_id={safe_repr(raw_id)}; expected a non-empty string"
        )
    _check_length(who, "impl_id", impl_id)
    if type(kind) is not BackendImplKind:  # a plain "vendor" passes the type hint's check
        allowed = ", ".join(f"BackendImplKind.{k.name}" for k in BackendImplKind)
        raise RegistrationError(
            f"{who} registered {impl_id!r} with kind={safe_repr(kind)}; allowed: {allowed}"
        )
    if kind is BackendImplKind.REFERENCE and not is_core_reference(provenance):
        raise RegistrationError(
            f"{who} registered {impl_id!r} with kind=BackendImplKind.REFERENCE; that kind is "
            "core's own reference backend (what PER_OP=<op>=reference and the conformance "
            "kit trust), so a plugin registers BackendImplKind.DEFAULT or VENDOR"
        )
    vendor = None if raw_vendor is None else plain_str(raw_vendor)
    if raw_vendor is not None and vendor is None:
        raise RegistrationError(
            f"{who} registered {impl_id!r} with vendor={safe_repr(raw_vendor)}; expected a "
            "string or None"
        )
    if vendor is not None:
        _check_length(who, "vendor", vendor)
    if kind is BackendImplKind.VENDOR and not vendor:
        raise RegistrationError(
            f"{who} registered vendor implementation {impl_id!r} without a vendor name"
        )
    problem = priority_problem(priority) or available_problem(declared)
    if problem is not None:
        raise RegistrationError(f"{who} registered {impl_id!r} with {problem}")
    priority = int.__int__(priority)  # an int subclass (an IntEnum member) as its value
    if not callable(fn):
        raise RegistrationError(f"{who} registered {impl_id!r} with a non-callable fn")
    contract = STANDARD_OPS[op_name]
    graph_problems = _graph_problems(impl.graph_problems, impl_id, who)
    fn, planner = _planned(contract, impl_id, fn, impl.planner, who)
    problem = contract.signature_problem(fn)
    if problem is not None:
        raise RegistrationError(
            f"{who} registered {impl_id!r} for op {op_name!r}, but {plugin_text(problem)}; "
            f"expected {contract.signature_text()}"
        )
    if type(impl.traceable) is not bool:
        raise RegistrationError(
            f"{who} registered {impl_id!r} with traceable={safe_repr(impl.traceable)}; expected "
            "True (dynamo may trace fn into a compiled step) or False (a custom op, the default)"
        )
    if impl.traceable and contract.plan_stage is not None:
        raise RegistrationError(
            f"{who} registered {impl_id!r} with traceable=True, but op {op_name!r} is planned: "
            "its calls run behind its custom op, which carries the forward's plan"
        )
    if prepare is not None:
        if not contract.weights:
            raise RegistrationError(
                f"{who} registered {impl_id!r} with a prepare step, but op {op_name!r} has no "
                "weights to prepare (only ops whose contract lists weights take one)"
            )
        if not callable(prepare):
            raise RegistrationError(
                f"{who} registered {impl_id!r} with prepare={safe_repr(prepare)}; expected "
                f"None or prepare(obj, {', '.join(contract.weights)}) -> tuple"
            )
    return OpImpl(
        op_name,
        impl_id,
        kind,
        fn,
        vendor,
        priority,
        declared,
        prepare=prepare,
        planner=planner,
        graph_problems=graph_problems,
        traceable=impl.traceable,
    )


def _graph_problems(declared: object, impl_id: str, who: str) -> Mapping[str, str] | None:
    """A copy of ``declared`` (graph mode -> reason), or :class:`RegistrationError`."""
    if declared is None:
        return None
    modes = ", ".join(GraphMode)
    if not isinstance(declared, Mapping):
        raise RegistrationError(
            f"{who} registered {impl_id!r} with graph_problems={safe_repr(declared)}; "
            f"expected a mapping of graph modes ({modes}) to reasons"
        )
    problems: dict[str, str] = {}
    for raw_mode, raw_reason in declared.items():
        mode, reason = plain_str(raw_mode), plain_str(raw_reason)
        if mode not in set(GraphMode) or not reason or not reason.strip():
            raise RegistrationError(
                f"{who} registered {impl_id!r} with graph_problems entry "
                f"{safe_repr(raw_mode)}: {safe_repr(raw_reason)}; expected a graph mode "
                f"({modes}) and a non-empty reason"
            )
        problems[str(mode)] = reason
    return MappingProxyType(problems)


def _planned(
    contract: OpContract, impl_id: str, fn: Callable[..., Any], planner: object, who: str
) -> tuple[Callable[..., Any], AttentionPlanner | None]:
    """``fn`` and its planner: the default one when none is given, the legacy one (and ``fn``
    adapted) for a planned op's signature from before plans; a planner elsewhere is refused."""
    stage = contract.plan_stage
    if stage is None:
        if planner is not None:
            raise RegistrationError(
                f"{who} registered {impl_id!r} for op {contract.name!r} with a planner, but "
                f"only planned ops take one: {', '.join(_planned_ops())}"
            )
        return fn, None
    if planner is not None and not isinstance(planner, AttentionPlanner):
        raise RegistrationError(
            f"{who} registered {impl_id!r} with planner={safe_repr(planner)}; expected an "
            "AttentionPlanner (subclass sglang_fl.types.DefaultPlanner)"
        )
    if contract.signature_problem(fn) is None:
        return fn, planner or stage.default_planner
    adapted = stage.adapt_legacy(fn)
    if adapted is None:
        return fn, planner  # the caller names the signature problem
    if planner is not None:
        raise RegistrationError(
            f"{who} registered {impl_id!r} for op {contract.name!r} with a planner but the "
            f"signature from before plans; a planned implementation takes "
            f"{contract.signature_text()}"
        )
    return adapted, stage.legacy_planner


def _planned_ops() -> list[str]:
    return [name for name, c in STANDARD_OPS.items() if c.plan_stage is not None]


def _check_length(who: str, field_name: str, value: str) -> None:
    if len(value) > NAME_LIMIT:
        raise RegistrationError(
            f"{who} registered {field_name}={capped(value, 60)!r}: {len(value)} characters, "
            f"at most {NAME_LIMIT} allowed"
        )


def priority_problem(priority: object) -> str | None:
    """What is wrong with a registration's (or an offer's) ``priority``, or ``None``: an
    ``int`` (an ``IntEnum`` member too), never a ``bool``, a float or a numeric string."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        return f"priority={safe_repr(priority)}; expected an int (see BackendPriority)"
    return None


def available_problem(declared: object) -> str | None:
    """What is wrong with a declared ``available``, or ``None`` (a bool or a probe)."""
    if declared is not None and not isinstance(declared, bool) and not callable(declared):
        return (
            f"available={safe_repr(declared)}; expected None, True, False or a no-argument "
            "probe returning bool or Availability"
        )
    return None


def offered_candidate(
    offer: object, offer_type: type, *, selection: str, impl_id: str, vendor: str
) -> OpImpl:
    """One plugin's offer for a selection (``ops.SELECTIONS``: a whole attention backend, ...)
    checked as a registration is, and made the selection's ``vendor`` candidate.

    ``offer_type`` is the selection's frozen offer dataclass, with the fields ``factory`` (a
    callable), ``priority`` (``None``: :attr:`BackendPriority.VENDOR`, else an ``int``) and
    ``available`` (``None``, a bool or a probe). The offer must be exactly that type (a
    subclass could answer each read differently); each field is read once. Raises
    :class:`RegistrationError` naming the first field that is wrong and what is allowed; what
    is kept is a fresh :class:`OpImpl` of exact values. Call it where plugin code may run
    bounded (the hook's worker): ``repr`` and ``callable`` of a plugin's objects are read.
    """
    if type(offer) is not offer_type:
        raise RegistrationError(f"{safe_repr(offer)} is not a {offer_type.__name__}")
    fields: Any = offer  # each field read once, as the registry reads an OpImpl's
    factory, priority, declared = fields.factory, fields.priority, fields.available
    problem = None
    if not callable(factory):
        problem = f"factory={safe_repr(factory)}; expected a callable taking the engine's object"
    elif priority is not None:
        problem = priority_problem(priority)
    problem = problem or available_problem(declared)
    if problem is not None:
        raise RegistrationError(f"its {problem}")
    kept = BackendPriority.VENDOR if priority is None else int.__int__(priority)
    return OpImpl(selection, impl_id, BackendImplKind.VENDOR, factory, vendor, kept, declared)
