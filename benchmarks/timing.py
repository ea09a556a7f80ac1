"""Side-by-side timing: every variant of a case measured in one run, repetitions interleaved.

Machines here are shared and noisy. Measuring variant A for a second and then variant B for a
second lets a burst of noise land on one of them only; interleaving short batches (A, B, C,
B, C, A, ...) spreads it over all of them, and medians drop the bursts. Every variant is called
the same way (``fn(*args, **kwargs)`` in the same loop), so the harness costs the same for all.
Measuring B always right after A would bias B by A's left-over cache state, so the order of
each repetition is shuffled.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any


@dataclass(frozen=True)
class Call:
    """One variant: a callable and the arguments it is called with, every iteration."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self) -> Any:
        return self.fn(*self.args, **self.kwargs)


@dataclass(frozen=True)
class Samples:
    """Per-call nanoseconds of each repetition (one batch of ``iterations`` calls each).

    ``per_call_ns`` is wall-clock (``perf_counter_ns``), the figure reported; ``cpu_ns`` is the
    thread's CPU time over the same batches, which leaves out time the scheduler gave to other
    processes and so shows how much of a wall-clock difference is contention.
    """

    per_call_ns: tuple[float, ...]
    cpu_ns: tuple[float, ...]
    iterations: int

    @property
    def median_cpu_ns(self) -> float:
        return statistics.median(self.cpu_ns)

    @property
    def median_ns(self) -> float:
        return statistics.median(self.per_call_ns)

    @property
    def quartiles_ns(self) -> tuple[float, float]:
        q = statistics.quantiles(self.per_call_ns, n=4)
        return q[0], q[2]


def _batch(call: Call, iterations: int) -> tuple[int, int]:
    """Wall-clock and this thread's CPU nanoseconds of ``iterations`` calls."""
    fn, args, kwargs = call.fn, call.args, call.kwargs
    wall, cpu = time.perf_counter_ns, time.thread_time_ns
    if kwargs:
        start, start_cpu = wall(), cpu()
        for _ in repeat(None, iterations):
            fn(*args, **kwargs)
        return wall() - start, cpu() - start_cpu
    start, start_cpu = wall(), cpu()
    for _ in repeat(None, iterations):
        fn(*args)
    return wall() - start, cpu() - start_cpu


def interleaved(
    variants: Mapping[str, Call],
    *,
    repetitions: int = 31,
    batch_ns: int = 1_000_000,
    budget_ns: int = 3_000_000_000,
    max_repetitions: int = 151,
    min_iterations: int = 2,
    max_iterations: int = 100_000,
    seed: int = 0,
) -> dict[str, Samples]:
    """Median-ready samples of every variant, measured in rotating order, GC off.

    All variants run the same number of iterations per batch, sized so the slowest takes about
    ``batch_ns``; each repetition runs them in a fresh (seeded) random order, so no variant
    always runs first or always after the same neighbour (whose cache and allocator state it
    would inherit). Slow
    cases (few iterations per batch, so noisier batches) get more repetitions, up to
    ``max_repetitions`` or about ``budget_ns`` in all.
    """
    names = list(variants)
    rng = random.Random(seed)
    for call in variants.values():  # warm-up: lazy resolution, allocator, caches
        for _ in range(3):
            call()
    slowest = max(_batch(variants[name], 3)[0] / 3 for name in names)
    iterations = int(min(max(batch_ns / max(slowest, 1.0), min_iterations), max_iterations))
    per_repetition = len(names) * iterations * slowest
    repetitions = int(min(max(repetitions, budget_ns / per_repetition), max_repetitions))
    walls: dict[str, list[float]] = {name: [] for name in names}
    cpus: dict[str, list[float]] = {name: [] for name in names}
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for _ in range(repetitions):
            order = names[:]
            rng.shuffle(order)
            for name in order:
                wall_ns, cpu_ns = _batch(variants[name], iterations)
                walls[name].append(wall_ns / iterations)
                cpus[name].append(cpu_ns / iterations)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: Samples(tuple(walls[name]), tuple(cpus[name]), iterations) for name in names}


def ratio(samples: Mapping[str, Samples], numerator: str, denominator: str) -> float:
    """Ratio of medians: the figure the targets are stated in."""
    return samples[numerator].median_ns / samples[denominator].median_ns


def cpu_ratio(samples: Mapping[str, Samples], numerator: str, denominator: str) -> float:
    """Ratio of median CPU times: the same comparison without scheduler noise."""
    return samples[numerator].median_cpu_ns / samples[denominator].median_cpu_ns


def paired_ratio(samples: Mapping[str, Samples], numerator: str, denominator: str) -> float:
    """Median of per-repetition ratios: robust to slow drifts over the run (reported too)."""
    pairs = zip(samples[numerator].per_call_ns, samples[denominator].per_call_ns, strict=True)
    return statistics.median(a / b for a, b in pairs)
