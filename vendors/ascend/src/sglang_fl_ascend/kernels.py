"""sgl_kernel_npu's functions as the installed release spells them: a signature probe each.

No SGLang release pins an sgl_kernel_npu version, and its functions change between releases:
``fused_gdn_gating_npu`` lost its ``b`` argument and its sigmoid output in one, changed its
output layout in another (sgl-kernel-npu #747), modules appear and disappear. An adapter names
the call forms it knows (:class:`CallForm`: module, function, leading parameters, source);
:meth:`SdkFunction.resolve` returns the first form the installed release matches, read once per
loaded package (an import and one ``inspect.signature``), and declines the call with
:class:`~sglang_fl.types.Unsupported`, saying what it found, when none matches: a release this
wheel does not know is never called with arguments it may read differently.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from sglang_fl.types import Unsupported

from .backend import SGL_KERNEL_NPU

__all__ = ["CallForm", "SdkFunction", "has_module"]

REPO = "sgl-kernel-npu python/sgl_kernel_npu/sgl_kernel_npu"


@dataclass(frozen=True)
class CallForm:
    """One form of an sgl_kernel_npu function: ``sgl_kernel_npu.<module>.<function>`` whose
    parameters start with ``parameters`` (any further ones have defaults), as ``source``
    (a release's file and line) defines it; ``name`` tells the adapter which form it got."""

    name: str
    module: str
    function: str
    parameters: tuple[str, ...]
    source: str

    @property
    def qualified(self) -> str:
        return f"{SGL_KERNEL_NPU.name}.{self.module}.{self.function}"

    def mismatch(self, fn: Callable[..., Any]) -> str | None:
        """Why ``fn``'s signature is not this form's, or ``None``."""
        try:
            found = inspect.signature(fn).parameters
        except (TypeError, ValueError) as error:
            return f"{self.qualified} has no readable signature ({error})"
        names = list(found)
        if names[: len(self.parameters)] != list(self.parameters):
            return f"{self.qualified}({', '.join(names)})"
        extra = list(found.values())[len(self.parameters) :]
        required = [
            p.name
            for p in extra
            if p.default is inspect.Parameter.empty
            and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        ]
        if required:
            return f"{self.qualified} also requires {', '.join(required)}"
        return None


@dataclass
class SdkFunction:
    """The sgl_kernel_npu function behind one adapter, in the forms it was released in."""

    op: str
    forms: tuple[CallForm, ...]
    # (package, form or None, function or why not): read once per loaded package; two threads
    # resolving at once compute the same answer.
    _resolved: tuple[ModuleType, CallForm | None, Any] | None = field(default=None, repr=False)

    def resolve(self) -> tuple[CallForm, Callable[..., Any]]:
        """The installed release's form and function, or ``Unsupported`` saying what it has."""
        package = _package()
        cached = self._resolved
        if cached is None or cached[0] is not package:
            cached = (package, *self._match(package))
            self._resolved = cached
        _, form, found = cached
        if form is None:
            raise Unsupported(found)
        function: Callable[..., Any] = found
        return form, function

    def _match(self, package: ModuleType) -> tuple[CallForm | None, Any]:
        seen: list[str] = []
        for form in self.forms:
            module = _submodule(package, form.module)
            if isinstance(module, str):
                seen.append(module)
                continue
            fn = getattr(module, form.function, None)
            if fn is None:
                seen.append(f"{form.qualified} is missing")
                continue
            why = form.mismatch(fn)
            if why is None:
                return form, fn
            seen.append(f"found {why}")
        version = getattr(package, "__version__", "?")
        known = "; ".join(
            f"{f.qualified}({', '.join(f.parameters)}) ({f.source})" for f in self.forms
        )
        return None, (
            f"sgl_kernel_npu {version} has no call form of {self.op} this wheel knows: "
            f"{'; '.join(dict.fromkeys(seen))}. Known: {known}"
        )


def _package() -> ModuleType:
    """The installed sgl_kernel_npu, or ``Unsupported`` where it does not import. Dispatch asks
    the backend's probe first; the hardware conformance script calls every adapter, so on an
    NPU without the package the GDN rows are declined, not failed."""
    try:
        return SGL_KERNEL_NPU.require()
    except ImportError as error:
        raise Unsupported(
            f"the GDN adapters call sgl_kernel_npu, not usable here: {error}"
        ) from error


def _submodule(package: ModuleType, module: str) -> ModuleType | str:
    """``sgl_kernel_npu.<module>``, or why it does not import (a release without it)."""
    name = f"{package.__name__}.{module}"
    try:
        return importlib.import_module(name)
    except Exception as error:  # a release without it, or one whose import fails
        return f"{name} does not import ({type(error).__name__}: {error})"


_MODULES: dict[str, tuple[ModuleType, bool]] = {}


def has_module(module: str) -> bool:
    """Whether the installed sgl_kernel_npu has ``sgl_kernel_npu.<module>`` (read once per
    loaded package: a failed import is not retried on every call)."""
    package = _package()
    cached = _MODULES.get(module)
    if cached is None or cached[0] is not package:
        cached = (package, not isinstance(_submodule(package, module), str))
        _MODULES[module] = cached
    return cached[1]
