"""Packaging and discovery: the installed wheel is found, loads, and explains why it is unused.

Every check runs in a fresh interpreter (the CLI, or ``python -c``), as a user would meet the
plugin: nothing here is imported into the test process first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import sglang_fl_cuda
import torch
from sglang_fl_cuda import plugin
from sglang_fl_cuda.plugin import NO_KERNEL

from sglang_fl.ops import STANDARD_OPS
from sglang_fl.testing.checks import registered_by

TESTS = Path(__file__).parent
# The ops this wheel implements (the MoE gate kernel function, fused_gate_sigmoid_mul, has
# no kernel here: the reference serves it).
VENDOR_OPS = {
    op for op in STANDARD_OPS if registered_by(plugin.sglang_fl_register_ops).implementations(op)
}
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU explanation")


def clean_env(*paths: Path) -> dict[str, str]:
    """The environment without any SGLANG_FL_* setting that could change selection."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_FL_")}
    # The sgl_kernel double lies beside this file, for the scripts that ask for it.
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (*paths, TESTS))
    return env


def cli(*args: str) -> Any:
    script = Path(sys.executable).with_name("sglang-fl")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "sglang_fl"]
    done = subprocess.run(
        [*command, *args], capture_output=True, text=True, env=clean_env(), check=True
    )
    return json.loads(done.stdout)


def python(code: str, *paths: Path) -> Any:
    """Run ``code`` in a fresh interpreter (``paths`` first on its path); it prints JSON."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=clean_env(*paths),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def cuda_candidate(decision: dict[str, Any]) -> dict[str, Any]:
    (mine,) = [c for c in decision["candidates"] if c["plugin"] == "cuda"]
    return mine


def test_listed_from_its_distribution_and_loaded() -> None:
    (plugin,) = [p for p in cli("plugins", "--json")["plugins"] if p["name"] == "cuda"]
    assert plugin == {
        "name": "cuda",
        "module": "sglang_fl_cuda.plugin",
        "distribution": "sglang-fl-cuda",
        "version": sglang_fl_cuda.__version__,
        "status": "loaded",
        "hooks": ["sglang_fl_platform", "sglang_fl_register_ops"],
        "error": None,
        "builtin": False,
    }


@NO_GPU
def test_every_op_resolves_to_reference_and_says_why_cuda_is_not_used() -> None:
    decisions = {d["op"]: d for d in cli("ops", "--json")["ops"]}
    assert set(decisions) == set(STANDARD_OPS)
    assert {
        "silu_and_mul",
        "rms_norm",
        "rotary_embedding",
        "gelu_and_mul",
        "gemma_rms_norm",
        "topk",
        "fused_moe",
    } == VENDOR_OPS
    for op, decision in decisions.items():
        assert decision["chosen"] == f"reference.{op}"
        if op not in VENDOR_OPS:  # no candidate; for a NO_KERNEL op `ops` says why
            assert not [c for c in decision["candidates"] if c["plugin"] == "cuda"], op
            if op in NO_KERNEL:
                (gap,) = [g for g in decision["no_kernel"] if g["plugin"] == "cuda"]
                assert gap["reason"] == NO_KERNEL[op]
            continue
        mine = cuda_candidate(decision)
        assert mine["impl_id"] == "vendor.cuda"
        assert mine["distribution"] == "sglang-fl-cuda"
        assert mine["outcome"] == "rejected"
        assert mine["available"] is False
        assert mine["availability_reason"].startswith("no CUDA device visible")
        assert mine["reason"] == f"unavailable: {mine['availability_reason']}"


@NO_GPU
def test_explain_names_the_reason() -> None:
    decision = cli("explain", "rotary_embedding", "--json")
    assert decision["op"] == "rotary_embedding"
    assert decision["chosen"] == "reference.rotary_embedding"
    assert cuda_candidate(decision)["availability_reason"].startswith("no CUDA device visible")


@NO_GPU
def test_sdk_is_never_imported_without_a_device() -> None:
    found = python(
        """
        import json, sys
        import sglang_fl_cuda.plugin
        after_import = "sgl_kernel" in sys.modules
        from sglang_fl.runtime import get_runtime
        runtime = get_runtime()
        after_load = "sgl_kernel" in sys.modules
        chosen = {op: runtime.resolve(op).decision.chosen.impl_id for op in runtime.registry.ops()}
        print(json.dumps({"imported": [after_import, after_load, "sgl_kernel" in sys.modules],
                          "chosen": chosen}))
        """
    )
    assert found["imported"] == [False, False, False]
    assert found["chosen"] == {op: f"reference.{op}" for op in STANDARD_OPS}


# A machine with a GPU, simulated: torch reports one CUDA device before the plugin is imported.
WITH_ONE_DEVICE = """
import json, sys
import torch
torch.cuda.device_count = lambda: 1
"""


def test_device_but_a_broken_sdk_says_the_import_failed(tmp_path: Path) -> None:
    # An installed sgl_kernel whose native libraries do not load, as on a machine without CUDA.
    broken = tmp_path / "sgl_kernel"
    broken.mkdir()
    (broken / "__init__.py").write_text(
        'raise OSError("libcudart.so.12: cannot open shared object file")\n'
    )
    code = """
from sglang_fl.runtime import get_runtime
decision = get_runtime().resolve("silu_and_mul").decision
print(json.dumps(decision.to_dict()))
"""
    found = python(WITH_ONE_DEVICE + code, tmp_path)
    assert found["chosen"] == "reference.silu_and_mul"
    assert cuda_candidate(found)["availability_reason"] == (
        "sgl_kernel import failed: OSError: libcudart.so.12: cannot open shared object file"
    )


def test_device_and_sdk_route_every_op_to_the_kernels() -> None:
    found = python(
        WITH_ONE_DEVICE
        + """
from sgl_kernel_double import SglKernelDouble
double = sys.modules["sgl_kernel"] = SglKernelDouble()
from sglang_fl.runtime import get_runtime
runtime = get_runtime()
decisions = {op: runtime.resolve(op).decision.to_dict() for op in runtime.registry.ops()}
x = torch.randn(2, 32, dtype=torch.float16)
out = runtime.resolve("silu_and_mul").fn(None, x)
print(json.dumps({"decisions": decisions, "calls": double.called,
                  "shape": list(out.shape)}))
"""
    )
    assert set(found["decisions"]) >= VENDOR_OPS
    for op, decision in found["decisions"].items():
        if op not in VENDOR_OPS:
            assert decision["chosen"] == f"reference.{op}", op
            continue
        assert decision["chosen"] == "vendor.cuda", op
        assert cuda_candidate(decision)["availability_reason"] == (
            "sgl_kernel 0.0.0+double imported; 1 CUDA device"
        )
    assert found["calls"] == ["silu_and_mul"]
    assert found["shape"] == [2, 16]
