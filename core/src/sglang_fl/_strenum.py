"""``StrEnum`` for Python 3.10 (``enum.StrEnum`` is 3.11+): members are their string values."""

from __future__ import annotations

import enum

__all__ = ["StrEnum"]


class StrEnum(str, enum.Enum):
    """An enum whose members are ``str``: equal to, formatted and JSON-encoded as their value.

    States that appear in ``--json`` output and logs are such enums, so the output stays the
    plain strings it always was while the code names each state once.
    """

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, format_spec: str) -> str:
        return format(str(self.value), format_spec)
