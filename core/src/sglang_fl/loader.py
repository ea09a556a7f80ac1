"""Discovers vendor plugins through the ``sglang_fl.backends`` entry points and loads them.

One scan per process. Allow/deny lists are applied to entry-point *names* before anything
is imported. A plugin that fails (import, validation, hook raising anything or not returning
within ``SGLANG_FL_PLUGIN_TIMEOUT``, refused registration) is recorded with its error and
leaves nothing registered; the others load regardless. With ``SGLANG_FL_STRICT=1`` the first
failure raises :class:`~sglang_fl.errors.PluginLoadError`. Once loading ends the registry is
sealed: registrations are accepted only from the hook of the plugin being loaded.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, distributions, entry_points
from types import FunctionType, MethodType, ModuleType
from typing import Any

import pluggy

from . import hookspecs
from . import reference as reference_backend
from ._strenum import StrEnum
from ._version import __version__
from .config import NAME_HELP, Settings, is_valid_name
from .dispatch.identity import CORE_DISTRIBUTION
from .dispatch.registry import OpRegistry
from .dispatch.types import Provenance
from .errors import PluginLoadError
from .guard import call_plugin_code, describe_exception, plain_str
from .hook_trace import trace_hook_calls
from .schema import PluginJson, PluginSummary

__all__ = [
    "ENTRY_POINT_GROUP",
    "PluginRecord",
    "PluginStatus",
    "call_plugin_hook",
    "load_plugins",
    "loading_in_this_thread",
    "new_plugin_manager",
]

ENTRY_POINT_GROUP = "sglang_fl.backends"

_log = logging.getLogger(__name__)
# Threads inside load_plugins right now, under a condition os.fork() waits on (see runtime).
_loads = threading.Condition()
_loading_threads: set[int] = set()


class PluginStatus(StrEnum):
    """How a plugin's load went, as ``sglang-fl plugins`` reports it."""

    LOADED = "loaded"  # its registrations are kept
    FAILED = "failed"  # import, validation or its hook failed: nothing of it is kept
    DISABLED = "disabled"  # left out by SGLANG_FL_PLUGINS / SGLANG_FL_DISABLE_PLUGINS: not imported


@dataclass
class PluginRecord:
    """What ``sglang-fl plugins`` reports about one plugin."""

    name: str
    module: str
    distribution: str | None
    version: str | None
    status: PluginStatus
    hooks: tuple[str, ...] = ()
    error: str | None = None
    builtin: bool = False
    details: str | None = field(default=None, repr=False)  # traceback, for --verbose

    def summary(self) -> PluginSummary:
        """Name, status, distribution, version and error: the dispatch report's columns."""
        return {
            "name": self.name,
            "status": self.status,
            "distribution": self.distribution,
            "version": self.version,
            "error": self.error,
        }

    def to_dict(self) -> PluginJson:
        """The full record, as ``sglang-fl plugins --json`` prints it."""
        return {
            **self.summary(),
            "module": self.module,
            "hooks": list(self.hooks),
            "builtin": self.builtin,
        }


class _SeedAdapter:
    """Presents a seed-layout module (``register_builtins(registry)``) as a hook plugin."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module

    @hookspecs.hookimpl
    def sglang_fl_register_ops(self, registry: OpRegistry) -> None:
        self.module.register_builtins(registry)

    def __repr__(self) -> str:
        return f"<seed plugin {self.module.__name__}>"


class _HookPlugin:
    """What pluggy registers for a hook plugin: copies of its hook functions, nothing else.

    ``pm.register()`` runs in the loading thread, unbounded; it looks up every attribute
    ``dir()`` lists (pluggy < 1.7 with ``getattr``, which runs a PEP 562 ``__getattr__`` or
    property, e.g. a lazily imported SDK) and inspects each hook function's signature (which
    follows ``__wrapped__``). So the plugin's own object is searched in the bounded import
    worker (:func:`_hook_functions`), and pluggy gets this core object, whose attributes are
    plain functions sharing the plugin's code, globals and closures: registering it runs no
    plugin code, whatever pluggy version reads it.
    """

    def __init__(self, module: object, functions: dict[str, FunctionType]) -> None:
        # Non-callables only besides the hooks: pluggy inspects every attribute it finds.
        self._origin = (module,)
        self._name = ""
        self.__dict__.update(functions)

    def __repr__(self) -> str:
        return f"<hook plugin {self._name}>"


def _origin(plugin: object) -> object:
    """The module (or object) an entry point loaded, behind the loader's adapters."""
    if isinstance(plugin, _HookPlugin):
        return plugin._origin[0]
    if isinstance(plugin, _SeedAdapter):
        return plugin.module
    return plugin


