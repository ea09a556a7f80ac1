"""The registry of operator implementations, filled by plugins through their hooks."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import RegistrationError, UnknownOpError
from ..ops import STANDARD_OPS, unknown_op_message
from .identity import DIRECT_PLUGIN, identity_problem
from .types import BackendImplKind, OpImpl, Provenance

__all__ = ["DIRECT_PROVENANCE", "NoKernel", "OpRegistry"]

# Provenance of registrations made outside a plugin load (a test, an interactive session).
DIRECT_PROVENANCE = Provenance(plugin=DIRECT_PLUGIN, distribution="<none>", version="")


@dataclass(frozen=True)
class NoKernel:
    """A plugin's statement that it has no kernel for an op, and why (``sglang-fl ops`` shows
    it, so a user sees why a vendor is absent from an op's candidates)."""

    op_name: str
    reason: str
    provenance: Provenance


class OpRegistry:
    """Implementations per op, each stamped with the provenance of the plugin that added it.

    A plugin's registrations are staged inside :meth:`plugin_scope` and kept only if the whole
    hook succeeds and no registration was refused: a failing plugin leaves nothing behind.
    """

    def __init__(self) -> None:
        self._impls: dict[str, list[OpImpl]] = {name: [] for name in STANDARD_OPS}
        self._owners: dict[str, Provenance] = {}
        self._lock = threading.RLock()
        self._scope: Provenance | None = None
        self._staged: list[OpImpl] = []
        self._refusals: list[str] = []
        self._no_kernel: dict[str, list[NoKernel]] = {name: [] for name in STANDARD_OPS}
        self._staged_no_kernel: list[NoKernel] = []

    # -- plugin-facing API --------------------------------------------------------------------

    def register(self, impl: OpImpl) -> None:
        """Add one implementation; raises :class:`RegistrationError` naming what is wrong."""
        with self._lock:
            provenance = self._scope or DIRECT_PROVENANCE
            try:
                self._validate(impl, provenance)
            except RegistrationError as exc:
                self._refusals.append(str(exc))
                raise
            stamped = impl.with_provenance(provenance)
            if self._scope is None:
                self._commit([stamped])
            else:
                self._staged.append(stamped)

    def register_many(self, impls: Iterable[OpImpl]) -> None:
        """Add several implementations; the first refusal raises (and fails a plugin scope)."""
        for impl in impls:
            self.register(impl)

    def declare_no_kernel(self, op_name: str, reason: str) -> None:
        """Say why this plugin registers nothing for ``op_name``; staged like a registration."""
        with self._lock:
            provenance = self._scope or DIRECT_PROVENANCE
            who = f"plugin {provenance.plugin!r} ({provenance.distribution})"
            problem = None
            if op_name not in STANDARD_OPS:
                problem = f"{who} declared no kernel for {unknown_op_message(op_name)}"
            elif not isinstance(reason, str) or not reason.strip():
                problem = f"{who} declared no kernel for {op_name!r} without a reason"
            if problem is not None:
                self._refusals.append(problem)  # fails the plugin even if it is caught
                raise RegistrationError(problem)
            gap = NoKernel(op_name, reason, provenance)
            if self._scope is None:
                self._no_kernel[op_name].append(gap)
            else:
                self._staged_no_kernel.append(gap)

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

    def __repr__(self) -> str:
        count = sum(len(impls) for impls in self._impls.values())
        return f"<OpRegistry: {len(self._impls)} ops, {count} implementations>"

    # -- loader-facing API --------------------------------------------------------------------

    @contextmanager
    def plugin_scope(self, provenance: Provenance) -> Iterator[None]:
        """Stage one plugin's registrations; commit only if the block and each of them succeed."""
        with self._lock:
            if self._scope is not None:
                raise RuntimeError(f"plugin scope for {self._scope} is still open")
            self._scope, self._staged, self._refusals = provenance, [], []
            self._staged_no_kernel = []
            try:
                yield
                if self._refusals:
                    # The plugin caught our error and carried on: still all or nothing.
                    raise RegistrationError("; ".join(self._refusals))
                self._commit(self._staged)
                for gap in self._staged_no_kernel:
                    self._no_kernel[gap.op_name].append(gap)
            finally:
                self._scope, self._staged, self._refusals = None, [], []
                self._staged_no_kernel = []

    # -- internals ----------------------------------------------------------------------------

    def _commit(self, impls: list[OpImpl]) -> None:
        for impl in impls:
            assert impl.provenance is not None
            self._impls[impl.op_name].append(impl)
            self._owners.setdefault(impl.impl_id, impl.provenance)

    def _validate(self, impl: object, provenance: Provenance) -> None:
        """Plugins are not type-checked: anything may arrive here, and is named if refused."""
        who = f"plugin {provenance.plugin!r} ({provenance.distribution})"
        if not isinstance(impl, OpImpl):
            raise RegistrationError(
                f"{who} registered {type(impl).__name__!r}; expected "
                "sglang_fl.dispatch.types.OpImpl"
            )
        if impl.op_name not in STANDARD_OPS:
            raise RegistrationError(
                f"{who} registered {impl.impl_id!r} for {unknown_op_message(impl.op_name)}. "
                "Custom ops are not accepted: every op needs a contract in sglang_fl.ops"
            )
        if not isinstance(impl.impl_id, str) or not impl.impl_id.strip():
            raise RegistrationError(
                f"{who} registered an op with impl_id={impl.impl_id!r}; expected a non-empty string"
            )
        kind: object = impl.kind  # a plain "vendor" passes the type hint's check, not this one
        if not isinstance(kind, BackendImplKind):
            allowed = ", ".join(f"BackendImplKind.{k.name}" for k in BackendImplKind)
            raise RegistrationError(
                f"{who} registered {impl.impl_id!r} with kind={kind!r}; allowed: {allowed}"
            )
        if impl.kind is BackendImplKind.VENDOR and not impl.vendor:
            raise RegistrationError(
                f"{who} registered vendor implementation {impl.impl_id!r} without a vendor name"
            )
        if isinstance(impl.priority, bool) or not isinstance(impl.priority, int):
            raise RegistrationError(
                f"{who} registered {impl.impl_id!r} with priority={impl.priority!r}; "
                "expected an int (see BackendPriority)"
            )
        if not callable(impl.fn):
            raise RegistrationError(f"{who} registered {impl.impl_id!r} with a non-callable fn")
        declared: object = impl.available
        if declared is not None and not isinstance(declared, bool) and not callable(declared):
            raise RegistrationError(
                f"{who} registered {impl.impl_id!r} with available={declared!r}; expected "
                "None, True, False or a no-argument probe returning bool or Availability"
            )
        contract = STANDARD_OPS[impl.op_name]
        problem = contract.signature_problem(impl.fn)
        if problem is not None:
            raise RegistrationError(
                f"{who} registered {impl.impl_id!r} for op {impl.op_name!r}, but {problem}; "
                f"expected {contract.signature_text()}"
            )
        owner = self._owners.get(impl.impl_id)
        if owner is not None and owner.distribution != provenance.distribution:
            raise RegistrationError(
                f"impl_id {impl.impl_id!r} registered by {who} is already owned by plugin "
                f"{owner.plugin!r} ({owner.distribution})"
            )
        for existing in (*self._impls[impl.op_name], *self._staged):
            if existing.impl_id == impl.impl_id and existing.op_name == impl.op_name:
                raise RegistrationError(
                    f"{who} registered {impl.impl_id!r} for op {impl.op_name!r} twice"
                )
        problem = identity_problem(impl, provenance)
        if problem is not None:
            raise RegistrationError(problem)
