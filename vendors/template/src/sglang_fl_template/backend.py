"""The template's :class:`~sglang_fl.dispatch.backends.Backend`: never available."""

from __future__ import annotations

from sglang_fl.dispatch.backends import Backend
from sglang_fl.dispatch.types import Availability


class TemplateBackend(Backend):
    """A backend for no chip at all. A real one probes its SDK and devices here, lazily."""

    @property
    def name(self) -> str:
        return "template"

    def is_available(self) -> Availability:
        # A real chip: import the SDK here (never at module import) and count devices, e.g.
        #   try: import my_chip_sdk
        #   except ImportError as exc:
        #       return Availability(False, f"my_chip_sdk import failed: {exc}")
        #   n = my_chip_sdk.device_count()
        #   return Availability(n > 0, f"{n} device(s) visible")
        return Availability(False, "template backend: never available (it only shows the layout)")
