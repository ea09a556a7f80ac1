"""Throwaway plugin distributions that attack the loader, the registry and the probes.

Each distribution is a real project (``pyproject.toml`` + a package under ``src/``) built into a
wheel and installed with ``pip --target``, so that the loader finds its entry points through
``importlib.metadata`` exactly as it finds an installed vendor. Sources are plain strings; the
tests in ``test_hardening_loading.py`` say what each attack must end in.

The hooks that would wait forever wait for ``HOSTILE_HOLD`` seconds instead (long enough to pass
``SGLANG_FL_PLUGIN_TIMEOUT`` in the tests, short enough that a regression shows up as a timeout
of the test's subprocess rather than as a stuck CI job).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

HOLD_S = 600  # "forever" for the hooks and probes that never answer

PYPROJECT = """
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "{version}"
requires-python = ">=3.10"
dependencies = ["sglang-fl>=0.1,<0.2"]

[project.entry-points."sglang_fl.backends"]
{entry_points}

[tool.setuptools.packages.find]
where = ["src"]
"""


@dataclass(frozen=True)
class Distribution:
    """One project: its name, version, entry points (name -> object) and package files."""

    name: str
    version: str
    entry_points: dict[str, str]
    files: dict[str, str]  # path under src/ -> source

    def write(self, root: Path) -> Path:
        project = root / self.name
        for relative, source in self.files.items():
            path = project / "src" / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(source).replace("HOLD_S", str(HOLD_S)))
        lines = "\n".join(f'"{name}" = "{value}"' for name, value in self.entry_points.items())
        (project / "pyproject.toml").write_text(
            PYPROJECT.format(name=self.name, version=self.version, entry_points=lines)
        )
        return project


# -- a well-behaved vendor: the one that must keep loading whatever the others do ----------------

GOODCHIP = Distribution(
    "sglang-fl-goodchip",
    "1.0.0",
    {"goodchip": "goodchip_plugin"},
    {
        "goodchip_plugin/__init__.py": """
        from sglang_fl.types import BackendImplKind, OpImpl, hookimpl


        def silu_and_mul(obj, x):
            return "goodchip"


        @hookimpl
        def sglang_fl_register_ops(registry):
            registry.register(OpImpl("silu_and_mul", "vendor.goodchip", BackendImplKind.VENDOR,
                                     silu_and_mul, "goodchip"))
        """,
    },
)

# -- group 1: imports and hooks that raise, re-enter or wait ------------------------------------

_REGISTERS_ONE = """
from sglang_fl.types import BackendImplKind, OpImpl, hookimpl


def gelu_and_mul(obj, x):
    return "{name}"


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl("gelu_and_mul", "vendor.{name}", BackendImplKind.VENDOR,
                             gelu_and_mul, "{name}"))
"""

_RAISES_IN_HOOK = """
import sys

from sglang_fl.types import hookimpl


class PluginBaseError(BaseException):
    pass


@hookimpl
def sglang_fl_register_ops(registry):
    {statement}
"""

HOOKS = Distribution(
    "sglang-fl-hostile-hooks",
    "0.1.0",
    {
        # Two entry points naming one module: the second must fail, the first load (the
        # module registers under the first one's name, as the identity rule asks).
        "dup_a": "hostile_hooks.dup",
        "dup_b": "hostile_hooks.dup",
        "lazy_sdk": "hostile_hooks.lazy_sdk",
        "lazy_seed": "hostile_hooks.lazy_seed",
        "genexit_hook": "hostile_hooks.genexit_hook",
        "genexit_import": "hostile_hooks.genexit_import",
        "sysexit_hook": "hostile_hooks.sysexit_hook",
        "baseexc_hook": "hostile_hooks.baseexc_hook",
        "badstr_hook": "hostile_hooks.badstr_hook",
        "thread_register": "hostile_hooks.thread_register",
        "runtime_in_hook": "hostile_hooks.runtime_in_hook",
        "runtime_at_import": "hostile_hooks.runtime_at_import",
        "runtime_in_thread": "hostile_hooks.runtime_in_thread",
        "sleeper": "hostile_hooks.sleeper",
        "import_sleeper": "hostile_hooks.import_sleeper",
        "import_joins_runtime": "hostile_hooks.import_joins_runtime",
        "reset_in_hook": "hostile_hooks.reset_in_hook",
    },
    {
        "hostile_hooks/__init__.py": "",
        "hostile_hooks/dup.py": _REGISTERS_ONE.format(name="dup_a"),
        # PEP 562: every attribute the module lacks is looked up in an SDK that is not installed.
        "hostile_hooks/lazy_sdk.py": _REGISTERS_ONE.format(name="lazy_sdk")
        + """

