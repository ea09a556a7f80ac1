"""Running plugin code (hooks, availability probes) so that it cannot crash or hang the host.

A plugin is in-process code: core cannot sandbox it. What core can do is call it in a way that
turns every exception (``SystemExit`` and ``GeneratorExit`` included; ``KeyboardInterrupt``
still interrupts) into a reported failure, bounds how long the host waits for it, and knows
when the calling thread is running plugin code, so that re-entering sglang-fl from there is a
clear error instead of a deadlock. A call that may have to run where Python starts no thread
(interpreter exit, Python 3.12) gets its thread beforehand (:class:`ReservedPluginCall`).
Text a plugin hands core for display (messages, reasons, reprs) is cut at
:data:`PLUGIN_TEXT_LIMIT` characters, with a marker saying so, so that one plugin cannot make
every report and log line as large as it likes.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = [
    "PLUGIN_TEXT_LIMIT",
    "PluginCall",
    "ReservedPluginCall",
    "call_plugin_code",
    "capped",
    "describe_exception",
    "exception_text",
    "in_plugin_code",
    "is_interrupt",
    "plain_str",
    "plugin_text",
    "safe_repr",
]

T = TypeVar("T")

# The most characters of one plugin-supplied text (an error message, a reason, a repr) that a
# report, a log line or a CLI output carries; the rest is replaced by CUT_MARKER's note.
PLUGIN_TEXT_LIMIT = 2000
CUT_MARKER = "... [sglang-fl: cut {count} more characters]"

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


def capped(text: str, limit: int = PLUGIN_TEXT_LIMIT) -> str:
    """``text`` itself, or its first ``limit`` characters and a marker saying how many more
    there were (a plugin's 50 MB message must not become a 50 MB log line or JSON field)."""
    if len(text) <= limit:
        return text
    return text[:limit] + CUT_MARKER.format(count=len(text) - limit)


def plugin_text(value: object) -> str | None:
    """A string a plugin supplies for display (a reason, a message): :func:`plain_str`, then
    :func:`capped`. ``None`` when ``value`` is not a string. Not for names compared later
    (impl ids, vendors): those stay exact and are checked at registration."""
    text = plain_str(value)
    return None if text is None else capped(text)


def is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` still ends the host when plugin code raises it: only an interrupt
    (Ctrl-C) does; ``SystemExit``, ``GeneratorExit`` and any other
    ``BaseException`` is a plugin's failure like any exception."""
    return isinstance(exc, KeyboardInterrupt)


def _type_name(value: object) -> str:
    return capped(plain_str(getattr(type(value), "__name__", None)) or "object", 200)


def exception_text(exc: BaseException) -> str:
    """An exception's message as plain, :func:`capped` text, even when its ``__str__`` raises
    (then a description of that) or returns a ``str`` subclass (kept as its characters)."""
    try:
        return plugin_text(str(exc)) or ""
    except BaseException as broken:
        if is_interrupt(broken):
            raise
        return f"<str() of the exception raised {_type_name(broken)}>"


def describe_exception(exc: BaseException) -> str:
    """``"Type: message"`` (:func:`exception_text`), or ``"Type"`` for an empty message."""
    text = exception_text(exc)
    name = _type_name(exc)
    return f"{name}: {text}" if text else name


def safe_repr(value: object) -> str:
    """``repr(value)`` (:func:`capped`), or a description of it when a plugin's ``__repr__``
    raises."""
    try:
        return plugin_text(repr(value)) or ""
    except BaseException as exc:
        if is_interrupt(exc):
            raise
        return f"<{_type_name(value)} whose repr() raised {_type_name(exc)}>"


def _traceback_text() -> str:
    """The traceback being handled, :func:`capped` (for ``--verbose``), even when formatting
    it runs a plugin's ``__str__`` that raises."""
    try:
        return capped(traceback.format_exc(), 10 * PLUGIN_TEXT_LIMIT)
    except BaseException as exc:
        if is_interrupt(exc):
            raise
        return f"<the traceback could not be formatted: {_type_name(exc)}>"


@dataclass(frozen=True)
class PluginCall(Generic[T]):
    """How one call into plugin code ended: a value, an exception, or no answer in time."""

    value: T | None = None
    error: BaseException | None = None
    details: str | None = None  # the traceback of ``error``, for ``--verbose``
    timed_out: bool = False


def _run_marked(fn: Callable[[], T], what: str, outcome: list[PluginCall[T]]) -> None:
    """Run ``fn`` as plugin code ``what`` on this thread; append how it ended to ``outcome``."""
    _plugin_code.what = what
    try:
        value = fn()
    except BaseException as exc:
        outcome.append(PluginCall(error=exc, details=_traceback_text()))
    else:
        outcome.append(PluginCall(value=value))


def call_plugin_code(fn: Callable[[], T], *, what: str, timeout: float) -> PluginCall[T]:
    """Run ``fn`` in a daemon thread marked as running ``what``; wait at most ``timeout`` s.

    A call that does not return in time is abandoned (Python cannot stop a thread): it keeps
    running in the background, and whatever it does later is refused by its caller (the
    registry closes the plugin's scope; the availability cache has already answered).
    """
    outcome: list[PluginCall[T]] = []
    thread = threading.Thread(
        target=_run_marked, args=(fn, what, outcome), name=f"sglang-fl: {what}", daemon=True
    )
    thread.start()
    thread.join(timeout)
    if thread.is_alive() or not outcome:
        return PluginCall(timed_out=True)
    return outcome[0]


class ReservedPluginCall(Generic[T]):
    """One plugin call made later, bounded like :func:`call_plugin_code`, on a daemon thread
    started now.

    For a call that may have to run where Python starts no thread: at interpreter exit,
    Python 3.12 refuses ``Thread.start()`` in ``atexit`` handlers (``RuntimeError: can't
    create new thread at interpreter shutdown``), while a thread started earlier still runs.
    The thread waits idle until :meth:`run`; it runs one call. It exists only in the process
    that made it (a forked child has none: reserve there what the child will call).
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self._fn: list[Callable[[], T]] = []
        self._outcome: list[PluginCall[T]] = []
        self._go = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"sglang-fl: {what}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self._go.wait()
        _run_marked(self._fn[0], self.what, self._outcome)
        self._done.set()

    def run(self, fn: Callable[[], T], *, timeout: float) -> PluginCall[T]:
        """Run ``fn`` on the reserved thread; wait at most ``timeout`` s (then it is abandoned,
        as :func:`call_plugin_code` abandons a call). A second call raises ``RuntimeError``."""
        if self._go.is_set():
            raise RuntimeError(f"the thread reserved for {self.what} has already run its call")
        self._fn.append(fn)
        self._go.set()
        if not self._done.wait(timeout) or not self._outcome:
            return PluginCall(timed_out=True)
        return self._outcome[0]
