"""The loader over real entry points: distributions written to disk and found on ``sys.path``."""

from __future__ import annotations

import logging

import pytest

from sglang_fl import PluginLoadError
from sglang_fl.config import Settings
from sglang_fl.dispatch.types import BackendImplKind
from sglang_fl.loader import CORE_DISTRIBUTION, ENTRY_POINT_GROUP
from sglang_fl.runtime import Runtime

HOOK_PLUGIN = """
from sglang_fl import hookimpl
from sglang_fl.dispatch.types import BackendImplKind, OpImpl

def silu_and_mul(obj, x):
    return "{name}"

def rms_norm(obj, x, residual=None):
    return "{name}"

@hookimpl
def sglang_fl_register_ops(registry):
    registry.register_many([
        OpImpl(op_name="silu_and_mul", impl_id="vendor.{name}", kind=BackendImplKind.VENDOR,
               fn=silu_and_mul, vendor="{name}", priority={priority}),
        OpImpl(op_name="rms_norm", impl_id="vendor.{name}", kind=BackendImplKind.VENDOR,
               fn=rms_norm, vendor="{name}", priority={priority}),
    ])
"""

SEED_PLUGIN = """
import functools
from sglang_fl.dispatch.backends import Backend
from sglang_fl.dispatch.types import OpImpl, BackendImplKind, BackendPriority

class MyChipBackend(Backend):
    _available = None

    @property
    def name(self):
        return "my_chip"

    def is_available(self):
        return True

    def silu_and_mul(self, obj, x):
        return "seed"

    def rms_norm(self, obj, x, residual=None):
        return "seed"

def _bind_is_available(fn, is_available_fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    wrapper._is_available = is_available_fn
    return wrapper

def register_builtins(registry) -> None:
    backend = MyChipBackend()
    is_avail = backend.is_available
    registry.register_many([
        OpImpl(op_name=op, impl_id="vendor.my_chip", kind=BackendImplKind.VENDOR,
               fn=_bind_is_available(getattr(backend, op), is_avail), vendor="my_chip",
               priority=BackendPriority.VENDOR)
        for op in ("silu_and_mul", "rms_norm")
    ])
"""


def hook_plugin(name: str, priority: int = 100) -> str:
    return HOOK_PLUGIN.format(name=name, priority=priority)


def load(**env: str) -> Runtime:
    settings = Settings.from_environment({f"SGLANG_FL_{k.upper()}": v for k, v in env.items()})
    return Runtime(settings)


def impl_ids(runtime: Runtime, op: str) -> list[str]:
    return [i.impl_id for i in runtime.registry.implementations(op)]


def all_impls(runtime: Runtime):
    return [i for op in runtime.registry.ops() for i in runtime.registry.implementations(op)]


# -- discovery and provenance ---------------------------------------------------------------------


def test_entry_point_group_name():
    assert ENTRY_POINT_GROUP == "sglang_fl.backends"


def test_reference_backend_is_loaded_through_the_hook():
    runtime = load(plugins="")
    ref = runtime.plugin("reference")
    assert ref.status == "loaded"
    assert ref.builtin is True
    assert ref.distribution == CORE_DISTRIBUTION == "sglang-fl"
    assert ref.hooks == ("sglang_fl_register_ops",)
    for op in runtime.registry.ops():
        (impl,) = runtime.registry.implementations(op)
        assert impl.impl_id == f"reference.{op}"
        assert impl.kind is BackendImplKind.REFERENCE
        assert (impl.provenance.plugin, impl.provenance.distribution) == ("reference", "sglang-fl")


def test_hookimpl_plugin_is_discovered_and_stamped(plugin_site):
    plugin_site.plugin("acme", hook_plugin("acme"), version="3.1.4")
    runtime = load(plugins="acme")
    record = runtime.plugin("acme")
    assert record.status == "loaded", record.error
    assert record.distribution == "sglang-fl-acme"
    assert record.version == "3.1.4"
    assert record.module == plugin_site.module_name("acme")
    assert record.hooks == ("sglang_fl_register_ops",)
    assert record.error is None
    assert record.builtin is False
    assert impl_ids(runtime, "silu_and_mul") == ["reference.silu_and_mul", "vendor.acme"]
    for impl in all_impls(runtime):
        prov = impl.provenance
        if impl.impl_id == "vendor.acme":
            assert (prov.plugin, prov.distribution, prov.version) == (
                "acme",
                "sglang-fl-acme",
                "3.1.4",
            )
        else:
            assert (prov.plugin, prov.distribution) == ("reference", "sglang-fl")
    chosen = runtime.resolve("silu_and_mul")
    assert chosen.decision.chosen.impl_id == "vendor.acme"
    assert chosen.fn(None, None) == "acme"


