"""Per-call cost of a routed collective vs SGLang's direct call, 2 ranks on gloo (issue 23).

For ``all_reduce`` and ``all_gather`` at 1 KiB .. 16 MiB (float32 per rank) two spawned ranks
compare, on the same tensors:

- ``direct``: what SGLang's ``GroupCoordinator`` calls on the CPU (``torch.distributed`` on
  the device group, with SGLang's reshape for ``all_gather``): the method's own work;
- ``routed``: the method sglang-fl binds on a multi-rank group
  (``integrations.sglang.collectives._bridge`` around ``get_runtime().resolve(op).fn``).

Two measurements, side by side, because a shared machine's noise (milliseconds) dwarfs what
is measured (a Python frame, well under a microsecond):

1. **Pairs.** Many short pairs, each one ``direct`` and one ``routed`` call, both ranks behind
   a barrier before each call, the order alternating per pair (ABBA) so a slow moment or a
   cache effect hits both halves alike. The figure is the median of the per-pair ratios
   ``routed/direct`` with its interquartile range: noise that spans a pair cancels in its
   ratio, and the median ignores the pairs a neighbour's burst split. Beside it, ``min ratio``:
   the fastest routed call over the fastest direct one (the least disturbed call of each).
2. **Frame.** The routed frame's own cost, without the communication: in one process the
   ``torch.distributed`` calls both paths make are replaced by a function that returns at once,
   and each path is timed over many calls (minimum of several batches). ``frame us`` is what
   routing adds per call; ``bound`` is ``1 + frame / direct``: the ratio routing alone can
   cause at that size, independent of the machine's noise in the communication.

A world-size-1 group is not timed: it keeps SGLang's own function objects, nothing is added
(``tests/sglang/test_collectives.py`` checks that). Prints a table and the worst of each
figure; target: at most 1.05x at every size.

``python benchmarks/collectives.py [--pairs N]`` in an environment with sglang-fl installed
(SGLang itself is not needed: no coordinator is built).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

SIZES = [1 << k for k in range(10, 25, 2)]  # 1 KiB .. 16 MiB
OPS = ("all_reduce", "all_gather")
LARGE = 1 << 20  # from here on a call takes milliseconds: fewer pairs
FRAME_BATCH_S = 0.05  # one batch of frame timing: calls enough to last this long
FRAME_BATCHES = 7


def _paths(group: Any) -> tuple[dict[str, Callable[..., Any]], dict[str, Callable[..., Any]]]:
    """(direct, routed) callables per op for ``group``."""
    import torch
    import torch.distributed as dist

    from sglang_fl import get_runtime
    from sglang_fl.integrations.sglang.collectives import _bridge
    from sglang_fl.ops.collectives import _common

    def direct_all_reduce(x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x, group=group.device_group)
        return x

    def direct_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        n = group.world_size
        gathered = torch.empty((n * x.shape[0], *x.shape[1:]), dtype=x.dtype)
        _common.all_gather_single(gathered, x, group=group.device_group)
        return gathered.reshape((n, *x.shape)).movedim(0, 1).reshape(x.shape[0], -1)

    direct = {"all_reduce": direct_all_reduce, "all_gather": direct_all_gather}
    runtime = get_runtime()
    routed = {op: _bridge(op, runtime.resolve(op).fn, group, direct[op]) for op in OPS}
    return direct, routed


def _tensor(size: int) -> Any:
    import torch

    return torch.randn(size // 4 // 64, 64, generator=torch.Generator().manual_seed(size))


def _pairs_for(size: int, pairs: int) -> int:
    return pairs if size < LARGE else max(20, pairs // 5)


def _rank(rank: int, store: str, pairs: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    from sglang_fl.ops.collectives import CollectiveGroup

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=600),
    )
    cpu_group = dist.new_group([0, 1], backend="gloo")  # barriers apart from the timed group
    group = CollectiveGroup("bench", (0, 1), rank, torch.device("cpu"), dist.group.WORLD, cpu_group)
    direct, routed = _paths(group)
    rows = []
    for op in OPS:
        for size in SIZES:
            x = _tensor(size)
            for _ in range(3):  # warm-up
                direct[op](x.clone())
                routed[op](x.clone())
            times: dict[str, list[float]] = {"direct": [], "routed": []}
            for i in range(_pairs_for(size, pairs)):
                order = ("direct", "routed") if i % 2 == 0 else ("routed", "direct")
                for name in order:
                    fn = direct[op] if name == "direct" else routed[op]
                    y = x.clone()
                    dist.barrier(group=cpu_group)
                    start = time.perf_counter()
                    fn(y)
                    times[name].append(time.perf_counter() - start)
            rows.append((op, size, times["direct"], times["routed"]))
    if rank == 0:
        out.put(rows)
    dist.destroy_process_group()


@contextmanager
def _no_communication() -> Iterator[None]:
    """The ``torch.distributed`` calls of both paths return at once (frame timing only)."""
    import torch.distributed as dist

    from sglang_fl.ops.collectives import _common

    saved = dist.all_reduce, _common.all_gather_single

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    dist.all_reduce, _common.all_gather_single = nothing, nothing
    try:
        yield
    finally:
        dist.all_reduce, _common.all_gather_single = saved


def _per_call(fn: Callable[..., Any], x: Any, calls: int) -> float:
    """Seconds per call of ``fn(x)``: the fastest of several batches (the least disturbed)."""
    best = float("inf")
    for _ in range(FRAME_BATCHES):
        start = time.perf_counter()
        for _ in range(calls):
            fn(x)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def _calls_for(fn: Callable[..., Any], x: Any) -> int:
    """Calls per batch: about ``FRAME_BATCH_S`` worth (big gathers copy megabytes per call)."""
    start = time.perf_counter()
    for _ in range(10):
        fn(x)
    once = (time.perf_counter() - start) / 10
    return max(20, min(20_000, int(FRAME_BATCH_S / max(once, 1e-9))))


def frame_costs() -> dict[str, float]:
    """op -> seconds routing adds per call, without communication, in this process.

    What routing adds is Python (the bridge and the reference's frames, their argument checks,
    ``contiguous()`` of a contiguous tensor, which returns it): it does not grow with the
    tensor. Everything that touches the data (the output's allocation, SGLang's reshape) is
    the same code on both paths, so at large sizes the subtraction only measures memory noise.
    The frame is therefore timed on a 1 KiB and a 256 KiB tensor, the larger of the two kept.
    """
    import torch

    from sglang_fl.ops.collectives import CollectiveGroup

    torch.set_num_threads(1)
    # Shape only: with the communication gone no process group is touched.
    group = CollectiveGroup("frame", (0, 1), 0, torch.device("cpu"), None, None)
    direct, routed = _paths(group)
    costs = {}
    with _no_communication():
        for op in OPS:
            found = []
            for size in (SIZES[0], 1 << 18):
                x = _tensor(size)
                calls = _calls_for(direct[op], x)
                # Interleaved batches: a slow moment of the machine hits both alike.
                d = r = float("inf")
                for _ in range(3):
                    d = min(d, _per_call(direct[op], x, calls))
                    r = min(r, _per_call(routed[op], x, calls))
                found.append(r - d)
            costs[op] = max(found)
    return costs


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return q1, q2, q3


def main(argv: list[str]) -> int:
    import multiprocessing

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=200, help="pairs per size below 1 MiB")
    args = parser.parse_args(argv)
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        ranks = [context.Process(target=_rank, args=(r, store, args.pairs, out)) for r in (0, 1)]
        for p in ranks:
            p.start()
        rows = out.get(timeout=3600)
        for p in ranks:
            p.join(60)
    frames = frame_costs()
    print(
        f"{'op':<11} {'size':>7} {'pairs':>5} {'direct us':>10} {'routed us':>10} "
        f"{'pair ratio [IQR]':>22} {'min ratio':>9} {'frame us':>9} {'bound':>7}"
    )
    worst_pair = worst_bound = worst_min = 0.0
    for op, size, direct, routed in rows:
        ratios = [r / d for d, r in zip(direct, routed, strict=True)]
        q1, median, q3 = _quartiles(ratios)
        frame = frames[op]
        fastest = min(routed) / min(direct)
        worst_min = max(worst_min, fastest)
        d_med = statistics.median(direct)
        bound = 1 + max(frame, 0.0) / d_med
        worst_pair, worst_bound = max(worst_pair, median), max(worst_bound, bound)
        label = f"{size // 1024}K" if size < 1 << 20 else f"{size >> 20}M"
        print(
            f"{op:<11} {label:>7} {len(ratios):>5} {d_med * 1e6:10.1f} "
            f"{statistics.median(routed) * 1e6:10.1f} "
            f"{median:8.3f} [{q1:5.3f}, {q3:5.3f}] {fastest:9.3f} {frame * 1e6:9.2f} {bound:7.4f}"
        )
    print(f"worst median pair ratio routed/direct: {worst_pair:.3f}x (target <= 1.05x)")
    print(f"worst fastest-call ratio:              {worst_min:.3f}x (target <= 1.05x)")
    print(f"worst bound from the routed frame:     {worst_bound:.4f}x (target <= 1.05x)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
