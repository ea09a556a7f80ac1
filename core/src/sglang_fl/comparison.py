"""How far an output is from the reference: one measure for verify mode and the kit.

Verify mode (:mod:`sglang_fl.verify`) and the conformance kit (:mod:`sglang_fl.testing`)
judge an implementation's tensors against the contract's reference with the same rule,
``|got - want| <= atol + rtol * |want|`` per element, computed here once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .ops import Tolerance

__all__ = ["Deviation", "compare", "deviation", "dtype_name", "structure_problem"]


@dataclass(frozen=True)
class Deviation:
    """How far ``got`` is from ``want``: ``|got - want| <= atol + rtol * |want|`` per element."""

    max_abs: float  # inf where an element is NaN
    max_rel: float  # over elements whose wanted value is not 0; inf if none is and they differ
    out_of_tolerance: int
    elements: int
    worst: tuple[int, ...] | None  # index of the element furthest beyond its bound

    @property
    def within(self) -> bool:
        return self.out_of_tolerance == 0


def structure_problem(got: object, want: torch.Tensor, what: str) -> str | None:
    """Why ``got`` cannot be compared with ``want`` element by element, or ``None``."""
    if not isinstance(got, torch.Tensor):
        return f"{what} is a {type(got).__name__}, expected a tensor"
    if got.shape != want.shape:
        return f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if got.dtype != want.dtype:
        return f"{what} has dtype {dtype_name(got.dtype)}, expected {dtype_name(want.dtype)}"
    if got.device != want.device:
        return f"{what} is on {got.device}, expected {want.device}"
    return None


def deviation(got: torch.Tensor, want: torch.Tensor, tolerance: Tolerance) -> Deviation:
    """Element-wise error of two tensors of the same shape, in float64 on the CPU."""
    g = got.detach().to("cpu", torch.float64)
    w = want.detach().to("cpu", torch.float64)
    error = torch.nan_to_num((g - w).abs(), nan=math.inf)
    bound = tolerance.atol + tolerance.rtol * w.abs()
    bad = ~(error <= bound)  # NaN compares false: a NaN is out of tolerance
    if error.numel() == 0:
        return Deviation(0.0, 0.0, 0, 0, None)
    nonzero = w != 0
    if bool(nonzero.any()):
        max_rel = (error[nonzero] / w[nonzero].abs()).max().item()
    else:
        max_rel = 0.0 if not bool((error > 0).any()) else math.inf
    worst = tuple(int(i) for i in torch.unravel_index(torch.argmax(error - bound), error.shape))
    return Deviation(error.max().item(), max_rel, int(bad.sum()), bad.numel(), worst)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def compare(got: object, want: torch.Tensor, tolerance: Tolerance, what: str) -> str | None:
    """Why ``got`` is not ``want`` within ``tolerance`` (with max abs/rel error), or ``None``."""
    problem = structure_problem(got, want, what)
    if problem is not None:
        return problem
    assert isinstance(got, torch.Tensor)
    dev = deviation(got, want, tolerance)
    if dev.within:
        return None
    worst = dev.worst or ()
    return (
        f"{what}: max abs error {dev.max_abs:.3g}, max rel error {dev.max_rel:.3g} "
        f"(atol={tolerance.atol:g}, rtol={tolerance.rtol:g}); {dev.out_of_tolerance} of "
        f"{dev.elements} elements out of tolerance; worst at {list(worst)}: "
        f"got {got[worst].item():.6g}, want {want[worst].item():.6g}"
    )