def test_every_registered_impl_has_provenance_of_a_loaded_plugin(plugin_site):
    plugin_site.plugin("acme", hook_plugin("acme"))
    plugin_site.plugin("my_chip", SEED_PLUGIN)
    runtime = load()
    loaded = {(p.name, p.distribution, p.version) for p in runtime.plugins if p.status == "loaded"}
    assert {"acme", "my_chip", "reference"} <= {name for name, _, _ in loaded}
    for impl in all_impls(runtime):
        prov = impl.provenance
        assert prov is not None
        assert (prov.plugin, prov.distribution, prov.version) in loaded


def test_seed_style_plugin(plugin_site):
    plugin_site.plugin("my_chip", SEED_PLUGIN)
    runtime = load(plugins="my_chip")
    record = runtime.plugin("my_chip")
    assert record.status == "loaded", record.error
    assert record.hooks == ("sglang_fl_register_ops",)
    resolution = runtime.resolve("rms_norm")
    assert resolution.decision.chosen.impl_id == "vendor.my_chip"
    assert resolution.decision.chosen.provenance.distribution == "sglang-fl-my_chip"
    assert resolution.fn(None, None) == "seed"
    assert "probe reported available" in resolution.decision.candidates[0].availability.reason


def test_module_with_neither_hooks_nor_register_builtins(plugin_site):
    plugin_site.plugin("empty", "X = 1\n")
    record = load(plugins="empty").plugin("empty")
    assert record.status == "failed"
    assert "defines no @sglang_fl.hookimpl functions and no register_builtins" in record.error


def test_entry_point_naming_an_attribute(plugin_site):
    module = plugin_site.module_name("attr")
    plugin_site.add(
        "sglang-fl-attr",
        {"attr": f"{module}:plugin"},
        {
            module: """
from sglang_fl import hookimpl

class _Plugin:
    @hookimpl
    def sglang_fl_platform(self):
        return "attr.platform:AttrPlatform"

plugin = _Plugin()
"""
        },
    )
    runtime = load(plugins="attr")
    assert runtime.plugin("attr").status == "loaded"
    assert runtime.platform() == "attr.platform:AttrPlatform"


# -- failures -------------------------------------------------------------------------------------


def test_import_error_is_recorded_and_others_load(plugin_site, caplog):
    plugin_site.plugin("broken", "import sglang_fl_no_such_sdk\n")
    plugin_site.plugin("acme", hook_plugin("acme"))
    with caplog.at_level(logging.WARNING, logger="sglang_fl.loader"):
        runtime = load(plugins="broken,acme")
    broken = runtime.plugin("broken")
    assert broken.status == "failed"
    assert broken.distribution == "sglang-fl-broken"
    assert f"import of {plugin_site.module_name('broken')!r} failed" in broken.error
    assert "ModuleNotFoundError" in broken.error
    assert "sglang_fl_no_such_sdk" in broken.error
    assert "Traceback" in broken.details
    assert runtime.plugin("acme").status == "loaded"
    assert "'broken' from sglang-fl-broken failed to load" in caplog.text


def test_plugin_exiting_at_import_does_not_end_the_host(plugin_site):
    plugin_site.plugin("quitter", "import sys\nsys.exit('no chip, bye')\n")
    plugin_site.plugin("acme", hook_plugin("acme"))
    runtime = load(plugins="quitter,acme")
    quitter = runtime.plugin("quitter")
    assert quitter.status == "failed"
    assert "SystemExit: no chip, bye" in quitter.error
    assert runtime.plugin("acme").status == "loaded"


