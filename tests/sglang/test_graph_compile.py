"""Routed SGLang layers under ``torch.compile(fullgraph=True)`` with kernels dynamo cannot trace.

A vendor wheel is built here whose every kernel first checksums its inputs on the host with
``zlib`` (a C extension, reached through ``.numpy()``) and branches on a value read back with
``.item()``, then computes the contract's reference. Dynamo cannot trace either step, so
without sglang-fl's custom ops each of these layers fails to compile with ``fullgraph=True``;
with them each layer compiles to a graph holding the op ``sglang_fl::<op>`` and gives exactly
the eager results. The layers run in subprocesses (``graph_layers.py``) with the wheel on
``PYTHONPATH``, so entry-point discovery and SGLang's plugin loading are the real ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sglang")

from graph_layers import LAYERS
from sglang_processes import install_source

from sglang_fl.ops.graph_spec import GRAPH_SPECS

HERE = Path(__file__).parent
WORKER = HERE / "graph_layers.py"
CUDA_GRAPH_SCRIPT = HERE.parent.parent / "scripts" / "cuda_graph_check.py"

VENDOR_MODULE = '''
"""Kernels dynamo cannot trace: a host checksum (zlib, a C extension) and a data-dependent
branch, around the contract's reference math."""
import zlib

import torch

from sglang_fl import hookimpl
from sglang_fl.dispatch.types import BackendImplKind, BackendPriority, OpImpl
from sglang_fl.ops import STANDARD_OPS


def _host_round_trip(values):
    for value in values:
        if isinstance(value, torch.Tensor) and value.numel():
            data = value.detach().contiguous().view(torch.uint8).numpy().tobytes()
            zlib.crc32(data)
            if value.is_floating_point() and not bool(value.isfinite().all().item()):
                raise ValueError("non-finite input")


def _untraceable(math):
    def kernel(obj, *args, **kwargs):
        _host_round_trip(args)
        return math(obj, *args, **kwargs)

    return kernel


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register_many(
        OpImpl(op_name=name, impl_id=f"vendor.hostsync.{name}", kind=BackendImplKind.VENDOR,
               fn=_untraceable(contract.reference), vendor="hostsync",
               priority=BackendPriority.VENDOR)
        for name, contract in STANDARD_OPS.items()
    )
'''

VENDOR_PYPROJECT = """
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang-fl-hostsync"
version = "0.0.1"
dependencies = ["sglang-fl"]

[project.entry-points."sglang_fl.backends"]
hostsync = "sglang_fl_hostsync"
"""

WORKER_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def vendor_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The host-sync vendor installed into a directory of its own."""
    root = tmp_path_factory.mktemp("hostsync-vendor")
    source = root / "src"
    (source / "sglang_fl_hostsync").mkdir(parents=True)
    (source / "sglang_fl_hostsync" / "__init__.py").write_text(VENDOR_MODULE)
    (source / "pyproject.toml").write_text(VENDOR_PYPROJECT)
    return install_source(source, root)


def run_layers(site: Path, *layers: str, **env: str) -> dict[str, dict[str, Any]]:
    """Run ``graph_layers.py`` on ``layers`` with the vendor importable; results by layer."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_FL_")}
    environ.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        **env,
    )
    done = subprocess.run(
        [sys.executable, str(WORKER), *layers],
        env=environ,
        capture_output=True,
        text=True,
        timeout=WORKER_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {row["layer"]: row for row in rows}


@pytest.fixture(scope="module")
def compiled(vendor_site: Path) -> dict[str, dict[str, Any]]:
    return run_layers(vendor_site)


@pytest.mark.parametrize("layer", list(LAYERS))
def test_routed_layer_compiles_fullgraph_to_its_custom_op(
    compiled: dict[str, dict[str, Any]], layer: str
) -> None:
    row = compiled[layer]
    op_name = row["op"]
    assert "error" not in row, row.get("error")
    # One opaque node, running the untraceable kernel the layer is bound to (its key says so).
    ((target, key),) = row["custom_op_calls"]
    assert target == f"sglang_fl.{op_name}.default"
    assert key.startswith(f"{op_name}:vendor.hostsync.{op_name}#"), key
    if row["impl_id"] is not None:  # a layer (a kernel function carries no bound forward)
        assert row["impl_id"] == f"vendor.hostsync.{op_name}"
    assert row["outputs_identical"], "compiled outputs differ from eager"
    # A norm's custom op writes x + residual into residual (the contract allows it): the
    # returned tensors are what callers use. Every other op leaves its inputs as eager does.
    if GRAPH_SPECS[op_name].second_output_into is None:
        assert row["inputs_identical"], "compiled in-place results differ from eager"


def test_the_kernels_are_untraceable_without_the_custom_ops(vendor_site: Path) -> None:
    """The control: the same layers with ``SGLANG_FL_CUSTOM_OPS=0`` fail to compile."""
    rows = run_layers(vendor_site, "RMSNorm+residual", "RotaryEmbedding", SGLANG_FL_CUSTOM_OPS="0")
    for row in rows.values():
        assert row["impl_id"] == f"vendor.hostsync.{row['op']}"
        assert "error" in row, f"{row['layer']} compiled without the custom op"
        assert row["error_type"].startswith("torch._dynamo.exc."), row["error"]
        assert "sglang_fl_hostsync" in row["error"], "dynamo stopped inside the vendor kernel"


# --- the CUDA graph capture script (run on a GPU when one is lent) --------------------------


def _script(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_FL_")}
    return subprocess.run(
        [sys.executable, str(CUDA_GRAPH_SCRIPT), *args],
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=WORKER_TIMEOUT_S,
    )


def test_cuda_graph_script_logic_on_every_routed_layer() -> None:
    """``--simulate-on-cpu``: capture, fresh inputs, replay and comparison, on each layer."""
    done = _script("--simulate-on-cpu", "--json")
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [row["layer"] for row in rows] == list(LAYERS)
    for row in rows:
        assert row["status"] == "matches", row
        if row["layer"] != "fused_gate_sigmoid_mul":  # a kernel function has no bound forward
            assert row["impl_id"] == f"reference.{row['op']}", row


def test_cuda_graph_script_catches_a_replay_that_computes_nothing(router: Any) -> None:
    """A replay that leaves the captured outputs stale is a mismatch, not a pass."""
    sys.path.insert(0, str(CUDA_GRAPH_SCRIPT.parent))
    import cuda_graph_check

    def stale_capture(fn: Any) -> tuple[Any, Any]:
        return fn(), lambda: None

    row = cuda_graph_check.check_layer("SiluAndMul", "cpu", stale_capture)
    assert row.status is cuda_graph_check.Status.MISMATCH
    assert row.max_abs_diff is not None
    assert row.max_abs_diff > 0
    assert row.impl_id == "reference.silu_and_mul"


def test_cuda_graph_script_without_a_gpu_says_so() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the script runs the real check instead")
    done = _script("RMSNorm")
    assert done.returncode == 2
    assert "no CUDA device" in done.stderr