# The options of @hookimpl pluggy reads, and their types.
_HOOKIMPL_FLAGS = ("wrapper", "hookwrapper", "optionalhook", "tryfirst", "trylast")
_MAX_WRAPPED = 16  # functools.wraps layers followed (inspect.unwrap has no limit of its own)


def _hook_functions(
    pm: pluggy.PluginManager, plugin: object, name: str
) -> dict[str, FunctionType] | None:
    """The plugin's hook implementations, copied as plain functions; ``None`` if it has none.

    Runs in the import worker: every read of the plugin's attributes is plugin code. Raises
    ``TypeError`` naming a hook implementation pluggy could not register without running
    plugin code (not a plain function or method).
    """
    found: dict[str, FunctionType] = {}
    for attr in dir(plugin):
        attr_name = plain_str(attr)
        if attr_name is None or pm.parse_hookimpl_opts(plugin, attr_name) is None:
            continue
        value = getattr(plugin, attr_name)
        bound_to = None
        if isinstance(value, MethodType):
            bound_to, value = value.__self__, value.__func__
        if type(value) is not FunctionType:
            raise TypeError(
                f"hook implementation {attr_name!r} of {name!r} is a {type(value).__name__}, "
                "not a function or method"
            )
        opts = getattr(value, f"{hookspecs.PROJECT_NAME}_impl", None)
        if not isinstance(opts, dict):
            continue
        copy = _copy_function(value, attr_name, 0)
        clean: dict[str, Any] = {flag: bool(opts.get(flag)) for flag in _HOOKIMPL_FLAGS}
        clean["specname"] = plain_str(opts.get("specname"))
        setattr(copy, f"{hookspecs.PROJECT_NAME}_impl", clean)
        found[attr_name] = copy if bound_to is None else MethodType(copy, bound_to)  # type: ignore[assignment]
    return found or None


def _copy_function(fn: FunctionType, what: str, depth: int) -> FunctionType:
    """A fresh function with ``fn``'s code, globals, defaults and closure, and only the
    attributes core sets (``functools.wraps`` chains copied the same way)."""
    copy = FunctionType(
        fn.__code__, fn.__globals__, fn.__code__.co_name, fn.__defaults__, fn.__closure__
    )
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = plain_str(fn.__qualname__) or copy.__qualname__
    copy.__module__ = plain_str(fn.__module__) or "?"
    wrapped = fn.__dict__.get("__wrapped__")
    if wrapped is not None:
        if type(wrapped) is not FunctionType or depth >= _MAX_WRAPPED:
            raise TypeError(
                f"hook implementation {what!r} wraps a {type(wrapped).__name__} "
                f"(functools.wraps chains of plain functions only, at most {_MAX_WRAPPED})"
            )
        copy.__wrapped__ = _copy_function(wrapped, what, depth + 1)  # type: ignore[attr-defined]
    return copy


def new_plugin_manager(settings: Settings) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    trace_hook_calls(pm, settings.trace)
    return pm


