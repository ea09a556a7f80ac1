"""Packaging and discovery: the installed wheel is found, loads, and explains why it is unused.

Every check runs in a fresh interpreter (the CLI, or ``python -c``), as a user would meet the
plugin: nothing here is imported into the test process first.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import sglang_fl_cuda
import torch
from sglang_fl_cuda import plugin
from sglang_fl_cuda.impl.causal_conv import ADAPTERS as CAUSAL_CONV
from sglang_fl_cuda.impl.collectives import SERVED
from sglang_fl_cuda.impl.linear_attention import ADAPTERS as LINEAR_ATTENTION
from sglang_fl_cuda.plugin import NO_KERNEL

from sglang_fl.ops import STANDARD_OPS
from sglang_fl.testing.vendor import VendorSuite

# The sgl_kernel double lies beside this file, for the scripts that ask for it.
SUITE = VendorSuite("cuda", plugin.sglang_fl_register_ops, doubles=Path(__file__).parent)
# The ops this wheel implements (the MoE gate kernel function, fused_gate_sigmoid_mul, has
# no kernel here: the reference serves it).
VENDOR_OPS = SUITE.ops
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU explanation")
cli, python, cuda_candidate = SUITE.cli, SUITE.python, SUITE.candidate


def test_listed_from_its_distribution_and_loaded() -> None:
    (plugin,) = [p for p in cli("plugins", "--json")["plugins"] if p["name"] == "cuda"]
    assert plugin == {
        "name": "cuda",
        "module": "sglang_fl_cuda.plugin",
        "distribution": "sglang-fl-cuda",
        "version": sglang_fl_cuda.__version__,
        "status": "loaded",
        "hooks": ["sglang_fl_communicator", "sglang_fl_platform", "sglang_fl_register_ops"],
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
        "decode_attention",
        "extend_attention",
        *SERVED,  # the NCCL collectives: probed apart, no GPU either
        *LINEAR_ATTENTION,
        *CAUSAL_CONV,
    } == VENDOR_OPS
    SUITE.assert_unused(decisions, NO_KERNEL, because="no CUDA device visible")


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
from sglang_triton_double import SglangTritonGdnDouble
from flash_attn_double import FlashAttnDouble
double = sys.modules["sgl_kernel"] = SglKernelDouble()
sys.modules["sgl_kernel.flash_attn"] = FlashAttnDouble()
from causal_conv_double import SglKernelMambaDouble
sys.modules["sgl_kernel.mamba"] = SglKernelMambaDouble()
import torch.distributed  # and a torch built with NCCL 2.27.3, for the collectives' probe
torch.distributed.is_nccl_available = lambda: True
torch.cuda.nccl.version = lambda: (2, 27, 3)
sys.modules["sglang_fl_cuda.sglang_triton"] = SglangTritonGdnDouble()
from sglang_fl.runtime import get_runtime
runtime = get_runtime()
decisions = {op: runtime.resolve(op).decision.to_dict() for op in runtime.registry.ops()}
x = torch.randn(2, 32, dtype=torch.float16)
out = runtime.resolve("silu_and_mul").fn(None, x)
print(json.dumps({"decisions": decisions, "calls": double.called,
                  "shape": list(out.shape)}))
"""
    )
    # Four probes besides sgl_kernel's: FlashAttention-3 for attention, NCCL for the
    # collectives, SGLang's Triton kernels for the GDN family, sgl_kernel.mamba for the convs.
    triton = "sglang_fl_cuda.sglang_triton 0.0.0+double imported; 1 CUDA device"
    fa3 = "sgl_kernel.flash_attn 0.0.0+double imported; 1 CUDA device"
    convs = "sgl_kernel.mamba 0.0.0+double imported; 1 CUDA device"
    SUITE.assert_routed(
        found["decisions"],
        "sgl_kernel 0.0.0+double imported; 1 CUDA device",
        reasons={
            **dict.fromkeys(SERVED, "NCCL 2.27.3 through torch.distributed; 1 CUDA device"),
            **dict.fromkeys(LINEAR_ATTENTION, triton),
            **dict.fromkeys(("decode_attention", "extend_attention"), fa3),
            **dict.fromkeys(CAUSAL_CONV, convs),
        },
    )
    assert found["calls"] == ["silu_and_mul"]
    assert found["shape"] == [2, 16]
