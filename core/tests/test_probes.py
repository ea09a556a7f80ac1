"""ChipSdk: lazy, once-per-process SDK import and device probe that never raises."""

from __future__ import annotations

import sys
import threading
import types

import pytest

from sglang_fl.dispatch.probes import ChipSdk
from sglang_fl.dispatch.types import Availability

FAKE = "sglang_fl_test_fake_sdk"


@pytest.fixture
def fake_sdk(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = types.ModuleType(FAKE)
    module.__version__ = "1.2.3"  # type: ignore[attr-defined]
    module.kernel = lambda: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, FAKE, module)
    return module


class Counter:
    """A device counter that records how often it was asked."""

    def __init__(self, result: int | Exception) -> None:
        self.result = result
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def sdk(name: str = FAKE, **overrides: object) -> ChipSdk:
    options: dict[str, object] = {
        "device": "Widget",
        "count_devices": Counter(2),
        "devices_need_sdk": True,
    }
    options.update(overrides)
    return ChipSdk(name, **options)  # type: ignore[arg-type]


def test_constructing_imports_nothing() -> None:
    probe = sdk("sglang_fl_test_never_imported")
    assert probe.module is None
    assert "sglang_fl_test_never_imported" not in sys.modules


def test_available_when_sdk_imports_and_devices_visible(fake_sdk: types.ModuleType) -> None:
    probe = sdk(requires=("kernel",))
    result = probe.probe()
    assert result == Availability(True, f"{FAKE} 1.2.3 imported; 2 Widgets")
    assert probe.module is fake_sdk
    assert probe.require() is fake_sdk


def test_one_device_is_singular(fake_sdk: types.ModuleType) -> None:
    assert sdk(count_devices=Counter(1)).probe().reason.endswith("; 1 Widget")


def test_missing_sdk_is_unavailable_with_import_reason() -> None:
    result = sdk("sglang_fl_test_no_such_sdk").probe()
    assert not result.available
    assert result.reason.startswith("sglang_fl_test_no_such_sdk import failed: ModuleNotFoundError")


def test_sdk_whose_import_raises_oserror_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_import(name: str) -> types.ModuleType:
        raise OSError("libhccl.so: cannot open shared object file")

    monkeypatch.setattr("sglang_fl.dispatch.probes.importlib.import_module", broken_import)
    result = sdk("anything").probe()
    assert result == Availability(
        False, "anything import failed: OSError: libhccl.so: cannot open shared object file"
    )


def test_no_device_reason_with_hint(fake_sdk: types.ModuleType) -> None:
    result = sdk(count_devices=Counter(0), no_device_hint=lambda: "CPU-only build").probe()
    assert result == Availability(False, "no Widget visible (CPU-only build)")


def test_failing_hint_does_not_hide_the_reason(fake_sdk: types.ModuleType) -> None:
    def hint() -> str:
        raise RuntimeError("boom")

    result = sdk(count_devices=Counter(0), no_device_hint=hint).probe()
    assert result == Availability(False, "no Widget visible (hint failed: RuntimeError: boom)")


def test_counting_error_is_a_reason_not_an_exception(fake_sdk: types.ModuleType) -> None:
    result = sdk(count_devices=Counter(RuntimeError("driver gone"))).probe()
    assert result == Availability(False, "counting Widgets failed: RuntimeError: driver gone")


def test_devices_counted_first_skip_the_import() -> None:
    counter = Counter(0)
    probe = sdk("sglang_fl_test_not_imported_without_device", devices_need_sdk=False)
    probe.count_devices = counter
    assert probe.probe() == Availability(False, "no Widget visible")
    assert counter.calls == 1
    assert "sglang_fl_test_not_imported_without_device" not in sys.modules


def test_devices_counted_after_import_when_they_need_the_sdk() -> None:
    counter = Counter(3)
    result = sdk("sglang_fl_test_absent", count_devices=counter).probe()
    assert not result.available
    assert "import failed" in result.reason
    assert counter.calls == 0


def test_missing_required_attribute_is_reported(fake_sdk: types.ModuleType) -> None:
    result = sdk(requires=("kernel", "newer_kernel", "newest_kernel")).probe()
    assert result == Availability(
        False, f"{FAKE} 1.2.3 lacks newer_kernel, newest_kernel (too old or too new?)"
    )


def test_probe_runs_once(fake_sdk: types.ModuleType) -> None:
    counter = Counter(2)
    probe = sdk(count_devices=counter)
    first = probe.probe()
    assert probe() is first
    assert probe.probe() is first
    assert counter.calls == 1


def test_concurrent_first_probes_count_once(fake_sdk: types.ModuleType) -> None:
    counter = Counter(2)
    probe = sdk(count_devices=counter)
    results: list[Availability] = []
    threads = [threading.Thread(target=lambda: results.append(probe.probe())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counter.calls == 1
    assert len({id(r) for r in results}) == 1


def test_require_without_probe_imports_once(fake_sdk: types.ModuleType) -> None:
    probe = sdk(count_devices=Counter(0))
    assert probe.require() is fake_sdk
    assert probe.require() is fake_sdk
    assert probe.load() is fake_sdk  # the earlier name, kept for vendors written against it
    assert probe.module is fake_sdk


def test_failed_require_raises_the_same_reason_and_is_not_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    attempts: list[str] = []

    def failing_import(name: str) -> types.ModuleType:
        attempts.append(name)
        raise ImportError("no kernels here")

    monkeypatch.setattr("sglang_fl.dispatch.probes.importlib.import_module", failing_import)
    probe = sdk("kernels")
    for _ in range(2):
        with pytest.raises(ImportError, match=r"^kernels import failed: ImportError: no kernels"):
            probe.require()
    assert not probe.probe().available
    assert attempts == ["kernels"]


def test_repr_names_state(fake_sdk: types.ModuleType) -> None:
    probe = sdk()
    assert repr(probe) == f"<ChipSdk {FAKE!r}: not loaded>"
    probe.require()
    assert repr(probe) == f"<ChipSdk {FAKE!r}: loaded>"
