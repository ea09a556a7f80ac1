"""``sglang-fl hooks``: every hook specification, who implements it, in which order, and where.

Everything comes from pluggy's own introspection of the runtime's plugin manager
(``HookCaller.spec``, ``get_hookimpls()``, ``HookImpl.opts``, ``get_hookcallers``), plus the
loader's records for provenance and for plugins that never registered. What pluggy calls first
is listed first. For ``sglang_fl_platform`` each plugin's own answer is asked the way the
runtime asks it (:meth:`~sglang_fl.runtime.Runtime.platform_answers`), with the one that wins.

The ``--json`` shape is :class:`HooksReport` (the CLI adds ``schema_version``);
docs/reference/cli.md documents it.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from typing import TypedDict

import pluggy

from .errors import UnknownHookError
from .loader import PluginRecord, PluginStatus, _SeedAdapter
from .runtime import Runtime

__all__ = [
    "AnswerReport",
    "HookReport",
    "HooksReport",
    "ImplementationReport",
    "UnmatchedImplementationReport",
    "UnregisteredPluginReport",
    "firstresult_disagreements",
    "hooks_report",
    "implementation_flags",
]

PLATFORM_HOOK = "sglang_fl_platform"


class ImplementationReport(TypedDict):
    """One hook implementation: whose it is, where its code lives, how pluggy orders it."""

    plugin: str
    distribution: str | None
    version: str | None
    function: str  # module:qualname
    file: str | None
    line: int | None
    tryfirst: bool
    trylast: bool
    wrapper: bool
    hookwrapper: bool
    optionalhook: bool
    specname: str | None  # the hook it implements under another function name


class UnmatchedImplementationReport(ImplementationReport):
    """An ``optionalhook`` implementation of a hook this sglang-fl does not specify."""

    hook: str


class AnswerReport(TypedDict):
    """One plugin's answer to a ``firstresult`` hook, asked alone."""

    plugin: str
    answer: str | None
    problem: str | None  # it raised, or answered something invalid: the answer is ignored


class HookReport(TypedDict):
    """One hook specification and its implementations, in the order pluggy calls them."""

    name: str
    arguments: list[str]
    firstresult: bool
    historic: bool
    doc: str  # the first line of the specification's docstring
    implementations: list[ImplementationReport]
    answers: list[AnswerReport] | None  # sglang_fl_platform only; else null
    winner: str | None  # the plugin whose answer is used; null when none answered


class UnregisteredPluginReport(TypedDict):
    """A plugin that is not in the plugin manager (failed or disabled), so implements nothing."""

    name: str
    distribution: str | None
    version: str | None
    status: str
    error: str | None


class HooksReport(TypedDict):
    """``sglang-fl hooks --json``, without the ``schema_version`` the CLI adds."""

    project: str
    hooks: list[HookReport]
    unmatched: list[UnmatchedImplementationReport]
    unregistered_plugins: list[UnregisteredPluginReport]


