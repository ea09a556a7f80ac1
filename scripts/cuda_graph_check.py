"""Check that routed SGLang layers capture into CUDA graphs and replay correctly, on a GPU.

Run where SGLang, sglang-fl and the vendor wheel to check are installed, on a CUDA machine::

    python scripts/cuda_graph_check.py [--json] [LAYER ...]

For each routed layer (the cases of ``tests/sglang/graph_layers.py``, the same ones the
torch.compile test runs): move it to the GPU, call it once eagerly (SGLang binds its forward,
kernels set up workspaces), capture one call into a ``torch.cuda.CUDAGraph`` on static input
buffers, copy fresh inputs into those buffers, replay, and compare the replayed outputs with an
eager call on the same fresh inputs. A kernel that syncs with the host, allocates outside the
graph pool or keeps Python-side state fails here. Exit status: 0 every layer matched, 1 a layer
failed, 2 no CUDA device.

``--simulate-on-cpu`` replaces graph capture with a stand-in that re-runs the captured call on
replay: no GPU check, but it exercises this script's own logic where no GPU is lent (tested in
``tests/sglang/test_graph_compile.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "sglang"))  # the routed layer cases

from graph_layers import LAYERS, LayerCase, identical, impl_of, tensors  # noqa: E402

from sglang_fl._strenum import StrEnum  # noqa: E402

# capture(fn) -> (the outputs of the captured call, replay): replay re-executes the capture on
# whatever the static input buffers hold, writing into the same output tensors.
Capture = Callable[[Callable[[], Any]], tuple[Any, Callable[[], None]]]
STATIC_SEED, FRESH_SEED = 1, 2


class Status(StrEnum):
    MATCHES = "matches"
    MISMATCH = "mismatch"
    CAPTURE_FAILED = "capture-failed"


@dataclass
class Row:
    layer: str
    op: str
    impl_id: str | None
    status: Status
    max_abs_diff: float | None = None
    error: str | None = None


def cuda_capture(fn: Callable[[], Any]) -> tuple[Any, Callable[[], None]]:
    """Capture ``fn`` into a CUDA graph, warmed up on a side stream as PyTorch requires."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()

    def replay() -> None:
        graph.replay()
        torch.cuda.synchronize()

    return outputs, replay


def rerun_capture(fn: Callable[[], Any]) -> tuple[Any, Callable[[], None]]:
    """A stand-in for CUDA graph capture (``--simulate-on-cpu``): replay re-runs ``fn`` and
    writes its results into the first call's output tensors, as a graph replay would."""
    outputs = fn()

    def replay() -> None:
        for buffer, value in zip(tensors(outputs), tensors(fn()), strict=True):
            if buffer is not value:
                buffer.copy_(value)

    return outputs, replay


def _max_abs_diff(want: list[torch.Tensor], got: list[torch.Tensor]) -> float | None:
    if len(want) != len(got) or any(a.shape != b.shape for a, b in zip(want, got, strict=True)):
        return None
    diffs = [(a.double() - b.double()).abs().max().item() for a, b in zip(want, got, strict=True)]
    return max((d for d in diffs if d == d), default=0.0)  # empty tensors: no difference


@torch.no_grad()
def check_layer(name: str, device: str, capture: Capture) -> Row:
    """Capture one call of layer ``name`` on ``device``, replay it on fresh inputs, compare."""
    op_name, make = LAYERS[name]
    case: LayerCase = make().to(device)
    static = case.inputs_on(device, STATIC_SEED)
    case.call(*(t.clone() if isinstance(t, torch.Tensor) else t for t in static))
    row = Row(name, op_name, impl_of(case.bound), Status.CAPTURE_FAILED)
    try:
        outputs, replay = capture(lambda: case.call(*static))
    except Exception as exc:  # reported in the row: the point of the check
        row.error = f"{type(exc).__name__}: {exc}"
        return row
    fresh = case.inputs_on(device, FRESH_SEED)
    for buffer, value in zip(static, fresh, strict=True):
        if isinstance(buffer, torch.Tensor):
            buffer.copy_(value)
    replay()
    want = tensors(case.call(*fresh))
    got = tensors(outputs)
    row.max_abs_diff = _max_abs_diff(want, got)
    row.status = Status.MATCHES if identical(want, got) else Status.MISMATCH
    return row


def render(rows: Sequence[Row]) -> str:
    lines = [f"{'layer':<24} {'op':<24} {'implementation':<40} {'status':<15} max |diff|"]
    for row in rows:
        diff = "" if row.max_abs_diff is None else f"{row.max_abs_diff:.3g}"
        lines.append(
            f"{row.layer:<24} {row.op:<24} {row.impl_id or '-':<40} {row.status:<15} {diff}"
        )
        if row.error:
            lines.append(f"    {row.error}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("layers", nargs="*", help=f"default: all of {', '.join(LAYERS)}")
    parser.add_argument("--json", action="store_true", help="one JSON object per layer")
    parser.add_argument(
        "--simulate-on-cpu", action="store_true", help="check this script's logic, not a GPU"
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.layers if name not in LAYERS]
    if unknown:
        parser.error(f"unknown layer(s) {', '.join(unknown)}; known: {', '.join(LAYERS)}")
    if args.simulate_on_cpu:
        device, capture = "cpu", rerun_capture
    elif torch.cuda.is_available():
        device, capture = "cuda", cuda_capture
    else:
        print("no CUDA device: CUDA graph capture cannot be checked here", file=sys.stderr)
        return 2
    from sglang.srt.plugins import load_plugins

    load_plugins()  # sglang-fl's plugin entry point routes the layers, as in a server
    rows = [check_layer(name, device, capture) for name in args.layers or LAYERS]
    if args.json:
        for row in rows:
            print(json.dumps(asdict(row)))
    else:
        print(render(rows))
    return 0 if all(row.status is Status.MATCHES for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