def test_malformed_entry_points_of_one_distribution_hide_no_plugin(plugin_site, caplog):
    plugin_site.plugin("acme", hook_plugin("acme"))
    broken = plugin_site.root / "sglang_fl_mangled-1.0.dist-info"
    broken.mkdir()
    (broken / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: sglang-fl-mangled\nVersion: 1.0\n"
    )
    (broken / "entry_points.txt").write_text("[sglang_fl.backends]\nthis line has no equals sign\n")
    with caplog.at_level(logging.WARNING, logger="sglang_fl.loader"):
        runtime = load()
    assert runtime.plugin("acme").status == "loaded"
    assert "vendor.acme" in impl_ids(runtime, "rms_norm")
    mangled = runtime.plugin("<sglang-fl-mangled>")
    assert mangled.status == "failed"
    assert mangled.distribution == "sglang-fl-mangled"
    assert mangled.error.startswith("unreadable entry_points.txt: ")
    assert "scanning entry points failed" in caplog.text


def test_malformed_entry_points_fail_under_strict(plugin_site):
    broken = plugin_site.root / "sglang_fl_mangled-1.0.dist-info"
    broken.mkdir()
    (broken / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: sglang-fl-mangled\nVersion: 1.0\n"
    )
    (broken / "entry_points.txt").write_text("[sglang_fl.backends]\nno equals sign\n")
    with pytest.raises(PluginLoadError, match=r"sglang-fl-mangled.*unreadable entry_points\.txt"):
        load(strict="1")


def test_wrong_hookimpl_argument_name(plugin_site):
    plugin_site.plugin(
        "typo",
        """
from sglang_fl import hookimpl

@hookimpl
def sglang_fl_platform():
    return "typo.platform:TypoPlatform"

@hookimpl
def sglang_fl_register_ops(registy):
    raise AssertionError("never called")
""",
    )
    runtime = load(plugins="typo")
    record = runtime.plugin("typo")
    assert record.status == "failed"
    assert record.error.startswith("invalid hook implementation:")
    assert "registy" in record.error
    # Nothing of the plugin stays in pluggy: its valid platform hook is not consulted.
    assert runtime.platform() is None
    assert runtime.plugin_manager.get_plugin("typo") is None


def test_unknown_hook_name(plugin_site):
    plugin_site.plugin(
        "unknown",
        """
from sglang_fl import hookimpl
from sglang_fl.dispatch.types import BackendImplKind, OpImpl

def silu(obj, x):
    return x

@hookimpl
def sglang_fl_register_op(registry):
    raise AssertionError("never called")

@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl(op_name="silu_and_mul", impl_id="vendor.unknown",
                             kind=BackendImplKind.VENDOR, fn=silu, vendor="unknown"))
""",
    )
    runtime = load(plugins="unknown")
    record = runtime.plugin("unknown")
    assert record.status == "failed"
    assert "unknown hook(s) sglang_fl_register_op" in record.error
    assert (
        "known hooks: sglang_fl_attention_backend, sglang_fl_communicator, "
        "sglang_fl_graph_runner, sglang_fl_platform, sglang_fl_register_ops" in record.error
    )
    assert impl_ids(runtime, "silu_and_mul") == ["reference.silu_and_mul"]
    assert runtime.plugin_manager.get_plugin("unknown") is None


def test_hook_raising_rolls_back_its_registrations(plugin_site):
    plugin_site.plugin(
        "raiser",
        """
from sglang_fl import hookimpl
from sglang_fl.dispatch.types import BackendImplKind, OpImpl

def silu(obj, x):
    return x

@hookimpl
def sglang_fl_platform():
    return "raiser.platform:P"

@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl(op_name="silu_and_mul", impl_id="vendor.raiser",
                             kind=BackendImplKind.VENDOR, fn=silu, vendor="raiser"))
    raise RuntimeError("chip firmware too old")
""",
    )
    plugin_site.plugin("acme", hook_plugin("acme"))
    runtime = load(plugins="raiser,acme")
    record = runtime.plugin("raiser")
    assert record.status == "failed"
    assert record.error == "sglang_fl_register_ops raised RuntimeError: chip firmware too old"
    assert "vendor.raiser" not in impl_ids(runtime, "silu_and_mul")
    assert runtime.registry.owner("vendor.raiser") is None
    assert runtime.platform() is None  # a failed plugin's other hooks are gone too
    assert runtime.plugin("acme").status == "loaded"
    assert "vendor.acme" in impl_ids(runtime, "silu_and_mul")


