"""Packaging and discovery: the installed wheel is found, loads, and explains why it is unused.

Each check runs in a fresh interpreter (the CLI, or ``python -c``), as a user meets the plugin.
torch-npu is never installed here: an Ascend machine is simulated with the test double.
"""

from __future__ import annotations

from pathlib import Path

import sglang_fl_ascend
from sglang_fl_ascend import plugin
from sglang_fl_ascend.impl.collectives import COLLECTIVES
from sglang_fl_ascend.impl.linear_attention import ADAPTERS as LINEAR_ATTENTION
from sglang_fl_ascend.plugin import NO_KERNEL

from sglang_fl.ops import STANDARD_OPS
from sglang_fl.testing.vendor import VendorSuite

# The torch_npu double lies beside this file, for the scripts that ask for it.
SUITE = VendorSuite("ascend", plugin.sglang_fl_register_ops, doubles=Path(__file__).parent)
# The ops this wheel implements (the MoE gate kernel function, fused_gate_sigmoid_mul, has
# no kernel here: the reference serves it).
VENDOR_OPS = SUITE.ops
cli, python, ascend_candidate = SUITE.cli, SUITE.python, SUITE.candidate


def test_listed_from_its_distribution_and_loaded() -> None:
    (plugin,) = [p for p in cli("plugins", "--json")["plugins"] if p["name"] == "ascend"]
    assert plugin == {
        "name": "ascend",
        "module": "sglang_fl_ascend.plugin",
        "distribution": "sglang-fl-ascend",
        "version": sglang_fl_ascend.__version__,
        "status": "loaded",
        "hooks": ["sglang_fl_communicator", "sglang_fl_platform", "sglang_fl_register_ops"],
        "error": None,
        "builtin": False,
    }


def test_every_op_resolves_to_reference_and_says_why_ascend_is_not_used() -> None:
    decisions = {d["op"]: d for d in cli("ops", "--json")["ops"]}
    assert set(decisions) == set(STANDARD_OPS)
    assert {
        "silu_and_mul",
        "rms_norm",
        "rotary_embedding",
        "gelu_and_mul",
        "gelu_new",
        "gelu_quick",
        "gemma_rms_norm",
        "layer_norm",
        "mrotary_embedding",
        "topk",
        "fused_moe",
        "store_kv_cache",
        "decode_attention",
        "extend_attention",
        "w8a8_int8_linear",
        "wna16_linear",
        *COLLECTIVES,  # HCCL comes with torch_npu: the same probe (not quant_all_reduce)
        *LINEAR_ATTENTION,
    } == VENDOR_OPS
    SUITE.assert_unused(
        decisions,
        NO_KERNEL,
        because="torch_npu import failed: ModuleNotFoundError: No module named 'torch_npu'",
    )


def test_explain_names_the_reason() -> None:
    decision = cli("explain", "silu_and_mul", "--json")
    assert decision["chosen"] == "reference.silu_and_mul"
    assert ascend_candidate(decision)["availability_reason"].startswith("torch_npu import failed")


def test_sdk_is_imported_by_the_first_probe_not_by_loading() -> None:
    found = python(
        """
        import json, sys
        import sglang_fl_ascend.plugin
        steps = ["torch_npu" in sys.modules]
        from sglang_fl.runtime import get_runtime
        runtime = get_runtime()
        steps.append("torch_npu" in sys.modules)
        from torch_npu_double import TorchNpuDouble
        sys.modules["torch_npu"] = TorchNpuDouble(devices=1)
        chosen = runtime.resolve("rms_norm").decision.chosen.impl_id
        print(json.dumps({"before_probe": steps, "chosen": chosen}))
        """
    )
    assert found == {"before_probe": [False, False], "chosen": "vendor.ascend"}


def test_sdk_without_a_visible_npu() -> None:
    found = python(
        """
        import json, sys
        from torch_npu_double import TorchNpuDouble
        sys.modules["torch_npu"] = TorchNpuDouble(devices=0)
        from sglang_fl.runtime import get_runtime
        print(json.dumps(get_runtime().resolve("rms_norm").decision.to_dict()))
        """
    )
    assert found["chosen"] == "reference.rms_norm"
    assert ascend_candidate(found)["availability_reason"] == (
        "no NPU visible (torch_npu imported but found no Ascend driver or device)"
    )


def test_sdk_without_cann_says_the_import_failed(tmp_path: Path) -> None:
    # An installed torch_npu on a machine without CANN: its native libraries do not load.
    broken = tmp_path / "torch_npu"
    broken.mkdir()
    (broken / "__init__.py").write_text(
        'raise ImportError("libhccl.so: cannot open shared object file")\n'
    )
    found = python(
        """
        import json
        from sglang_fl.runtime import get_runtime
        print(json.dumps(get_runtime().resolve("silu_and_mul").decision.to_dict()))
        """,
        tmp_path,
    )
    assert ascend_candidate(found)["availability_reason"] == (
        "torch_npu import failed: ImportError: libhccl.so: cannot open shared object file"
    )


def test_npu_and_sdk_route_every_op_to_the_operators() -> None:
    found = python(
        """
        import json, sys
        import torch
        from torch_npu_double import TorchNpuDouble
        from sgl_kernel_npu_double import SglKernelNpuDouble
        double = sys.modules["torch_npu"] = TorchNpuDouble(devices=2)
        package = sys.modules["sgl_kernel_npu"] = SglKernelNpuDouble()
        sys.modules.update(package.submodules)
        from sglang_fl.runtime import get_runtime
        runtime = get_runtime()
        decisions = {op: runtime.resolve(op).decision.to_dict() for op in runtime.registry.ops()}
        out = runtime.resolve("silu_and_mul").fn(None, torch.randn(2, 8))
        print(json.dumps({"decisions": decisions, "calls": double.called,
                          "shape": list(out.shape)}))
        """
    )
    # Two probes: torch_npu for its operators, the sgl_kernel_npu package for the GDN ones.
    probes = {"torch_npu": "torch_npu 2.7.1.post2+double", "sgl": "sgl_kernel_npu 0.0.0+double"}
    for op, decision in found["decisions"].items():
        if op not in SUITE.ops:
            assert decision["chosen"] == f"reference.{op}", op
            continue
        sdk = probes["sgl" if op in LINEAR_ATTENTION else "torch_npu"]
        assert decision["chosen"] == SUITE.impl_id, op
        reason = ascend_candidate(decision)["availability_reason"]
        assert reason == f"{sdk} imported; 2 NPUs", op
    assert found["calls"] == ["npu_swiglu"]
    assert found["shape"] == [2, 4]
