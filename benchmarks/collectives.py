"""Per-call cost of a routed collective vs SGLang's direct call, 2 ranks on gloo (issue 23).

For ``all_reduce`` and ``all_gather`` at 1 KiB .. 16 MiB (float32 per rank), two spawned ranks
time, interleaved on the same tensors:

- ``direct``: what SGLang's ``GroupCoordinator`` calls on the CPU (``torch.distributed``
  on the device group, with SGLang's reshape for ``all_gather``): the method's own work;
- ``routed``: the method sglang-fl binds on a multi-rank group
  (``integrations.sglang.collectives._bridge`` around ``get_runtime().resolve(op).fn``),
  i.e. one extra Python frame before the same ``torch.distributed`` call.

Prints one row per op and size with the median per-call time of each and ``routed/direct``
side by side (target: at most 1.05x). A world-size-1 group is not timed: it keeps SGLang's
own function objects, nothing is added (``tests/sglang/test_collectives.py`` checks that).

``python benchmarks/collectives.py [--reps N]`` in an environment with sglang-fl installed
(SGLang itself is not needed: no coordinator is built).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any

SIZES = [1 << k for k in range(10, 25, 2)]  # 1 KiB .. 16 MiB
OPS = ("all_reduce", "all_gather")


def _rank(rank: int, store: str, reps: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    from sglang_fl import get_runtime
    from sglang_fl.integrations.sglang.collectives import _bridge
    from sglang_fl.ops.collectives import CollectiveGroup
    from sglang_fl.ops.collectives._common import all_gather_single

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=300),
    )
    group = CollectiveGroup(
        "bench", (0, 1), rank, torch.device("cpu"), dist.group.WORLD, dist.group.WORLD
    )
    runtime = get_runtime()

    def direct_all_reduce(x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x, group=group.device_group)
        return x

    def direct_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        gathered = torch.empty((2 * x.shape[0], *x.shape[1:]), dtype=x.dtype)
        all_gather_single(gathered, x, group=group.device_group)
        return gathered.reshape((2, *x.shape)).movedim(0, 1).reshape(x.shape[0], -1)

    direct = {"all_reduce": direct_all_reduce, "all_gather": direct_all_gather}
    rows = []
    for op in OPS:
        routed = _bridge(op, runtime.resolve(op).fn, group, direct[op])
        for size in SIZES:
            x = torch.randn(size // 4 // 64, 64)
            times: dict[str, list[float]] = {"direct": [], "routed": []}
            for _ in range(3):  # warm-up
                direct[op](x.clone())
                routed(x.clone())
            for _ in range(reps):
                for name, fn in (("direct", direct[op]), ("routed", routed)):
                    y = x.clone()
                    dist.barrier(group=group.cpu_group)
                    start = time.perf_counter()
                    fn(y)
                    times[name].append(time.perf_counter() - start)
            rows.append(
                (op, size, statistics.median(times["direct"]), statistics.median(times["routed"]))
            )
    if rank == 0:
        out.put(rows)
    dist.destroy_process_group()


def main(argv: list[str]) -> int:
    import multiprocessing

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args(argv)
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        ranks = [context.Process(target=_rank, args=(r, store, args.reps, out)) for r in (0, 1)]
        for p in ranks:
            p.start()
        rows = out.get(timeout=1800)
        for p in ranks:
            p.join(60)
    print(f"{'op':<11} {'size':>9} {'direct us':>10} {'routed us':>10} {'routed/direct':>14}")
    worst = 0.0
    for op, size, d, r in rows:
        ratio = r / d
        worst = max(worst, ratio)
        label = f"{size // 1024} KiB" if size < 1 << 20 else f"{size >> 20} MiB"
        print(f"{op:<11} {label:>9} {d * 1e6:10.1f} {r * 1e6:10.1f} {ratio:14.3f}")
    print(f"worst routed/direct: {worst:.3f}x (target <= 1.05x)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
