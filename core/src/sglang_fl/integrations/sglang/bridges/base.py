"""The SGLang bridge base: :class:`~sglang_fl.integrations.routing.Bridge` for SGLang's layers.

Every family module of this package (``activation``, ``normalization``, ``rotary``, ``moe``,
``attention``) subclasses it; the table of all of them is :data:`..BRIDGES`, in the package's
``__init__``, which imports the families and nothing imports back.
"""

from __future__ import annotations

from ... import routing

__all__ = ["Bridge"]


class Bridge(routing.Bridge):
    """How one standard op is bridged to its SGLang layer class."""

    engine = "SGLang"
