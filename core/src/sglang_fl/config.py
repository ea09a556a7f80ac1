"""Settings from ``SGLANG_FL_*`` variables over a TOML config file over defaults.

Every value that cannot be parsed is a :class:`~sglang_fl.errors.ConfigError` naming the
variable (or file key), the value and what is allowed. Each setting remembers where it came
from, for ``sglang-fl doctor``.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._files import append_target_problem
from .dispatch.order import DEFAULT_SOURCE, NAME_HELP, TOKEN_HELP, OrderToken, is_valid_name
from .errors import ConfigError
from .ops import SELECTIONS, STANDARD_OPS, unknown_op_message
from .ops.attention import SGLANG_ATTENTION_BACKEND
from .schema import ConfigurationJson

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "DEFAULT_VERIFY_CALLS",
    "ENV_PREFIX",
    "NAME_HELP",
    "SETTINGS",
    "OrderToken",
    "Settings",
    "is_valid_name",
    "unmatched_names",
]

ENV_PREFIX = "SGLANG_FL_"
# ``SGLANG_FL_VERIFY=on`` (or ``true``/``yes``): calls checked per layer class.
DEFAULT_VERIFY_CALLS = 16
_log = logging.getLogger(__name__)
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


# One parsing rule per setting, whatever the source: a variable's text and a TOML value go
# through the same function (a TOML string is read like the variable's text; a TOML integer
# like the digits it is written with). Numbers are ASCII digits only: ``int()`` and ``float()``
# also read other scripts' digits ('٣'), superscripts fail late ('²'.isdigit() is true), and
# a 5000-digit value exceeds Python's int-conversion limit.
_ASCII_COUNT = re.compile(r"[0-9]{1,10}")
_ASCII_SECONDS = re.compile(r"(?:[0-9]{1,10}(?:\.[0-9]{0,9})?|\.[0-9]{1,9})")
_MAX_COUNT = 10**9  # the largest count a setting takes (verify calls per layer class)


def _words(raw: Any) -> str | None:
    """A variable's text, or a TOML string or integer, as the lower-case ASCII-stripped text
    the rules compare; ``None`` for any other TOML value (a list, a table, a float...)."""
    if isinstance(raw, str):
        return raw.strip(" \t\r\n").lower()
    if isinstance(raw, int) and not isinstance(raw, bool):
        return str(raw)
    return None


def _parse_bool(raw: Any, where: str) -> bool:
    """``true``/``false`` (TOML), or 1, 0, true, false, yes, no, on, off (text or TOML 1/0)."""
    if isinstance(raw, bool):
        return raw
    text = _words(raw)
    if text is not None and text in _TRUE | _FALSE:
        return text in _TRUE
    raise ConfigError(
        f"{where}={raw!r} is not a boolean; allowed: 1, 0, true, false, yes, no, on, off"
    )


def _parse_trace(raw: Any, where: str) -> bool | Path:
    """A boolean (stderr, or off) or a file path; a path must contain '/', so that a mistyped
    boolean (``ture``) is an error rather than the name of a new file."""
    if isinstance(raw, bool):
        return raw
    text = _words(raw)
    if text is not None and text in _TRUE | _FALSE:
        return text in _TRUE
    if isinstance(raw, str) and "/" in raw:
        return _expanded(raw.strip(), where)
    raise ConfigError(
        f"{where}={raw!r} is neither a boolean nor a file path; allowed: 1, 0, true, false, "
        "yes, no, or a path containing '/' (e.g. ./trace.log)"
    )


def _expanded(text: str, where: str) -> Path:
    """``Path(text).expanduser()``; a ``~user`` that does not exist is a ConfigError."""
    try:
        return Path(text).expanduser()
    except RuntimeError as exc:  # "Could not determine home directory"
        raise ConfigError(f"{where}={text!r}: cannot expand '~' ({exc})") from None


def _items(
    raw: Any, separator: str, where: str, expected: str, *, keep_empty: bool = False
) -> list[str]:
    """A list setting's entries: the text split at ``separator``, or a TOML list of strings
    (each entry read like one entry of the text); stripped, empty entries dropped."""
    items = raw.split(separator) if isinstance(raw, str) else raw
    if not isinstance(items, (list, tuple)):
        raise ConfigError(f"{where}={raw!r}: expected {expected}")
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(
                f"{where}={raw!r}: entry {item!r} is not a string; expected {expected}"
            )
    return [item.strip() for item in items if keep_empty or item.strip()]


def _parse_names(raw: Any, where: str) -> tuple[str, ...]:
    names = tuple(_items(raw, ",", where, "a comma-separated list of names"))
    for name in names:
        if not is_valid_name(name):
            raise ConfigError(f"{where}={raw!r}: {name!r} is not a valid name ({NAME_HELP})")
    return names


def _parse_order(raw: Any, where: str) -> tuple[OrderToken, ...]:
    expected = f"a non-empty list of {TOKEN_HELP}"
    items = _items(raw, ",", where, expected, keep_empty=True)
    if not items:
        raise ConfigError(f"{where}={raw!r}: expected {expected}")
    tokens = tuple(OrderToken.parse(item, where) for item in items)
    if len(set(tokens)) != len(tokens):
        raise ConfigError(f"{where}={raw!r}: a token appears twice")
    return tokens


def _parse_prefer(raw: Any, where: str) -> OrderToken | None:
    """One token; empty means unset, like the other settings' empty values."""
    if not isinstance(raw, str):
        raise ConfigError(f"{where}={raw!r}: expected one of {TOKEN_HELP}")
    return OrderToken.parse(raw, where) if raw.strip() else None