def test_bad_registration_rolls_back_and_others_load(plugin_site):
    plugin_site.plugin(
        "badsig",
        """
from sglang_fl import hookimpl
from sglang_fl.dispatch.types import BackendImplKind, OpImpl

def silu(obj, x):
    return x

def rms(obj, x, res=None):
    return x

@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl(op_name="silu_and_mul", impl_id="vendor.badsig",
                             kind=BackendImplKind.VENDOR, fn=silu, vendor="badsig"))
    try:
        registry.register(OpImpl(op_name="rms_norm", impl_id="vendor.badsig",
                                 kind=BackendImplKind.VENDOR, fn=rms, vendor="badsig"))
    except Exception:
        pass  # swallowing the refusal does not save the plugin
""",
    )
    plugin_site.plugin("acme", hook_plugin("acme"))
    runtime = load(plugins="badsig,acme")
    record = runtime.plugin("badsig")
    assert record.status == "failed"
    assert "RegistrationError" in record.error
    assert "for op 'rms_norm'" in record.error
    assert "expected rms_norm(obj, x, residual=None)" in record.error
    for op in runtime.registry.ops():
        assert not any(i.startswith("vendor.badsig") for i in impl_ids(runtime, op))
    assert runtime.plugin("acme").status == "loaded"


def test_impl_id_owned_by_another_distribution(plugin_site):
    plugin_site.plugin("acme", hook_plugin("acme"))
    plugin_site.plugin(
        "zz_thief",
        """
from sglang_fl import hookimpl
from sglang_fl.dispatch.types import BackendImplKind, OpImpl

def silu(obj, x):
    return "thief"

def rms(obj, x, residual=None):
    return "thief"

@hookimpl
def sglang_fl_register_ops(registry):
    registry.register(OpImpl(op_name="silu_and_mul", impl_id="vendor.zz_thief",
                             kind=BackendImplKind.VENDOR, fn=silu, vendor="zz_thief"))
    registry.register(OpImpl(op_name="rms_norm", impl_id="vendor.acme",
                             kind=BackendImplKind.VENDOR, fn=rms, vendor="zz_thief"))
""",
    )
    runtime = load(plugins="acme,zz_thief")
    thief = runtime.plugin("zz_thief")
    assert thief.status == "failed"
    assert "impl_id 'vendor.acme'" in thief.error
    assert "sglang-fl-zz_thief" in thief.error
    assert "already owned by plugin 'acme' (sglang-fl-acme)" in thief.error
    assert "vendor.zz_thief" not in impl_ids(runtime, "silu_and_mul")
    assert [i.provenance.plugin for i in runtime.registry.implementations("rms_norm")] == [
        "reference",
        "acme",
    ]
    assert runtime.resolve("rms_norm").fn(None, None) == "acme"


def test_duplicate_entry_point_name_across_distributions(plugin_site):
    first = plugin_site.module_name("dup_a")
    second = plugin_site.module_name("dup_b")
    plugin_site.add("sglang-fl-dup-a", {"dup": first}, {first: hook_plugin("dup")})
    plugin_site.add("sglang-fl-dup-b", {"dup": second}, {second: hook_plugin("dup")})
    runtime = load(plugins="dup")
    records = [p for p in runtime.plugins if p.name == "dup"]
    assert sorted(r.status for r in records) == ["failed", "loaded"]
    loaded = next(r for r in records if r.status == "loaded")
    failed = next(r for r in records if r.status == "failed")
    assert {loaded.distribution, failed.distribution} == {"sglang-fl-dup-a", "sglang-fl-dup-b"}
    assert failed.error == f"plugin name 'dup' is already taken by {loaded.distribution}"
    registrants = {
        i.provenance.distribution for i in runtime.registry.implementations("silu_and_mul")
    }
    assert registrants == {"sglang-fl", loaded.distribution}  # only the loaded one registered


def test_entry_point_named_reference_is_refused(plugin_site):
    plugin_site.plugin("reference", hook_plugin("impostor"), distribution="sglang-fl-impostor")
    runtime = load()
    impostor = next(p for p in runtime.plugins if p.distribution == "sglang-fl-impostor")
    assert impostor.status == "failed"
    assert impostor.error == "plugin name 'reference' is already taken by sglang-fl"
    assert "vendor.impostor" not in impl_ids(runtime, "silu_and_mul")


# -- allow and deny lists -------------------------------------------------------------------------

EXPLODING = """
import os
with open(os.environ["FLTEST_IMPORT_LOG"], "a") as log:
    log.write("{name}\\n")
raise RuntimeError("{name} must never be imported")
"""


