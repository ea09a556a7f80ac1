"""The selection policy: which candidates an op may use, and in which order."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import DEFAULT_ORDER, OrderToken, Settings
from .types import BackendImplKind, OpImpl

__all__ = ["SelectionPolicy"]

_KIND_OF_TOKEN = {
    "flagos": BackendImplKind.DEFAULT,
    "vendor": BackendImplKind.VENDOR,
    "reference": BackendImplKind.REFERENCE,
}


def token_matches(token: OrderToken, impl: OpImpl) -> bool:
    if token.kind == "impl":
        return impl.impl_id == token.value
    if impl.kind is not _KIND_OF_TOKEN[token.kind]:
        return False
    return token.value is None or impl.vendor == token.value


@dataclass(frozen=True)
class SelectionPolicy:
    """Orders and filters candidates; built once from :class:`~sglang_fl.config.Settings`."""

    settings: Settings

    def order_for(self, op_name: str) -> tuple[OrderToken, ...]:
        """The per-op order if one is set, else ``prefer`` followed by the default order."""
        explicit = self.settings.per_op.get(op_name)
        if explicit is not None:
            return explicit
        default = tuple(OrderToken(kind) for kind in DEFAULT_ORDER)
        prefer = self.settings.prefer
        if prefer is None:
            return default
        return (prefer, *(token for token in default if token != prefer))

    def order_source(self, op_name: str) -> str:
        """Which setting decided the order of ``op_name`` (for decision records)."""
        if op_name in self.settings.per_op:
            return self.settings.sources.get("per_op", "per_op")
        if self.settings.prefer is not None:
            return self.settings.sources.get("prefer", "prefer")
        return "default"

    def is_explicit(self, op_name: str) -> bool:
        return op_name in self.settings.per_op or self.settings.prefer is not None

    def rank(self, op_name: str, impl: OpImpl) -> tuple[int, OrderToken] | None:
        """Position of the first order token ``impl`` matches, or ``None`` if it matches none."""
        for index, token in enumerate(self.order_for(op_name)):
            if token_matches(token, impl):
                return index, token
        return None

    def vendor_refusal(self, impl: OpImpl) -> str | None:
        """Why the allow/deny vendor lists exclude ``impl``, or ``None``."""
        if impl.vendor is None:
            return None
        if impl.vendor in self.settings.deny_vendors:
            return f"vendor {impl.vendor!r} is denied ({self.settings.sources['deny_vendors']})"
        allow = self.settings.allow_vendors
        if allow is not None and impl.vendor not in allow:
            return (
                f"vendor {impl.vendor!r} is not in the allow list {list(allow)} "
                f"({self.settings.sources['allow_vendors']})"
            )
        return None