def load_plugins(
    settings: Settings,
    registry: OpRegistry,
    pm: pluggy.PluginManager,
    *,
    tolerate_failures: bool = False,
) -> list[PluginRecord]:
    """Register the reference backend, then every selected entry point; return their records.

    Under ``settings.strict`` a failed plugin raises, unless ``tolerate_failures`` (the CLI,
    which must report every plugin, sets it and reports the failure instead).
    """
    with _loading_thread(), _loading(registry) as loader_key:
        records = [_load_reference(registry, pm, loader_key)]
        found, unreadable = _discover()
        seen: dict[str, PluginRecord] = {}
        for ep in sorted(found, key=lambda e: e.name):
            record = _load_entry_point(ep, settings, registry, pm, seen, loader_key)
            seen.setdefault(ep.name, record)
            records.append(record)
        records.extend(unreadable)
    for record in records:
        if record.status is PluginStatus.FAILED:
            _log.warning(
                "sglang-fl plugin %r from %s failed to load: %s",
                record.name,
                record.distribution,
                record.error,
            )
            if settings.strict and not tolerate_failures:
                raise PluginLoadError(
                    f"SGLANG_FL_STRICT=1: plugin {record.name!r} ({record.distribution} "
                    f"{record.version}) failed to load: {record.error}"
                )
    return records


def loading_in_this_thread() -> bool:
    """Whether the calling thread is loading plugins (so a plugin's import is running here)."""
    return threading.get_ident() in _loading_threads


@contextmanager
def _loading_thread() -> Iterator[None]:
    me = threading.get_ident()
    with _loads:
        _loading_threads.add(me)
    try:
        yield
    finally:
        with _loads:
            _loading_threads.discard(me)
            _loads.notify_all()


def hold_loads_for_fork() -> None:
    """Before a fork: wait until no other thread loads plugins, and let none start until
    :func:`release_loads_after_fork` (each load is bounded: its imports and hooks are)."""
    me = threading.get_ident()
    _loads.acquire()
    _loads.wait_for(lambda: not _loading_threads - {me})


def release_loads_after_fork() -> None:
    _loads.release()


def reset_loads_in_child(held: bool) -> bool:
    """In a forked child: fresh lock; whether a load of another (now gone) thread was cut off."""
    global _loads
    cut_off = bool(_loading_threads - {threading.get_ident()})
    _loading_threads.intersection_update({threading.get_ident()})
    _loads = threading.Condition()
    return cut_off and not held


@contextmanager
def _loading(registry: OpRegistry) -> Iterator[object]:
    """Registrations only from the plugin being loaded; none at all once loading ends.

    Yields the registry's loader key: only scopes opened with it are accepted while loading.
    """
    key = registry.begin_loading()
    try:
        yield key
    finally:
        registry.seal(key)


def _discover() -> tuple[list[EntryPoint], list[PluginRecord]]:
    """The group's entry points: one scan; per distribution only if one has broken metadata."""
    try:
        return list(entry_points(group=ENTRY_POINT_GROUP)), []
    except Exception as exc:  # one malformed entry_points.txt must not hide every plugin
        _log.warning("scanning entry points failed (%s); reading each distribution alone", exc)
    found: list[EntryPoint] = []
    unreadable: list[PluginRecord] = []
    names: set[str] = set()
    for dist in distributions():
        name = dist.metadata["Name"]
        if name in names:  # the same distribution earlier on sys.path shadows this one
            continue
        names.add(name)
        try:
            found.extend(ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP)
        except Exception as exc:
            unreadable.append(
                PluginRecord(
                    name=f"<{name}>",
                    module="entry_points.txt",
                    distribution=name,
                    version=dist.version,
                    status=PluginStatus.FAILED,
                    error=f"unreadable entry_points.txt: {type(exc).__name__}: {exc}",
                )
            )
    return found, unreadable


def _load_reference(registry: OpRegistry, pm: pluggy.PluginManager, key: object) -> PluginRecord:
    name = reference_backend.PLUGIN_NAME
    pm.register(reference_backend, name=name)
    provenance = Provenance(name, CORE_DISTRIBUTION, __version__)
    _call_register_ops(pm, reference_backend, registry, provenance, key)
    return PluginRecord(
        name=name,
        module=reference_backend.__name__,
        distribution=CORE_DISTRIBUTION,
        version=__version__,
        status=PluginStatus.LOADED,
        hooks=_hook_names(pm, reference_backend),
        builtin=True,
    )