def _check_op(name: str, where: str) -> str:
    if name not in STANDARD_OPS and name not in SELECTIONS:
        raise ConfigError(f"{where}: {unknown_op_message(name)}")
    return name


def _parse_per_op(raw: Any, where: str) -> dict[str, tuple[OrderToken, ...]]:
    """``rms_norm=vendor:cuda|reference;silu_and_mul=reference`` or a TOML table of lists."""
    if isinstance(raw, Mapping):
        return {
            _check_op(op, f"{where}.{op}"): _parse_order(order, f"{where}.{op}")
            for op, order in raw.items()
        }
    if not isinstance(raw, str):
        raise ConfigError(f"{where}={raw!r}: expected 'op=token|token;op=token'")
    result: dict[str, tuple[OrderToken, ...]] = {}
    for entry in filter(None, (part.strip() for part in raw.split(";"))):
        op, sep, order = entry.partition("=")
        if not sep:
            raise ConfigError(
                f"{where}={raw!r}: entry {entry!r} has no '='; expected 'op=token|token;...' "
                f"with tokens {TOKEN_HELP}"
            )
        op = _check_op(op.strip(), where)
        if op in result:
            raise ConfigError(f"{where}={raw!r}: op {op!r} appears twice")
        result[op] = _parse_order(order.split("|"), f"{where} ({op})")
    return result


def _parse_seconds(raw: Any, where: str) -> float:
    """A positive number of seconds: ASCII digits with an optional decimal point (in a variable
    or a TOML string), or a TOML integer or float."""
    value: object = raw
    if isinstance(raw, str):
        text = raw.strip(" \t\r\n")
        value = float(text) if _ASCII_SECONDS.fullmatch(text) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
        raise ConfigError(f"{where}={raw!r}: expected a positive number of seconds, e.g. 60")
    return float(value)


def _parse_path(raw: Any, where: str) -> Path | None:
    if not isinstance(raw, str):
        raise ConfigError(f"{where}={raw!r}: expected a file path")
    return _expanded(raw, where) if raw.strip() else None


def _parse_verify(raw: Any, where: str) -> int:
    """Calls to check per layer class: a count (``0`` = off), or on/off words."""
    if isinstance(raw, bool):
        return DEFAULT_VERIFY_CALLS if raw else 0
    text = _words(raw)
    if text is not None and _ASCII_COUNT.fullmatch(text) and int(text) <= _MAX_COUNT:
        return int(text)
    if text is not None and text in _TRUE - {"1"}:
        return DEFAULT_VERIFY_CALLS
    if text is not None and text in _FALSE:
        return 0
    raise ConfigError(
        f"{where}={raw!r}: expected the number of calls to check per layer class (0 = off; "
        f"ASCII digits, at most {_MAX_COUNT}) "
        f"or on/true/yes ({DEFAULT_VERIFY_CALLS} calls), off/false/no"
    )


def _parse_ops(raw: Any, where: str) -> tuple[str, ...] | None:
    """Standard op names (comma list or TOML list); empty means every op."""
    items = _items(raw, ",", where, "a comma-separated list of op names")
    names = tuple(_check_op(item, where) for item in items)
    return names or None