@pytest.fixture
def import_log(tmp_path, monkeypatch):
    path = tmp_path / "imports.log"
    path.write_text("")
    monkeypatch.setenv("FLTEST_IMPORT_LOG", str(path))
    return path


def test_plugins_unset_loads_all(plugin_site):
    plugin_site.plugin("acme", hook_plugin("acme"))
    plugin_site.plugin("my_chip", SEED_PLUGIN)
    runtime = load()
    assert runtime.plugin("acme").status == "loaded"
    assert runtime.plugin("my_chip").status == "loaded"
    assert runtime.config.sources["plugins"] == "default"


def test_plugins_empty_loads_none_and_imports_nothing(plugin_site, import_log):
    plugin_site.plugin("bomb", EXPLODING.format(name="bomb"))
    runtime = load(plugins="")
    record = runtime.plugin("bomb")
    assert record.status == "disabled"
    assert record.error == "not in SGLANG_FL_PLUGINS (environment SGLANG_FL_PLUGINS)"
    assert record.distribution == "sglang-fl-bomb"
    assert import_log.read_text() == ""
    assert [p.name for p in runtime.plugins if p.status == "loaded"] == ["reference"]
    assert plugin_site.module_name("bomb") not in __import__("sys").modules


def test_plugins_allow_list_never_imports_the_others(plugin_site, import_log):
    plugin_site.plugin("bomb", EXPLODING.format(name="bomb"))
    plugin_site.plugin("acme", hook_plugin("acme"))
    runtime = load(plugins="acme")
    assert runtime.plugin("acme").status == "loaded"
    assert runtime.plugin("bomb").status == "disabled"
    assert import_log.read_text() == ""
    # Blocked in pluggy, as pytest's `-p no:NAME`: nothing registers under that name later.
    pm = runtime.plugin_manager
    assert pm.is_blocked("bomb")
    assert not pm.is_blocked("acme")
    assert pm.register(object(), name="bomb") is None
    assert pm.get_plugin("bomb") is None


def test_exploding_plugin_really_explodes_when_selected(plugin_site, import_log):
    """Proves the disabled tests above would notice an import."""
    plugin_site.plugin("bomb", EXPLODING.format(name="bomb"))
    record = load(plugins="bomb").plugin("bomb")
    assert record.status == "failed"
    assert "bomb must never be imported" in record.error
    assert import_log.read_text() == "bomb\n"


def test_disable_plugins(plugin_site, import_log):
    plugin_site.plugin("bomb", EXPLODING.format(name="bomb"))
    plugin_site.plugin("acme", hook_plugin("acme"))
    runtime = load(disable_plugins="bomb")
    record = runtime.plugin("bomb")
    assert record.status == "disabled"
    assert record.error == (
        "listed in SGLANG_FL_DISABLE_PLUGINS (environment SGLANG_FL_DISABLE_PLUGINS)"
    )
    assert runtime.plugin("acme").status == "loaded"
    assert import_log.read_text() == ""


def test_disable_wins_over_allow(plugin_site, import_log):
    plugin_site.plugin("bomb", EXPLODING.format(name="bomb"))
    runtime = load(plugins="bomb", disable_plugins="bomb")
    assert runtime.plugin("bomb").status == "disabled"
    assert import_log.read_text() == ""


def test_plugins_from_config_file(plugin_site, tmp_path, import_log):
    plugin_site.plugin("bomb", EXPLODING.format(name="bomb"))
    config = tmp_path / "c.toml"
    config.write_text('disable_plugins = ["bomb"]\n')
    runtime = load(config=str(config))
    assert runtime.plugin("bomb").error == (
        f"listed in SGLANG_FL_DISABLE_PLUGINS (config file {config})"
    )
    assert import_log.read_text() == ""


# -- STRICT ---------------------------------------------------------------------------------------


def test_strict_turns_a_plugin_failure_into_an_error(plugin_site):
    plugin_site.plugin("broken", "raise ImportError('no sdk')\n")
    with pytest.raises(PluginLoadError) as info:
        load(plugins="broken", strict="1")
    message = str(info.value)
    assert "SGLANG_FL_STRICT=1" in message
    assert "plugin 'broken' (sglang-fl-broken 1.0) failed to load" in message
    assert "no sdk" in message