def _load_entry_point(
    ep: EntryPoint,
    settings: Settings,
    registry: OpRegistry,
    pm: pluggy.PluginManager,
    seen: dict[str, PluginRecord],
    key: object,
) -> PluginRecord:
    distribution, version = _distribution_of(ep)
    record = PluginRecord(
        name=ep.name,
        module=ep.value,
        distribution=distribution,
        version=version,
        status=PluginStatus.LOADED,  # unless a step below fails or the settings block it
    )
    if ep.name == reference_backend.PLUGIN_NAME or ep.name in seen:
        owner = CORE_DISTRIBUTION if ep.name not in seen else seen[ep.name].distribution
        return _failed(record, f"plugin name {ep.name!r} is already taken by {owner}")
    blocked = _blocked_reason(ep.name, settings)
    if blocked is not None:
        # Blocked in pluggy too (pytest's `-p no:NAME`): nothing can register under this name.
        pm.set_blocked(ep.name)
        record.status, record.error = PluginStatus.DISABLED, blocked
        return record
    if not is_valid_name(ep.name):  # the settings could never name it to disable it
        return _failed(
            record,
            f"entry-point name {ep.name!r} is not a valid plugin name ({NAME_HELP}); "
            "SGLANG_FL_DISABLE_PLUGINS could not name it, so it is not loaded",
        )

    try:
        return _import_and_register(ep, settings, registry, pm, record, key)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        if pm.has_plugin(ep.name):
            pm.unregister(name=ep.name)
        return _failed(
            record,
            f"registering {ep.value!r} failed: {describe_exception(exc)}",
            traceback.format_exc(),
        )


def _import_and_register(
    ep: EntryPoint,
    settings: Settings,
    registry: OpRegistry,
    pm: pluggy.PluginManager,
    record: PluginRecord,
    key: object,
) -> PluginRecord:
    """Import the plugin, check its hooks and run its registration hook.

    The import and the hook are plugin code: each runs in a worker thread waited for at most
    ``SGLANG_FL_PLUGIN_TIMEOUT`` seconds (:func:`~sglang_fl.guard.call_plugin_code`).
    """
    timeout = settings.plugin_timeout
    imported = call_plugin_code(
        lambda: _import_plugin(ep, pm), what=f"the import of plugin {ep.name!r}", timeout=timeout
    )
    if imported.timed_out:
        return _failed(
            record,
            f"import of {ep.value!r} did not finish within {timeout:g} s "
            "(SGLANG_FL_PLUGIN_TIMEOUT); abandoned",
        )
    if imported.error is not None:  # sys.exit(), GeneratorExit, ...: its failure, not the host's
        return _failed(
            record,
            f"import of {ep.value!r} failed: {describe_exception(imported.error)}",
            imported.details,
        )
    plugin = imported.value
    if isinstance(plugin, _HookPlugin):
        plugin._name = ep.name
    if plugin is None:
        return _failed(
            record,
            f"{ep.value!r} defines no @sglang_fl.hookimpl functions and no "
            "register_builtins(registry)",
        )
    twin = next((p for p in pm.get_plugins() if _origin(p) is _origin(plugin)), None)
    if twin is not None:  # two entry points naming one module
        return _failed(
            record,
            f"{ep.value!r} is already loaded as plugin {pm.get_name(twin)!r}: one module can "
            "be one plugin only (remove the duplicate entry point)",
        )
    try:
        pm.register(plugin, name=ep.name)
    except pluggy.PluginValidationError as exc:
        # pluggy < 1.7 keeps the hooks it added before the invalid one: remove those too.
        if pm.is_registered(plugin):
            pm.unregister(plugin)
        return _failed(record, f"invalid hook implementation: {describe_exception(exc)}")
    # pluggy's rule: an ``optionalhook=True`` implementation may match no specification (a
    # hook of a newer sglang-fl); ``sglang-fl hooks`` lists it as unmatched.
    unknown = [
        h.name
        for h in pm.get_hookcallers(plugin) or ()
        if not h.has_spec()
        and not all(i.optionalhook for i in h.get_hookimpls() if i.plugin is plugin)
    ]
    if unknown:
        pm.unregister(plugin)
        known = ", ".join(sorted(n for n in dir(hookspecs) if n.startswith("sglang_fl_")))
        return _failed(record, f"unknown hook(s) {', '.join(unknown)}; known hooks: {known}")

    provenance = Provenance(ep.name, record.distribution or "<unknown>", record.version or "")
    outcome = call_plugin_code(
        lambda: _call_register_ops(pm, plugin, registry, provenance, key),
        what=f"sglang_fl_register_ops of plugin {ep.name!r}",
        timeout=timeout,
    )
    if outcome.timed_out:
        registry.abandon_scope(provenance, key)  # whatever it registers later is refused
        pm.unregister(plugin)
        return _failed(
            record,
            f"sglang_fl_register_ops did not return within {timeout:g} s "
            f"(SGLANG_FL_PLUGIN_TIMEOUT); abandoned, nothing of it is kept",
        )
    if outcome.error is not None:
        pm.unregister(plugin)
        return _failed(
            record,
            f"sglang_fl_register_ops raised {describe_exception(outcome.error)}",
            outcome.details,
        )
    record.hooks = _hook_names(pm, plugin)
    return record


