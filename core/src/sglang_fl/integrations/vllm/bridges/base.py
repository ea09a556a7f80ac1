"""The vLLM bridge base: :class:`~sglang_fl.integrations.routing.Bridge` for vLLM's layers.

The family modules of this package (``activation``, ``normalization``, ``rotary``) subclass
it; the table of all of them, :data:`..BRIDGES`, is in the package's ``__init__``.
"""

from __future__ import annotations

from ... import routing

__all__ = ["VllmBridge"]


class VllmBridge(routing.Bridge):
    """How one standard op is bridged to its vLLM layer class."""

    engine = "vLLM"
