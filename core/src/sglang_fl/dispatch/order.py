"""Selection-order tokens: what a ``prefer``/``per_op`` entry names and which impls it matches.

The tokens belong to the selection policy (:mod:`~sglang_fl.dispatch.policy` ranks candidates
by them); :mod:`~sglang_fl.config` parses settings into them. They live here, below both, so
that the policy never imports the settings module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigError
from .types import BackendImplKind, OpImpl

__all__ = [
    "DEFAULT_ORDER",
    "DEFAULT_SOURCE",
    "IMPL_TOKEN",
    "NAME_HELP",
    "TOKEN_HELP",
    "OrderToken",
    "is_valid_name",
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
# What a plugin (entry-point) or vendor name may be: what the name-list settings can spell.
NAME_HELP = "a letter or digit, then letters, digits, '_', '.' or '-'"
# Where a setting that no file or variable sets comes from (``sglang-fl doctor``, decisions).
DEFAULT_SOURCE = "default"
# ``impl:<impl_id>`` names one implementation; every other token is a BackendImplKind value.
IMPL_TOKEN = "impl"
TOKEN_HELP = ", ".join(
    [
        *(
            f"{kind}, {kind}:<name>" if kind is BackendImplKind.VENDOR else str(kind)
            for kind in BackendImplKind
        ),
        f"{IMPL_TOKEN}:<impl_id>",
    ]
)


def is_valid_name(name: str) -> bool:
    """Whether ``name`` can be written in the plugin and vendor name lists."""
    return _NAME.fullmatch(name) is not None


@dataclass(frozen=True)
class OrderToken:
    """One entry of a selection order: a kind, a named vendor, or one implementation.

    ``kind`` is a :class:`BackendImplKind` (``value``: the vendor, for ``vendor:<name>``) or
    :data:`IMPL_TOKEN` (``value``: the impl_id).
    """

    kind: BackendImplKind | str
    value: str | None = None

    def __str__(self) -> str:
        return str(self.kind) if self.value is None else f"{self.kind}:{self.value}"

    @classmethod
    def parse(cls, text: str, where: str) -> OrderToken:
        token = text.strip()
        kind, sep, value = token.partition(":")
        if not sep and kind in _KIND_TOKENS:
            return cls(BackendImplKind(kind))
        if sep and kind == BackendImplKind.VENDOR and value and is_valid_name(value):
            return cls(BackendImplKind.VENDOR, value)
        if sep and kind == IMPL_TOKEN and value and is_valid_name(value):
            return cls(IMPL_TOKEN, value)
        raise ConfigError(f"{where}: invalid selection token {token!r}; allowed: {TOKEN_HELP}")

    def matches(self, impl: OpImpl) -> bool:
        """Whether ``impl`` is one of the implementations this token names."""
        if self.kind == IMPL_TOKEN:
            return impl.impl_id == self.value
        return impl.kind == self.kind and (self.value is None or impl.vendor == self.value)


# The order used when no setting gives one: every kind, in BackendImplKind's order.
DEFAULT_ORDER = tuple(OrderToken(kind) for kind in BackendImplKind)
_KIND_TOKENS = {kind.value for kind in BackendImplKind}
