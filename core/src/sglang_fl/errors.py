"""Every error sglang-fl raises on purpose derives from :class:`SglangFlError`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .dispatch.resolve import Decision


class SglangFlError(Exception):
    """Base class of sglang-fl's own errors."""


class ConfigError(SglangFlError, ValueError):
    """A configuration value or key could not be parsed; the message says what is allowed."""


class RegistrationError(SglangFlError):
    """An :class:`~sglang_fl.dispatch.types.OpImpl` was refused by the registry."""


class PluginLoadError(SglangFlError):
    """A vendor plugin failed to load (raised only with ``SGLANG_FL_STRICT=1``)."""


class UnknownNameError(SglangFlError, KeyError):
    """A name looked up that does not exist; the message names the close match.

    A ``KeyError`` too, so a lookup by name fails the way a mapping lookup does.
    """

    def __str__(self) -> str:
        # KeyError's str() is the repr of its key; this error's argument is a sentence.
        return str(self.args[0]) if self.args else ""


class UnknownOpError(UnknownNameError):
    """An op name that is not a standard op."""


class UnknownHookError(UnknownNameError):
    """A hook name that is not one of sglang-fl's hook specifications."""


class NoImplementationError(SglangFlError, LookupError):
    """No candidate implementation of an op survived selection.

    ``decision`` is the :class:`~sglang_fl.dispatch.resolve.Decision` with every candidate
    rejected and why (``None`` when raised outside resolution).
    """

    def __init__(self, message: str, decision: Decision | None = None) -> None:
        super().__init__(message)
        self.decision = decision


class StrictModeError(SglangFlError):
    """``SGLANG_FL_STRICT=1`` turned a fallback into an error."""


class GraphModeRefused(SglangFlError, RuntimeError):
    """A graph runner was refused before it captured anything: something on the decode path
    cannot run in its graph mode (the message says what and why)."""


class ContractViolationError(SglangFlError):
    """A plugin's code returned or raised what its contract forbids (an output of the wrong
    shape; ``SystemExit`` from a vendor attention backend's forward): the message names the
    implementation and what was expected."""


class CollectiveDivergenceError(SglangFlError):
    """The ranks of a process group would run different code for one collective call (one
    declined it, the others did not): this rank stops rather than hang or compute wrongly."""


class Unsupported(Exception):
    """Raised by an implementation, before it writes anything, to decline one call.

    The dispatcher then hands that same call to the next candidate in the decision order.
    Any other exception propagates unchanged: a call that failed is never re-run elsewhere.
    """
