"""The selection policy: which candidates an op may use, and in which order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .identity import vendor_identity
from .order import DEFAULT_ORDER, DEFAULT_SOURCE, OrderToken
from .types import OpImpl

if TYPE_CHECKING:
    from ..config import Settings

__all__ = ["OrderPlan", "SelectionPolicy"]


@dataclass(frozen=True)
class OrderPlan:
    """One op's order, computed once per resolution: its tokens and which setting gave them.

    ``explicit`` is true when the user chose the order (``prefer`` or the op's ``per_op``
    entry): then a first token nobody satisfies is a warning, or an error under STRICT.
    """

    op: str
    tokens: tuple[OrderToken, ...]
    source: str
    explicit: bool

    def rank(self, impl: OpImpl) -> int | None:
        """Position of the first token ``impl`` matches, or ``None`` if it matches none."""
        for index, token in enumerate(self.tokens):
            if token.matches(impl):
                return index
        return None

    def texts(self) -> tuple[str, ...]:
        """The tokens as written in settings and decision records (``vendor:cuda``)."""
        return tuple(map(str, self.tokens))


@dataclass(frozen=True)
class SelectionPolicy:
    """Orders and filters candidates; built once from :class:`~sglang_fl.config.Settings`."""

    settings: Settings

    def plan(self, op_name: str) -> OrderPlan:
        """The per-op order if one is set, else ``prefer`` followed by the default order."""
        settings = self.settings
        explicit = settings.per_op.get(op_name)
        if explicit is not None:
            return OrderPlan(op_name, explicit, settings.sources.get("per_op", "per_op"), True)
        prefer = settings.prefer
        if prefer is None:
            return OrderPlan(op_name, DEFAULT_ORDER, DEFAULT_SOURCE, False)
        tokens = (prefer, *(token for token in DEFAULT_ORDER if token != prefer))
        return OrderPlan(op_name, tokens, settings.sources.get("prefer", "prefer"), True)

    def vendor_refusal(self, impl: OpImpl) -> str | None:
        """Why the allow/deny vendor lists exclude ``impl``, or ``None``.

        The lists match the registering plugin's entry-point name (see
        :mod:`~sglang_fl.dispatch.identity`), so no kind and no declared vendor escapes them.
        """
        name = vendor_identity(impl)
        if name is None:
            return None
        who = f"vendor {name!r}" if impl.vendor == name else f"plugin {name!r}"
        if name in self.settings.deny_vendors:
            return f"{who} is denied ({self.settings.sources['deny_vendors']})"
        allow = self.settings.allow_vendors
        if allow is not None and name not in allow:
            return (
                f"{who} is not in the allow list {list(allow)} "
                f"({self.settings.sources['allow_vendors']})"
            )
        return None