def __getattr__(name):
    import hostile_missing_sdk  # not installed

    return getattr(hostile_missing_sdk, name)
""",
        "hostile_hooks/lazy_seed.py": """
def __getattr__(name):
    import hostile_missing_sdk  # not installed: even register_builtins is looked up there

    return getattr(hostile_missing_sdk, name)
""",
        "hostile_hooks/genexit_hook.py": _RAISES_IN_HOOK.format(statement="raise GeneratorExit"),
        "hostile_hooks/genexit_import.py": "raise GeneratorExit('at import')\n",
        "hostile_hooks/sysexit_hook.py": _RAISES_IN_HOOK.format(statement="sys.exit(3)"),
        "hostile_hooks/baseexc_hook.py": _RAISES_IN_HOOK.format(
            statement="raise PluginBaseError('not an Exception')"
        ),
        "hostile_hooks/badstr_hook.py": """
from sglang_fl.types import hookimpl


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no text for you")


@hookimpl
def sglang_fl_register_ops(registry):
    raise Unprintable()
""",
        "hostile_hooks/thread_register.py": """
import threading

from sglang_fl.types import BackendImplKind, OpImpl, hookimpl


def gelu_and_mul(obj, x):
    return "thread_register"


@hookimpl
def sglang_fl_register_ops(registry):
    def work():
        try:
            registry.register(OpImpl("gelu_and_mul", "vendor.thread_register",
                                     BackendImplKind.VENDOR, gelu_and_mul, "thread_register"))
        except Exception:
            pass  # swallowed on purpose: the refusal must still fail the plugin

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
""",
        "hostile_hooks/runtime_in_hook.py": """
import sglang_fl
from sglang_fl.types import hookimpl


@hookimpl
def sglang_fl_register_ops(registry):
    sglang_fl.get_runtime()
""",
        "hostile_hooks/runtime_at_import.py": """
import sglang_fl
from sglang_fl.types import hookimpl

RUNTIME = sglang_fl.get_runtime()


@hookimpl
def sglang_fl_register_ops(registry):
    pass
""",
        "hostile_hooks/runtime_in_thread.py": """
import threading

import sglang_fl
from sglang_fl.types import hookimpl


@hookimpl
def sglang_fl_register_ops(registry):
    worker = threading.Thread(target=sglang_fl.get_runtime)
    worker.start()
    worker.join()
""",
        "hostile_hooks/import_sleeper.py": """
import time

from sglang_fl.types import hookimpl

time.sleep(HOLD_S)


@hookimpl
def sglang_fl_register_ops(registry):
    pass
""",
        # The import waits for a thread that waits for the runtime being loaded.
        "hostile_hooks/import_joins_runtime.py": """
import threading

import sglang_fl
from sglang_fl.types import hookimpl

_worker = threading.Thread(target=sglang_fl.get_runtime)
_worker.start()
_worker.join()


@hookimpl
def sglang_fl_register_ops(registry):
    pass
""",
        "hostile_hooks/reset_in_hook.py": """
from sglang_fl import runtime
from sglang_fl.types import hookimpl


@hookimpl
def sglang_fl_register_ops(registry):
    runtime.reset_runtime()
""",
        "hostile_hooks/sleeper.py": """
import time

from sglang_fl.types import hookimpl


@hookimpl
def sglang_fl_register_ops(registry):
    time.sleep(HOLD_S)
