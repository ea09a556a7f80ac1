"""sglang-fl as the ``sglang_fl`` provider of vLLM's norm IR ops (``ir_op_priority``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sglang_fl.dispatch_report import read_log

pytest.importorskip("vllm")

pytestmark = pytest.mark.usefixtures("vllm_config")

PRIORITY = ["sglang_fl", "native"]


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    x, residual, weight = (torch.randn(7, 128, generator=generator) for _ in range(3))
    return x, residual, weight


def test_provider_is_registered_and_reported(dispatch_log: Path) -> None:
    from vllm import ir

    assert "sglang_fl" in ir.ops.rms_norm.supported_providers()
    assert "sglang_fl" in ir.ops.fused_add_rms_norm.supported_providers()
    rows = [r for r in read_log(dispatch_log) if r["event"] == "function"]
    assert {r["function"] for r in rows} == {
        "vllm.ir.ops.rms_norm",
        "vllm.ir.ops.fused_add_rms_norm",
    }
    assert {r["impl_id"] for r in rows} == {"reference.rms_norm"}


def test_rms_norm_through_the_provider_equals_native() -> None:
    from vllm import ir

    x, _, weight = _inputs()
    native = ir.ops.rms_norm.impls["native"].impl_fn(x, weight, 1e-6)
    with ir.ops.rms_norm.set_priority(PRIORITY):
        assert ir.ops.rms_norm.dispatch(x, weight, 1e-6).provider == "sglang_fl"
        assert torch.equal(ir.ops.rms_norm(x, weight, 1e-6), native)
        # Calls outside the standard op go to the next provider.
        assert ir.ops.rms_norm.dispatch(x, None, 1e-6).provider == "native"
        assert ir.ops.rms_norm.dispatch(x, weight, 1e-6, 64).provider == "native"


def test_fused_add_rms_norm_is_functional_and_equals_native() -> None:
    from vllm import ir

    x, residual, weight = _inputs()
    want = ir.ops.fused_add_rms_norm.impls["native"].impl_fn(x, residual, weight, 1e-6)
    x_before, residual_before = x.clone(), residual.clone()
    with ir.ops.fused_add_rms_norm.set_priority(PRIORITY):
        got = ir.ops.fused_add_rms_norm(x, residual, weight, 1e-6)
        in_place = ir.ops.fused_add_rms_norm.maybe_inplace(
            x.clone(), residual.clone(), weight, 1e-6
        )
    assert torch.equal(x, x_before)
    assert torch.equal(residual, residual_before)
    for result in (got, in_place):
        assert torch.equal(result[0], want[0])
        assert torch.equal(result[1], want[1])


@pytest.mark.custom_ops("none", "-rms_norm")
def test_rms_norm_layer_left_to_vllm_reaches_sglang_fl_through_ir_priority() -> None:
    """With the layer's custom op disabled, vLLM's own forward still lands on sglang-fl."""
    from vllm import ir
    from vllm.model_executor.layers.layernorm import RMSNorm

    layer = RMSNorm(128)
    x = _inputs()[0]
    assert layer._forward_method.__name__ == "forward_native"
    with ir.ops.rms_norm.set_priority(PRIORITY):
        assert ir.ops.rms_norm.dispatch(x, layer.weight.data, 1e-6).provider == "sglang_fl"
        assert torch.equal(layer(x), ir.ops.rms_norm.impls["native"].impl_fn(x, layer.weight, 1e-6))
