"""The :class:`Backend` base class a vendor subclasses (seed-compatible)."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import Any

from ..types import Availability, BackendImplKind, BackendPriority, OpImpl, PreparedKernel

__all__ = ["Backend"]


class Backend(abc.ABC):
    """A chip's backend: a name and an availability probe.

    Only :attr:`name` and :meth:`is_available` are abstract, so a vendor implements exactly the
    ops its chip accelerates. ``is_available`` must not raise and must not import the chip SDK
    before it is called; the registry calls it lazily, at most once per process. It may return a
    bool or an :class:`~sglang_fl.dispatch.types.Availability` carrying the reason a user sees.
    """

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """The vendor id, e.g. ``"cuda"``; by convention also the plugin's entry-point name."""

    @abc.abstractmethod
    def is_available(self) -> bool | Availability:
        """Whether this backend can run in this process (SDK importable, device visible)."""

    def implementations(
        self,
        functions: Mapping[str, Callable[..., Any] | PreparedKernel],
        *,
        impl_id: str | None = None,
        priority: int = BackendPriority.VENDOR,
        planner: Any = None,
    ) -> list[OpImpl]:
        """One vendor :class:`OpImpl` per ``op name -> function``, probed by :meth:`is_available`.

        The functions are registered as they are (no wrapper), so the bound callable SGLang
        calls is the kernel adapter itself. A :class:`PreparedKernel` value brings the
        adapter's weight-preparation step along (ops with weights: the quantized ones).
        ``planner`` (an :class:`~sglang_fl.ops.attention.plan.AttentionPlanner`) plans for the
        planned ops among them (the attention ops); the others take none.
        """
        from ...ops import STANDARD_OPS

        return [
            OpImpl(
                op_name=op_name,
                impl_id=impl_id or f"vendor.{self.name}",
                kind=BackendImplKind.VENDOR,
                fn=adapter.fn if isinstance(adapter, PreparedKernel) else adapter,
                vendor=self.name,
                priority=priority,
                available=self.is_available,
                prepare=adapter.prepare if isinstance(adapter, PreparedKernel) else None,
                planner=planner if _planned(STANDARD_OPS, op_name) else None,
            )
            for op_name, adapter in functions.items()
        ]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def _planned(ops: Mapping[str, Any], op_name: str) -> bool:
    contract = ops.get(op_name)
    return contract is not None and contract.plan_stage is not None