""",
    },
)

# -- group 2: availability probes that raise oddly, exit, re-enter or never answer --------------

_PROBED = """
import sys
import time

import sglang_fl
from sglang_fl.types import Availability, BackendImplKind, OpImpl, hookimpl


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no text for you")


class Unrepresentable:
    def __repr__(self):
        raise RuntimeError("no repr for you")


def resolves():
    return bool(sglang_fl.get_runtime().resolve("rms_norm"))


def badstr():
    raise Unprintable()


def exits():
    sys.exit(0)


def genexit():
    raise GeneratorExit


def odd_answer():
    return Unrepresentable()


def blocks():
    time.sleep(HOLD_S)
    return True


class Shifty(Availability):
    def __getattribute__(self, name):
        if name == "available":
            raise RuntimeError("no answer for you")
        return super().__getattribute__(name)


def shifty():
    return Shifty(True, "maybe")


PROBES = {
    "resolves": resolves,
    "badstr": badstr,
    "exits": exits,
    "genexit": genexit,
    "odd_answer": odd_answer,
    "blocks": blocks,
    "shifty": shifty,
}


def silu_and_mul(obj, x):
    return "probed"


@hookimpl
def sglang_fl_register_ops(registry):
    for name, probe in PROBES.items():
        registry.register(OpImpl("silu_and_mul", f"vendor.probed.{name}", BackendImplKind.VENDOR,
                                 silu_and_mul, "probed", priority=1000, available=probe))
"""

PROBES = Distribution(
    "sglang-fl-hostile-probes", "0.1.0", {"probed": "hostile_probes"},
    {"hostile_probes/__init__.py": _PROBED},
)  # fmt: skip
PROBE_IDS = ("resolves", "badstr", "exits", "genexit", "odd_answer", "blocks", "shifty")

# -- group 3: registrations outside the plugin's own load ----------------------------------------

# ``aa_latecomer`` sorts first: its import starts a thread that keeps trying to register, and
# to open a scope as core's reference, while the other plugins load and after loading ended;
# its hook keeps the registry and then fails. ``zz_innocent`` loads last, slowly, so the
# attacker's attempts land inside its scope: they must neither count as its registrations nor
# fail it. Every refusal the attacker meets is recorded in ``REFUSALS``.
_LATECOMER = """
import threading
import time

from sglang_fl.dispatch.types import Provenance
from sglang_fl.types import BackendImplKind, OpImpl, hookimpl

KEPT = []
REFUSALS = []
ACCEPTED = []
STOP = threading.Event()


def silu_and_mul(obj, x):
    return "latecomer"


def attempt(registry):
    impl = OpImpl("silu_and_mul", "vendor.aa_latecomer", BackendImplKind.VENDOR, silu_and_mul,
                  "aa_latecomer", priority=10_000)
    try:
        registry.register(impl)
        ACCEPTED.append("register")
    except Exception as exc:
        REFUSALS.append(f"register: {type(exc).__name__}: {exc}")
    try:
        with registry.plugin_scope(Provenance("reference", "sglang-fl", "0.1.0")):
            registry.register(impl)
        ACCEPTED.append("scope")
    except Exception as exc:
        REFUSALS.append(f"scope: {type(exc).__name__}: {exc}")


def keep_trying():
    while not STOP.is_set():
        if KEPT:
            attempt(KEPT[0])
        time.sleep(0.01)


threading.Thread(target=keep_trying, daemon=True).start()


@hookimpl
def sglang_fl_register_ops(registry):
    KEPT.append(registry)
    raise RuntimeError("aa_latecomer fails on purpose; its thread lives on")
"""

_INNOCENT = """
import time

from sglang_fl.types import BackendImplKind, OpImpl, hookimpl


def rms_norm(obj, x, residual=None):
    return "innocent"


@hookimpl
def sglang_fl_register_ops(registry):
    time.sleep(0.5)  # the latecomer's thread keeps trying meanwhile
    registry.register(OpImpl("rms_norm", "vendor.zz_innocent", BackendImplKind.VENDOR, rms_norm,
                             "zz_innocent"))