def test_strict_with_healthy_plugins_loads(plugin_site):
    plugin_site.plugin("acme", hook_plugin("acme"))
    assert load(plugins="acme", strict="1").plugin("acme").status == "loaded"


def test_strict_disabled_plugin_is_not_a_failure(plugin_site):
    plugin_site.plugin("broken", "raise ImportError('no sdk')\n")
    runtime = load(plugins="", strict="1")
    assert runtime.plugin("broken").status == "disabled"


def test_inspecting_runtime_tolerates_failures_under_strict(plugin_site):
    plugin_site.plugin("broken", "raise ImportError('no sdk')\n")
    settings = Settings.from_environment({"SGLANG_FL_PLUGINS": "broken", "SGLANG_FL_STRICT": "1"})
    runtime = Runtime(settings, inspecting=True)
    assert runtime.plugin("broken").status == "failed"


# -- platform hook --------------------------------------------------------------------------------

PLATFORM_PLUGIN = """
from sglang_fl import hookimpl

@hookimpl
def sglang_fl_platform():
    return {result!r}
"""


def test_platform_none_without_plugins():
    assert load(plugins="").platform() is None


def test_platform_first_non_none_result(plugin_site):
    plugin_site.plugin("p_none", PLATFORM_PLUGIN.format(result=None))
    plugin_site.plugin("p_chip", PLATFORM_PLUGIN.format(result="chip.platform:ChipPlatform"))
    plugin_site.plugin("p_zero", PLATFORM_PLUGIN.format(result=None))
    runtime = load(plugins="p_none,p_chip,p_zero")
    assert [runtime.plugin(n).hooks for n in ("p_none", "p_chip", "p_zero")] == [
        ("sglang_fl_platform",)
    ] * 3
    assert runtime.platform() == "chip.platform:ChipPlatform"


def test_platform_all_none(plugin_site):
    plugin_site.plugin("p_none", PLATFORM_PLUGIN.format(result=None))
    assert load(plugins="p_none").platform() is None


RAISING_PLATFORM_PLUGIN = """
from sglang_fl import hookimpl

@hookimpl
def sglang_fl_platform():
    raise RuntimeError("driver exploded")
"""


def test_platform_hook_raising_is_reported_and_skipped(plugin_site, caplog):
    # Loaded after p_chip (plugins load sorted by name), so pluggy asks it first.
    plugin_site.plugin("p_wreck", RAISING_PLATFORM_PLUGIN)
    plugin_site.plugin("p_chip", PLATFORM_PLUGIN.format(result="chip.platform:ChipPlatform"))
    runtime = load(plugins="p_wreck,p_chip")
    with caplog.at_level(logging.WARNING, logger="sglang_fl.runtime"):
        assert runtime.platform() == "chip.platform:ChipPlatform"
    assert "plugin 'p_wreck': sglang_fl_platform raised RuntimeError: driver exploded" in (
        caplog.text
    )


@pytest.mark.parametrize("answer", [42, "", ["a:B"]])
def test_platform_answer_that_is_not_a_class_path_is_ignored(plugin_site, caplog, answer):
    plugin_site.plugin("p_odd", PLATFORM_PLUGIN.format(result=answer))
    runtime = load(plugins="p_odd")
    with caplog.at_level(logging.WARNING, logger="sglang_fl.runtime"):
        assert runtime.platform() is None
    assert f"sglang_fl_platform returned {answer!r}, not a class path or None" in caplog.text


def test_platform_hook_raising_under_strict_raises(plugin_site):
    plugin_site.plugin("p_boom", RAISING_PLATFORM_PLUGIN)
    runtime = load(plugins="p_boom", strict="1")
    with pytest.raises(PluginLoadError, match=r"p_boom.*driver exploded"):
        runtime.platform()


def test_plugin_record_to_dict(plugin_site):
    plugin_site.plugin("acme", hook_plugin("acme"), version="0.9")
    data = load(plugins="acme").plugin("acme").to_dict()
    assert data == {
        "name": "acme",
        "module": plugin_site.module_name("acme"),
        "distribution": "sglang-fl-acme",
        "version": "0.9",
        "status": "loaded",
        "hooks": ["sglang_fl_register_ops"],
        "error": None,
        "builtin": False,
    }


def test_unknown_plugin_lookup_lists_known():
    with pytest.raises(KeyError, match="no plugin named 'nope'; known: reference"):
        load(plugins="").plugin("nope")