def _parse_verify_ops(raw: Any, where: str) -> tuple[str, ...] | None:
    """The ops verify mode checks: names it can check, the others refused with the reason."""
    names = _parse_ops(raw, where)
    for name in names or ():
        if name in SELECTIONS:
            hint = (
                "name the ops its kernel-based backend binds instead (store_kv_cache, "
                "decode_attention, extend_attention)"
                if name == SGLANG_ATTENTION_BACKEND
                else "name the ops the graphs it captures run instead"
            )
            raise ConfigError(
                f"{where}: {name!r} is a selection (which whole backend serves), not an op: "
                f"it has no output to compare with a reference, so verify mode cannot check it; "
                f"{hint}"
            )
        if STANDARD_OPS[name].collective is not None:
            raise ConfigError(
                f"{where}: {name!r} is a collective: its reference communicates, so verify mode "
                "cannot run it beside a live call without a second exchange between the ranks; "
                "the conformance kit checks collectives on several ranks "
                "(sglang_fl.testing.collectives)"
            )
    return names


@dataclass(frozen=True)
class _Setting:
    key: str
    parse: Callable[[Any, str], Any]
    default: Any
    help: str

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()


SETTINGS: tuple[_Setting, ...] = (
    _Setting(
        "prefer",
        _parse_prefer,
        None,
        f"token ranked first for every op, before the default order ({TOKEN_HELP})",
    ),
    _Setting(
        "per_op",
        _parse_per_op,
        {},
        "per-op order replacing the default: 'rms_norm=vendor:cuda|reference;...'",
    ),
    _Setting(
        "strict",
        _parse_bool,
        False,
        "no silent fallback: plugin failures, unmet explicit choices and Unsupported raise",
    ),
    _Setting(
        "allow_vendors",
        _parse_names,
        None,
        "only implementations of these vendors are candidates (unset = all)",
    ),
    _Setting("deny_vendors", _parse_names, (), "implementations of these vendors never are"),
    _Setting(
        "plugins", _parse_names, None, "entry-point names to load (unset = all, empty = none)"
    ),
    _Setting("disable_plugins", _parse_names, (), "entry-point names never to load"),
    _Setting(
        "dispatch_log",
        _parse_path,
        None,
        "append the SGLang dispatch report as JSON lines to this file",
    ),
    _Setting(
        "plugin_timeout",
        _parse_seconds,
        60.0,
        "seconds any plugin code core calls (import, hook, probe, backend factory, "
        "communicator close) may run before it is abandoned and reported",
    ),
    _Setting(
        "trace",
        _parse_trace,
        False,
        "pluggy's hook-call trace, each line with the pid: 1 = stderr, a path = append to file",
    ),
    _Setting(
        "verify",
        _parse_verify,
        0,
        "check routed calls against the op's reference: calls per layer class (0 = off, "
        f"on = {DEFAULT_VERIFY_CALLS}); results in the dispatch log",
    ),
    _Setting(
        "verify_ops",
        _parse_verify_ops,
        None,
        "only these ops are verified (unset = all; not collectives or selections)",
    ),
    _Setting(
        "custom_ops",
        _parse_bool,
        True,
        "under torch.compile, routed ops are torch.library custom ops sglang_fl::<op> "
        "(eager calls run the implementation directly)",
    ),
)
_BY_KEY = {s.key: s for s in SETTINGS}