"""

# A plugin that stamps core's provenance on its own registration: the loader's wins.
_FORGER = """
from sglang_fl.dispatch.types import Provenance
from sglang_fl.types import BackendImplKind, OpImpl, hookimpl


def gelu_new(obj, x):
    return "forger"


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl("gelu_new", "vendor.forger", BackendImplKind.VENDOR,
                             gelu_new, "forger",
                             provenance=Provenance("reference", "sglang-fl", "0.1.0")))
"""

# A plugin that opens a scope of its own, as core's reference, inside its hook.
_NESTED_SCOPE = """
from sglang_fl.dispatch.types import Provenance
from sglang_fl.types import BackendImplKind, OpImpl, hookimpl


def gelu_new(obj, x):
    return "nested"


@hookimpl
def sglang_fl_register_ops(registry):
    with registry.plugin_scope(Provenance("reference", "sglang-fl", "0.1.0")):
        registry.register(OpImpl("gelu_new", "vendor.nested_scope", BackendImplKind.VENDOR,
                                 gelu_new, "nested_scope"))
"""

REGISTRARS = Distribution(
    "sglang-fl-hostile-registrars",
    "0.1.0",
    {
        "aa_latecomer": "hostile_registrars.latecomer",
        "forger": "hostile_registrars.forger",
        "nested_scope": "hostile_registrars.nested_scope",
        "zz_innocent": "hostile_registrars.innocent",
    },
    {
        "hostile_registrars/__init__.py": "",
        "hostile_registrars/latecomer.py": _LATECOMER,
        "hostile_registrars/innocent.py": _INNOCENT,
        "hostile_registrars/forger.py": _FORGER,
        "hostile_registrars/nested_scope.py": _NESTED_SCOPE,
    },
)

# -- group 6: a plugin whose import takes a while, for forking in the middle of it ---------------

_SLOW_IMPORT = """
import os
import time
from pathlib import Path

from sglang_fl.types import BackendImplKind, OpImpl, hookimpl

Path(os.environ["SLOW_IMPORT_STARTED"]).touch()  # the test forks from now on
time.sleep(float(os.environ.get("SLOW_IMPORT_S", "1")))


def silu_and_mul(obj, x):
    return "slowimport"


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl("silu_and_mul", "vendor.slowimport", BackendImplKind.VENDOR,
                             silu_and_mul, "slowimport"))
"""

SLOW_IMPORT = Distribution(
    "sglang-fl-slowimport", "0.1.0", {"slowimport": "slowimport_plugin"},
    {"slowimport_plugin/__init__.py": _SLOW_IMPORT},
)  # fmt: skip

# A plugin whose import forks a child that uses sglang-fl, in the middle of the parent's load:
# the child must get a clear error (twice: in the forking thread, and in a fresh thread), never
# hang on the parent's locks. The child writes what it got to $FORKER_REPORT as JSON.
_FORKER = """
import json
import os
import threading
import time

import sglang_fl
from sglang_fl.guard import describe_exception
from sglang_fl.types import hookimpl


def outcome():
    try:
        sglang_fl.get_runtime()
    except Exception as exc:
        return describe_exception(exc)
    return "loaded"


pid = os.fork()
if pid == 0:
    report = {"forking_thread": outcome()}
    fresh = threading.Thread(target=lambda: report.update(fresh_thread=outcome()))
    fresh.start()
    fresh.join(30)
    with open(os.environ["FORKER_REPORT"], "w") as handle:
        json.dump(report, handle)
    os._exit(0)
deadline = time.monotonic() + 30
while time.monotonic() < deadline and os.waitpid(pid, os.WNOHANG) == (0, 0):
    time.sleep(0.02)


@hookimpl
def sglang_fl_register_ops(registry):
    pass
"""

FORKER = Distribution(
    "sglang-fl-forker", "0.1.0", {"forker": "forker_plugin"},
    {"forker_plugin/__init__.py": _FORKER},
)  # fmt: skip
