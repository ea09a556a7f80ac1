"""One rank of SGLang's own ``GroupCoordinator``s, driven directly (no engine), for the tests.

``python group_run.py RANK WORLD_SIZE STORE_FILE`` loads SGLang's plugins the way a scheduler
worker does (``load_plugins()``: sglang-fl registers its hooks, SGLang applies them), joins a
gloo world through a file store, builds a multi-rank ``GroupCoordinator`` (``pp``) and a
one-rank one (``solo``) with SGLang's ``init_model_parallel_group``, calls every routed
collective on the multi-rank one, checks each result against the math, destroys the group and
prints one JSON line: ``{"rank", "pid", "results": {op: "ok" | problem}, "solo_untouched",
"routed_methods"}``. Exits non-zero on any failure.

``GROUP_RUN_SECOND=1`` builds a second multi-rank group (``ep``, the same ranks) and, after
``pp`` is destroyed, all-reduces on it before destroying it too (two groups, one vendor handle
when the vendor shares it). ``GROUP_RUN_FORK=1`` forks a child once the groups are routed; the
child exits normally (its exit handlers run) and the parent records its exit code as
``fork_child_exit``. ``GROUP_RUN_KEEP=1`` leaves ``pp`` undestroyed: interpreter exit tears
it down.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch


def main(rank: int, world_size: int, store: str) -> int:
    from sglang.srt.plugins import load_plugins

    load_plugins()
    import torch.distributed as dist
    from sglang.srt.distributed import parallel_state as ps

    from sglang_fl.integrations.sglang.collectives import METHODS, TENSOR_DICTS

    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=120),
    )
    ranks = list(range(world_size))
    make = ps.init_model_parallel_group
    group = make([ranks], rank, "gloo", use_custom_allreduce=False, group_name="pp")
    solo = make([[r] for r in ranks], rank, "gloo", use_custom_allreduce=False, group_name="solo")
    second = None
    if os.environ.get("GROUP_RUN_SECOND") == "1":
        second = make([ranks], rank, "gloo", use_custom_allreduce=False, group_name="ep")
    extra: dict[str, object] = {}
    if os.environ.get("GROUP_RUN_FORK") == "1":
        child = os.fork()
        if child == 0:  # a forked worker that exits normally: atexit handlers run here
            sys.exit(0)
        extra["fork_child_exit"] = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    n, me = world_size, group.rank_in_group
    g = torch.Generator().manual_seed(7)
    xs = [torch.randn(3, 4, generator=g) for _ in range(n)]  # every rank's input, everywhere
    results: dict[str, str] = {}

    def check(op: str, got: torch.Tensor, want: torch.Tensor) -> None:
        ok = got.shape == want.shape and torch.allclose(got, want, atol=1e-5, rtol=1e-5)
        results[op] = "ok" if ok else f"got {got.tolist()}, want {want.tolist()}"

    check("all_reduce", group.all_reduce(xs[me].clone()), sum(xs))
    check("quant_all_reduce", group.quant_all_reduce(xs[me].clone()), sum(xs))
    check("all_gather", group.all_gather(xs[me].clone(), dim=-1), torch.cat(xs, dim=-1))
    out = torch.empty(3 * n, 4)
    group.all_gather_into_tensor(out, xs[me].clone())
    check("all_gather_into_tensor", out, torch.cat(xs))
    sizes = [1 + r for r in ranks]
    check(
        "all_gatherv",
        group.all_gatherv(xs[me][: sizes[me]].clone(), sizes=sizes)[0],
        torch.cat([x[:s] for x, s in zip(xs, sizes, strict=False)]),
    )
    full = [torch.cat([x] * n) for x in xs]
    out = torch.empty(3, 4)
    group.reduce_scatter_tensor(out, full[me].clone())
    check("reduce_scatter_tensor", out, sum(full)[me * 3 : me * 3 + 3])
    check(
        "reduce_scatterv",
        group.reduce_scatterv(torch.cat([x[: sum(sizes)] for x in [xs[me]]]), sizes=sizes),
        sum(x[: sum(sizes)] for x in xs)[sum(sizes[:me]) : sum(sizes[: me + 1])],
    )
    check("broadcast", group.broadcast(xs[me].clone(), src=n - 1), xs[n - 1])
    if me == 0:
        group.send(xs[0].clone(), dst=n - 1)
        results["send"] = "ok"
    elif me == n - 1:
        check("recv", group.recv(xs[0].shape, xs[0].dtype, src=0), xs[0])
    out = torch.empty(3 * n, 4)
    group.all_to_all_single(out, full[me].clone())
    check("all_to_all_single", out, torch.cat([f[me * 3 : me * 3 + 3] for f in full]))
    gathered = group.gather(xs[me].clone(), dst=n - 1, dim=0)
    if me == n - 1:
        check("gather", gathered, torch.cat(xs))
    else:
        results["gather"] = "ok" if gathered is None else f"got {gathered!r} off rank dst"
    parts = [xs[me] * (r + 1) for r in ranks]  # rank r's entry: every rank's x times r + 1
    out = torch.empty(3, 4)
    returned = group.reduce_scatter(out, parts)
    check("reduce_scatter", out, sum(xs) * (me + 1))
    if returned is not out:
        results["reduce_scatter"] = "did not return output"
    # Pipeline parallelism's path: a dict of activations (an empty tensor and a non-tensor
    # value too), whole and split for an all-gather over the ``solo`` group, as SGLang does.
    payload = {"hidden": xs[0] * 2, "empty": torch.empty(0, 4), "step": 3}
    for name, all_gather_group in (("tensor_dict", None), ("tensor_dict_split", solo)):
        if me == 0:
            works = group.send_tensor_dict(
                dict(payload), dst=n - 1, all_gather_group=all_gather_group, async_send=True
            )
            for work in works:
                work.work.wait()
            results[name] = "ok"
        elif me == n - 1:
            got = group.recv_tensor_dict(src=0, all_gather_group=all_gather_group)
            same = sorted(got) == sorted(payload) and got["step"] == 3
            same = same and got["empty"].shape == (0, 4)
            check(name, got["hidden"], payload["hidden"])
            if not same:
                results[name] = f"got {got!r}"
    # Refused before anything is sent: a peer outside the group, or this rank itself.
    for where, dst in (("self", me), ("outside", n)):
        try:
            group.send_tensor_dict({"hidden": xs[me]}, dst=dst)
            results[f"tensor_dict_to_{where}"] = "accepted"
        except ValueError as exc:
            wanted = f"send_tensor_dict: dst={dst} is not another rank of the {n}-rank group"
            results[f"tensor_dict_to_{where}"] = "ok" if str(exc).startswith(wanted) else str(exc)
    # A routed coordinator shadows SGLang's methods with instance attributes; a one-rank one
    # keeps the class's own functions (the same objects SGLang calls).
    routed = sorted(name for name in (*METHODS, *TENSOR_DICTS) if name in vars(group))
    solo_untouched = not any(name in vars(solo) for name in (*METHODS, *TENSOR_DICTS)) and all(
        getattr(solo, name).__func__ is getattr(type(solo), name)
        for name in (*METHODS, *TENSOR_DICTS)
    )
    if os.environ.get("GROUP_RUN_KEEP") != "1":
        group.destroy()
    if second is not None:  # still served after the first group let go of a shared handle
        check("all_reduce_on_second_group", second.all_reduce(xs[me].clone()), sum(xs))
        second.destroy()
    record = {
        "rank": rank,
        "pid": os.getpid(),
        "results": results,
        "solo_untouched": solo_untouched,
        "routed_methods": routed,
        **extra,
    }
    print(json.dumps(record), flush=True)
    return 0 if all(v == "ok" for v in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