def _import_plugin(ep: EntryPoint, pm: pluggy.PluginManager) -> _HookPlugin | _SeedAdapter | None:
    """The entry point's hook plugin (a seed module adapted), or ``None`` if it has no hooks.

    Plugin code runs here (the module's import, a PEP 562 ``__getattr__``), so the loader
    calls it through :func:`~sglang_fl.guard.call_plugin_code`.
    """
    loaded = ep.load()
    functions = _hook_functions(pm, loaded, ep.name)
    if functions is not None:
        return _HookPlugin(loaded, functions)
    if callable(getattr(loaded, "register_builtins", None)):
        return _SeedAdapter(loaded)
    return None


def _distribution_of(ep: EntryPoint) -> tuple[str | None, str | None]:
    """The entry point's distribution name and version; ``None`` where its metadata lacks them."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None, None
    try:
        name, version = dist.metadata["Name"], dist.version
    except Exception:  # unreadable METADATA: the plugin is still reported, under its name
        return None, None
    return (name if isinstance(name, str) else None), (
        version if isinstance(version, str) else None
    )


def _blocked_reason(name: str, settings: Settings) -> str | None:
    """Why the settings leave the entry point ``name`` out, or ``None`` to load it."""
    if settings.plugins is not None and name not in settings.plugins:
        return f"not in SGLANG_FL_PLUGINS ({settings.sources['plugins']})"
    if name in settings.disable_plugins:
        return f"listed in SGLANG_FL_DISABLE_PLUGINS ({settings.sources['disable_plugins']})"
    return None


def _failed(record: PluginRecord, error: str, details: str | None = None) -> PluginRecord:
    record.status, record.error, record.details = PluginStatus.FAILED, error, details
    return record


def _hook_names(pm: pluggy.PluginManager, plugin: object) -> tuple[str, ...]:
    return tuple(sorted(h.name for h in pm.get_hookcallers(plugin) or ()))


def call_plugin_hook(
    pm: pluggy.PluginManager, plugin: object, hook_name: str, **kwargs: object
) -> Any:
    """Call ``plugin``'s implementation of ``hook_name`` alone and return what pluggy returns.

    Goes through pluggy (a subset hook caller), so tracing shows the call; used where one
    plugin's failure must be told apart from the others'.
    """
    others = [p for p in pm.get_plugins() if p is not plugin]
    return pm.subset_hook_caller(hook_name, remove_plugins=others)(**kwargs)


def _call_register_ops(
    pm: pluggy.PluginManager,
    plugin: object,
    registry: OpRegistry,
    provenance: Provenance,
    key: object,
) -> None:
    with registry.plugin_scope(provenance, loader_key=key):
        call_plugin_hook(pm, plugin, "sglang_fl_register_ops", registry=registry)
