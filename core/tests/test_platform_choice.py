"""Which SGLang platform sglang-fl offers, and the attention backend an engine then gets (the
answers of the platform entry point and of ``sglang-fl doctor``), on this accelerator-less
machine, without SGLang."""

from __future__ import annotations

import importlib.util

import pytest

from sglang_fl import cli
from sglang_fl.config import Settings
from sglang_fl.integrations.sglang.platform_choice import (
    CPU_PLATFORM,
    PlatformChoice,
    PlatformSource,
    choose_platform,
    default_attention_backend,
)
from sglang_fl.runtime import Runtime

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("sglang") is not None,
    reason="the answers without SGLang (tests/sglang/test_platform.py checks them with it)",
)

VENDOR_PLATFORM = """
from sglang_fl import hookimpl


class ChipPlatform:
    def get_default_attention_backend(self):
        return "chip_attention"


class BrokenPlatform:
    def get_default_attention_backend(self):
        raise RuntimeError("no driver")


@hookimpl
def sglang_fl_register_ops(registry):
    pass


@hookimpl
def sglang_fl_platform():
    return __name__ + ":ChipPlatform"
"""


def _runtime(monkeypatch: pytest.MonkeyPatch, *plugins: str) -> Runtime:
    monkeypatch.setenv("SGLANG_FL_PLUGINS", ",".join(plugins))
    return Runtime(Settings.from_environment(), inspecting=True)


@pytest.fixture(autouse=True)
def _no_platform_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SGLANG_PLATFORM", "SGLANG_USE_CPU_ENGINE"):
        monkeypatch.delenv(name, raising=False)


def test_a_machine_without_an_accelerator_gets_the_cpu_platform_and_sglang_fl_attention(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runtime = _runtime(monkeypatch)
    choice = choose_platform(runtime)
    assert choice == PlatformChoice(
        CPU_PLATFORM,
        PlatformSource.SGLANG_FL_CPU,
        "no accelerator SGLang supports in-tree is present",
    )
    backend, why = default_attention_backend(choice, runtime)
    assert backend == "sglang_fl"
    assert "an explicit --attention-backend" in why


@pytest.mark.parametrize(
    ("env", "source", "path", "backend"),
    [
        ({"SGLANG_USE_CPU_ENGINE": "1"}, PlatformSource.SGLANG_CPU_ENGINE, None, "intel_amx"),
        (
            {"SGLANG_USE_CPU_ENGINE": "1", "SGLANG_PLATFORM": "sglang_fl"},
            PlatformSource.SGLANG_FL_CPU,
            CPU_PLATFORM,
            "sglang_fl",
        ),
        ({"SGLANG_PLATFORM": "other_chip"}, PlatformSource.OTHER_PLUGIN, None, None),
    ],
)
def test_sglangs_own_switches_are_followed(
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    source: PlatformSource,
    path: str | None,
    backend: str | None,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    runtime = _runtime(monkeypatch)
    choice = choose_platform(runtime)
    assert (choice.source, choice.path) == (source, path)
    assert default_attention_backend(choice, runtime)[0] == backend


def test_a_vendor_platform_is_asked_for_its_default_backend(
    plugin_site, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = plugin_site.plugin("chip", VENDOR_PLATFORM)
    runtime = _runtime(monkeypatch, "chip")
    choice = choose_platform(runtime)
    assert choice == PlatformChoice(
        f"{module}:ChipPlatform",
        PlatformSource.VENDOR,
        "plugin 'chip' declares it (sglang_fl_platform)",
    )
    assert default_attention_backend(choice, runtime) == (
        "chip_attention",
        f"the default of the platform {module}:ChipPlatform; an explicit --attention-backend "
        "(attention_backend=...) wins",
    )
    broken = PlatformChoice(f"{module}:BrokenPlatform", PlatformSource.VENDOR, "")
    assert default_attention_backend(broken, runtime) == (
        None,
        "the vendor platform's get_default_attention_backend() raised RuntimeError: no driver",
    )


def test_doctor_says_sglang_is_not_installed(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    monkeypatch.setenv("SGLANG_FL_PLUGINS", "")
    cli.main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)["sglang"]
    assert report == {
        "version": None,
        "platform": None,
        "platform_source": None,
        "platform_reason": "SGLang is not installed",
        "attention_backend": None,
        "attention_backend_reason": "SGLang is not installed",
        "attention_implementation": None,
    }
