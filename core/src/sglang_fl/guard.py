"""Running plugin code (hooks, availability probes) so that it cannot crash or hang the host.

A plugin is in-process code: core cannot sandbox it. What core can do is call it in a way that
turns every exception (``SystemExit`` and ``GeneratorExit`` included; ``KeyboardInterrupt``
still interrupts) into a reported failure, bounds how long the host waits for it, and knows
when the calling thread is running plugin code, so that re-entering sglang-fl from there is a
clear error instead of a deadlock.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = [
    "PluginCall",
    "call_plugin_code",
    "describe_exception",
    "in_plugin_code",
    "plain_str",
    "safe_repr",
]

T = TypeVar("T")

_plugin_code = threading.local()


def in_plugin_code() -> str | None:
    """What plugin code the calling thread runs (``"hook 'x' of plugin 'y'"``), or ``None``."""
    what: str | None = getattr(_plugin_code, "what", None)
    return what


def plain_str(value: object) -> str | None:
    """``value`` as an exact ``str`` if it is a string (a subclass is copied), else ``None``.

    The one place where a string a plugin hands core (an impl id, a vendor name, a reason, an
    error message) becomes core's: a ``str`` subclass passes ``isinstance(value, str)`` but may
    override ``startswith``, ``__eq__``, ``__hash__``, ``__str__`` or ``__format__`` to lie or
    raise later, wherever core compares or prints it. ``str.__str__`` copies the characters
    without calling any method of the subclass, so what core keeps is exactly what it checks.
    """
    if type(value) is str:
        return value
    if isinstance(value, str):
        return str.__str__(value)
    return None


def _type_name(value: object) -> str:
    return plain_str(getattr(type(value), "__name__", None)) or "object"


def describe_exception(exc: BaseException) -> str:
    """``"Type: message"``, even when the exception's ``__str__`` itself raises or returns a
    ``str`` subclass (kept as its plain characters, see :func:`plain_str`)."""
    name = _type_name(exc)
    try:
        text = plain_str(str(exc)) or ""
    except BaseException as broken:
        if isinstance(broken, KeyboardInterrupt):
            raise
        text = f"<str() of the exception raised {_type_name(broken)}>"
    return f"{name}: {text}" if text else name


def safe_repr(value: object) -> str:
    """``repr(value)``, or a description of it when a plugin's ``__repr__`` raises."""
    try:
        return plain_str(repr(value)) or ""
    except Exception as exc:
        return f"<{_type_name(value)} whose repr() raised {_type_name(exc)}>"


@dataclass(frozen=True)
class PluginCall(Generic[T]):
    """How one call into plugin code ended: a value, an exception, or no answer in time."""

    value: T | None = None
    error: BaseException | None = None
    details: str | None = None  # the traceback of ``error``, for ``--verbose``
    timed_out: bool = False


def call_plugin_code(fn: Callable[[], T], *, what: str, timeout: float) -> PluginCall[T]:
    """Run ``fn`` in a daemon thread marked as running ``what``; wait at most ``timeout`` s.

    A call that does not return in time is abandoned (Python cannot stop a thread): it keeps
    running in the background, and whatever it does later is refused by its caller (the
    registry closes the plugin's scope; the availability cache has already answered).
    """
    outcome: list[PluginCall[T]] = []

    def run() -> None:
        _plugin_code.what = what
        try:
            value = fn()
        except BaseException as exc:
            outcome.append(PluginCall(error=exc, details=traceback.format_exc()))
        else:
            outcome.append(PluginCall(value=value))

    thread = threading.Thread(target=run, name=f"sglang-fl: {what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive() or not outcome:
        return PluginCall(timed_out=True)
    return outcome[0]