def hooks_report(runtime: Runtime, hook: str | None = None) -> HooksReport:
    """The report of every hook, or of ``hook`` only (a specified or an unmatched hook name).

    Raises ``KeyError`` naming the known hooks when ``hook`` is neither.
    """
    pm = runtime.plugin_manager
    records = {record.name: record for record in runtime.plugins}
    specified = _specified_hooks(pm)
    unmatched = _unmatched_implementations(pm, records)
    if hook is not None:
        known = sorted({*specified, *(u["hook"] for u in unmatched)})
        if hook not in known:
            close = difflib.get_close_matches(hook, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UnknownHookError(f"unknown hook {hook!r}{hint}; known hooks: {', '.join(known)}")
        specified = {name: caller for name, caller in specified.items() if name == hook}
        unmatched = [u for u in unmatched if u["hook"] == hook]
    return {
        "project": pm.project_name,
        "hooks": [_hook_report(runtime, caller, records) for caller in specified.values()],
        "unmatched": unmatched,
        "unregistered_plugins": [
            {
                "name": record.name,
                "distribution": record.distribution,
                "version": record.version,
                "status": record.status,
                "error": record.error,
            }
            for record in runtime.plugins
            if record.status is not PluginStatus.LOADED
        ],
    }


def firstresult_disagreements(report: HooksReport) -> list[str]:
    """One line per ``firstresult`` hook that two plugins answer differently (doctor's)."""
    lines = []
    for hook in report["hooks"]:
        answered = [a for a in hook["answers"] or () if a["problem"] is None and a["answer"]]
        if not hook["firstresult"] or len({a["answer"] for a in answered}) < 2:
            continue
        answers = ", ".join(f"{a['plugin']!r} -> {a['answer']!r}" for a in answered)
        lines.append(
            f"plugins disagree on {hook['name']} ({answers}); {hook['winner']!r} wins as "
            f"pluggy calls it first: see `sglang-fl hooks {hook['name']}`"
        )
    return lines


def implementation_flags(impl: ImplementationReport) -> list[str]:
    """The options set on one implementation, as pluggy spells them (``specname=...``)."""
    flags = [
        name
        for name, on in (
            ("tryfirst", impl["tryfirst"]),
            ("trylast", impl["trylast"]),
            ("wrapper", impl["wrapper"]),
            ("hookwrapper", impl["hookwrapper"]),
            ("optionalhook", impl["optionalhook"]),
        )
        if on
    ]
    return flags + ([f"specname={impl['specname']}"] if impl["specname"] else [])


def _specified_hooks(pm: pluggy.PluginManager) -> dict[str, pluggy.HookCaller]:
    # pm.hook holds one HookCaller per hook name, specified or only implemented.
    callers = (c for c in vars(pm.hook).values() if isinstance(c, pluggy.HookCaller))
    return {c.name: c for c in sorted(callers, key=lambda c: c.name) if c.has_spec()}


def _unmatched_implementations(
    pm: pluggy.PluginManager, records: dict[str, PluginRecord]
) -> list[UnmatchedImplementationReport]:
    found: list[UnmatchedImplementationReport] = []
    for plugin in pm.get_plugins():
        for caller in pm.get_hookcallers(plugin) or ():
            if caller.has_spec():
                continue
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin:
                    found.append({"hook": caller.name, **_implementation(impl, records)})
    return sorted(found, key=lambda u: (u["hook"], u["plugin"]))


def _hook_report(
    runtime: Runtime, caller: pluggy.HookCaller, records: dict[str, PluginRecord]
) -> HookReport:
    spec = caller.spec
    assert spec is not None  # only specified hooks come here
    doc = inspect.getdoc(spec.function) or ""
    answers: list[AnswerReport] | None = None
    winner = None
    if caller.name == PLATFORM_HOOK:
        answers = [
            {"plugin": a.plugin, "answer": a.path, "problem": a.problem}
            for a in runtime.platform_answers()
        ]
        winner = next((a["plugin"] for a in answers if a["problem"] is None and a["answer"]), None)
    return {
        "name": caller.name,
        "arguments": list(spec.argnames),
        "firstresult": bool(spec.opts.get("firstresult")),
        "historic": bool(spec.opts.get("historic")),
        "doc": doc.splitlines()[0] if doc else "",
        # get_hookimpls() lists them in the reverse of the order pluggy calls them.
        "implementations": [
            _implementation(impl, records) for impl in reversed(caller.get_hookimpls())
        ],
        "answers": answers,
        "winner": winner,
    }


def _implementation(
    impl: pluggy.HookImpl, records: dict[str, PluginRecord]
) -> ImplementationReport:
    record = records.get(impl.plugin_name)
    function = _code_of(impl)
    code = getattr(function, "__code__", None)
    return {
        "plugin": impl.plugin_name,
        "distribution": record.distribution if record else None,
        "version": record.version if record else None,
        "function": f"{function.__module__}:{function.__qualname__}",
        "file": code.co_filename if code else None,
        "line": code.co_firstlineno if code else None,
        "tryfirst": impl.tryfirst,
        "trylast": impl.trylast,
        "wrapper": impl.wrapper,
        "hookwrapper": impl.hookwrapper,
        "optionalhook": impl.optionalhook,
        "specname": impl.opts.get("specname"),
    }


def _code_of(impl: pluggy.HookImpl) -> Callable[..., object]:
    """The function whose code runs: a seed-layout plugin's own ``register_builtins``, not
    the loader's adapter around it; the innermost of any ``functools.wraps`` decorators."""
    function: Callable[..., object] = impl.function
    if isinstance(impl.plugin, _SeedAdapter):
        function = impl.plugin.module.register_builtins
    unwrapped: Callable[..., object] = inspect.unwrap(function)
    return unwrapped
