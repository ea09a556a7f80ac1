"""The template :class:`~sglang_fl.types.Backend`: can this process use the chip?"""

from __future__ import annotations

from sglang_fl.types import Availability, Backend


class TemplateBackend(Backend):
    """Probed lazily, at most once per process; must never raise."""

    @property
    def name(self) -> str:
        return "template"

    def is_available(self) -> Availability:
        # Import the chip SDK here, never at module import, count the devices and say why not:
        # the reason is what `sglang-fl explain OP` shows. sglang_fl.types.ChipSdk does all
        # three (see its docstring); until then the ops stay with the next candidate.
        return Availability(False, "template: no availability probe written yet (backend.py)")
