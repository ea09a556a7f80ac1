"""Lazy chip-SDK probes shared by vendor plugins: import the SDK, count devices, say why not.

A vendor plugin must not import its chip SDK when its module is imported (on a machine without
the chip the SDK may be missing, fail to load its native libraries, or take seconds), yet its
kernel adapters need the SDK module on every call. :class:`ChipSdk` holds both answers: created
at plugin import time, it imports nothing until the first availability probe or the first
adapter call (:meth:`ChipSdk.require`, one attribute read once the module is loaded), and turns
every failure into an :class:`~sglang_fl.dispatch.types.Availability` whose reason
``sglang-fl explain`` shows.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from types import ModuleType

from .._forksafe import reset_locks_in_child
from .types import Availability

__all__ = ["ChipSdk"]


class ChipSdk:
    """One chip SDK module, imported at most once per process, and the probe for its devices.

    ``count_devices`` returns how many devices of the chip this process sees. With
    ``devices_need_sdk=False`` it runs *before* the import (CUDA: torch already knows its
    devices, so a machine without one never loads the SDK); with ``True`` it runs after it
    (Ascend: ``torch.npu`` exists only once ``torch_npu`` is imported). ``requires`` names the
    SDK attributes the adapters call, so an SDK too old to have them is reported, not crashed
    into. ``no_device_hint`` may add why no device is seen (e.g. a CPU-only torch build).
    """

    __slots__ = (
        "__weakref__",
        "_error",
        "_lock",
        "_probed",
        "count_devices",
        "device",
        "devices_need_sdk",
        "module",
        "name",
        "no_device_hint",
        "requires",
    )

    def __init__(
        self,
        name: str,
        *,
        device: str,
        count_devices: Callable[[], int],
        devices_need_sdk: bool,
        requires: tuple[str, ...] = (),
        no_device_hint: Callable[[], str] | None = None,
    ) -> None:
        self.name = name
        self.device = device
        self.count_devices = count_devices
        self.devices_need_sdk = devices_need_sdk
        self.requires = requires
        self.no_device_hint = no_device_hint
        # The imported SDK, or None until a successful import: adapters read it per call.
        self.module: ModuleType | None = None
        self._error: str | None = None
        self._probed: Availability | None = None
        # Re-entrant: a count_devices that reads `.module` may run while a probe holds it.
        self._lock = threading.RLock()
        reset_locks_in_child(self)

    def _reset_locks_after_fork(self) -> None:
        self._lock = threading.RLock()

    def require(self) -> ModuleType:
        """The SDK module for a kernel call: imported on the first call, then one attribute read.

        Adapters call it on every call (``torch_npu = TORCH_NPU.require()``); they only run
        once the probe said the SDK is there, so a failure here is a bug worth raising: an
        ``ImportError`` with the import's reason. A failed import is not retried: the same
        reason is raised again (an SDK whose native libraries are missing does not appear later
        in the same process).
        """
        module = self.module
        if module is not None:
            return module
        with self._lock:
            if self.module is None and self._error is None:
                self._import()
            if self.module is None:
                raise ImportError(self._error)
            return self.module

    # The name vendors written before ``require`` use; the same method.
    load = require

    def probe(self) -> Availability:
        """Whether the SDK imports and a device is visible; computed once, never raises."""
        result = self._probed
        if result is not None:
            return result
        with self._lock:
            if self._probed is None:
                self._probed = self._probe()
            return self._probed

    __call__ = probe

    def _probe(self) -> Availability:
        count: int | Availability | None = None
        if not self.devices_need_sdk:
            count = self._count_devices()
            if isinstance(count, Availability):
                return count
        if self.module is None and self._error is None:
            self._import()
        if self.module is None:
            return Availability(False, str(self._error))
        absent = [attr for attr in self.requires if not hasattr(self.module, attr)]
        if absent:
            return Availability(
                False, f"{self._described()} lacks {', '.join(absent)} (too old or too new?)"
            )
        if count is None:
            count = self._count_devices()
            if isinstance(count, Availability):
                return count
        plural = "" if count == 1 else "s"
        return Availability(True, f"{self._described()} imported; {count} {self.device}{plural}")

    def _import(self) -> None:
        """Import the SDK once; any failure (missing module, native library) becomes a reason."""
        try:
            self.module = importlib.import_module(self.name)
        except Exception as exc:  # an SDK may fail with OSError, RuntimeError, ...: never raise
            self._error = f"{self.name} import failed: {type(exc).__name__}: {exc}"

    def _count_devices(self) -> int | Availability:
        """The visible device count, or an unavailable verdict when it is 0 or counting fails."""
        try:
            count = int(self.count_devices())
        except Exception as exc:  # a driver error while counting: report it, never raise
            return Availability(
                False, f"counting {self.device}s failed: {type(exc).__name__}: {exc}"
            )
        if count > 0:
            return count
        reason = f"no {self.device} visible"
        hint = self._hint()
        return Availability(False, f"{reason} ({hint})" if hint else reason)

    def _hint(self) -> str:
        if self.no_device_hint is None:
            return ""
        try:
            return self.no_device_hint()
        except Exception as exc:  # the hint is decoration: its failure must not hide the reason
            return f"hint failed: {type(exc).__name__}: {exc}"

    def _described(self) -> str:
        version = getattr(self.module, "__version__", None)
        return f"{self.name} {version}" if version else self.name

    def __repr__(self) -> str:
        state = "loaded" if self.module is not None else (self._error or "not loaded")
        return f"<ChipSdk {self.name!r}: {state}>"