@dataclass(frozen=True)
class Settings:
    """The effective configuration, and where each value came from."""

    prefer: OrderToken | None = None
    per_op: Mapping[str, tuple[OrderToken, ...]] = field(default_factory=dict)
    strict: bool = False
    allow_vendors: tuple[str, ...] | None = None
    deny_vendors: tuple[str, ...] = ()
    plugins: tuple[str, ...] | None = None
    disable_plugins: tuple[str, ...] = ()
    dispatch_log: Path | None = None
    plugin_timeout: float = 60.0
    trace: bool | Path = False
    verify: int = 0
    verify_ops: tuple[str, ...] | None = None
    custom_ops: bool = True
    config_file: Path | None = None
    sources: Mapping[str, str] = field(default_factory=dict)
    # What the settings themselves warn about (an unknown SGLANG_FL_* variable, likely a typo):
    # logged when read, and listed by ``sglang-fl doctor`` as problems.
    warnings: tuple[str, ...] = ()

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Defaults, then ``SGLANG_FL_CONFIG``'s file, then the other ``SGLANG_FL_*``."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {s.key: s.default for s in SETTINGS}
        sources = {s.key: DEFAULT_SOURCE for s in SETTINGS}
        config_file = None
        warnings: list[str] = []
        raw_path = environ.get(ENV_PREFIX + "CONFIG", "").strip()
        if raw_path:
            config_file = _expanded(raw_path, ENV_PREFIX + "CONFIG")
            for key, value in _read_config_file(config_file, ENV_PREFIX + "CONFIG").items():
                values[key] = _BY_KEY[key].parse(value, f"{config_file}: {key}")
                sources[key] = f"config file {config_file}"
        known_env = {s.env for s in SETTINGS} | {ENV_PREFIX + "CONFIG"}
        for name in environ:
            if name.startswith(ENV_PREFIX) and name not in known_env:
                close = difflib.get_close_matches(name, known_env, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                warnings.append(
                    f"ignoring unknown variable {name}{hint}; known: {', '.join(sorted(known_env))}"
                )
                _log.warning("%s", warnings[-1])
        for setting in SETTINGS:
            if setting.env in environ:
                values[setting.key] = setting.parse(environ[setting.env], setting.env)
                sources[setting.key] = f"environment {setting.env}"
        if values["allow_vendors"] == ():
            warnings.append(
                f"SGLANG_FL_ALLOW_VENDORS is empty ({sources['allow_vendors']}): it excludes "
                "every vendor, leaving only core's reference backend; unset it to allow all"
            )
        return cls(**values, config_file=config_file, sources=sources, warnings=tuple(warnings))

    def dispatch_log_problem(self) -> str | None:
        """Why ``dispatch_log`` cannot be appended to, naming the variable; ``None`` if it can.

        Checked without creating anything (``sglang-fl doctor``); the dispatch report also
        opens it at start-up, which catches what a check cannot (e.g. a full disk).
        """
        if self.dispatch_log is None:
            return None
        problem = append_target_problem(self.dispatch_log)
        if problem is None:
            return None
        return (
            f"SGLANG_FL_DISPATCH_LOG={str(self.dispatch_log)!r} "
            f"({self.sources.get('dispatch_log')}): {problem}; expected a file path whose "
            "directory exists or can be created, writable"
        )

    def to_dict(self) -> ConfigurationJson:
        """JSON-able effective settings with their sources."""

        def plain(value: Any) -> Any:
            if isinstance(value, OrderToken | Path):
                return str(value)
            if isinstance(value, tuple):
                return [plain(v) for v in value]
            if isinstance(value, Mapping):
                return {k: plain(v) for k, v in value.items()}
            return value

        return {
            "config_file": None if self.config_file is None else str(self.config_file),
            "settings": {
                s.key: {
                    "value": plain(getattr(self, s.key)),
                    "source": self.sources.get(s.key),
                    "variable": s.env,
                    "help": s.help,
                }
                for s in SETTINGS
            },
        }


_NAME_LIST_SETTINGS = ("plugins", "disable_plugins", "allow_vendors", "deny_vendors")


def unmatched_names(settings: Settings, installed: Collection[str]) -> list[str]:
    """A warning, with the close match, per listed plugin or vendor name nothing installed has.

    ``installed`` are the entry-point names found; by the identity rule a vendor name is its
    plugin's entry-point name, so both kinds of list are checked against them.
    """
    warnings = []
    for key in _NAME_LIST_SETTINGS:
        names: tuple[str, ...] | None = getattr(settings, key)
        for name in names or ():
            if name in installed:
                continue
            close = difflib.get_close_matches(name, installed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            warnings.append(
                f"{_BY_KEY[key].env} ({settings.sources.get(key, key)}) names {name!r}, which "
                f"matches no installed plugin{hint}; installed: "
                f"{', '.join(sorted(installed)) or 'none'}"
            )
    return warnings


def _read_config_file(path: Path, variable: str) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{variable}={str(path)!r}: file not found") from None
    except OSError as exc:  # a directory, no permission, ...
        raise ConfigError(
            f"{variable}={str(path)!r}: cannot be read ({exc.strerror or exc})"
        ) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{variable}={str(path)!r}: not valid TOML ({exc})") from None
    except RecursionError:  # arrays or tables nested thousands deep
        raise ConfigError(
            f"{variable}={str(path)!r}: not a config file sglang-fl reads (nested too deeply)"
        ) from None
    for key in data:
        if key not in _BY_KEY:
            close = difflib.get_close_matches(key, _BY_KEY, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"{path}: unknown key {key!r}{hint}; allowed keys: {', '.join(_BY_KEY)}"
            )
    return data
