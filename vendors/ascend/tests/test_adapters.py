"""The torch_npu adapters against the ``torch_npu`` test double (no NPU, no CANN, no torch-npu).

Every case and dtype of each op contract goes through core's conformance check (values vs the
reference, untouched inputs, in-place outputs); the tests below pin the operator calls as
SGLang's ``forward_npu`` makes them: argument order, returned tuples, what is written where.
"""

from __future__ import annotations

import pytest
import torch
from sglang_fl_ascend.impl.activation import silu_and_mul_npu
from sglang_fl_ascend.impl.normalization import rms_norm_npu
from sglang_fl_ascend.impl.rotary import rotary_embedding_npu
from sglang_fl_ascend.register_ops import register_builtins
from torch_npu_double import TorchNpuDouble

from sglang_fl import Unsupported
from sglang_fl.dispatch.types import BackendImplKind
from sglang_fl.ops import STANDARD_OPS, OpCase
from sglang_fl.testing.checks import PASSED, check_case, contract_grid, registered_by

REGISTRY = registered_by(register_builtins)
IMPLS = {op: impl for op in STANDARD_OPS for impl in REGISTRY.implementations(op)}
CASES = [
    pytest.param(op, case, dtype, id=f"{op}/{case_id}")
    for op in STANDARD_OPS
    for case, dtype, case_id in contract_grid(op)
]


def test_seed_registration_of_the_adapters_themselves() -> None:
    assert {op: impl.fn for op, impl in IMPLS.items()} == {
        "silu_and_mul": silu_and_mul_npu,
        "rms_norm": rms_norm_npu,
        "rotary_embedding": rotary_embedding_npu,
    }
    for impl in IMPLS.values():
        assert impl.kind is BackendImplKind.VENDOR
        assert (impl.vendor, impl.impl_id, impl.priority) == ("ascend", "vendor.ascend", 100)
        assert impl.availability_probe is not None


@pytest.mark.parametrize(("op", "case", "dtype"), CASES)
def test_contract_case(
    torch_npu: TorchNpuDouble, op: str, case: OpCase, dtype: torch.dtype
) -> None:
    outcome = check_case(IMPLS[op], case, dtype)
    assert outcome.status == PASSED, outcome.message
    assert len(torch_npu.calls) == 1


def test_silu_and_mul_is_npu_swiglu_over_the_last_dim(torch_npu: TorchNpuDouble) -> None:
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    out = silu_and_mul_npu(None, x)
    ((name, args, kwargs),) = torch_npu.calls
    assert name == "npu_swiglu"
    assert args[0] is x
    assert kwargs == {"dim": -1}
    assert out.shape == (3, 4)


def norm_layer(hidden: int, dtype: torch.dtype = torch.float16) -> torch.nn.Module:
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.rand(hidden).to(dtype))
    layer.variance_epsilon = 1e-5
    return layer


def test_rms_norm_returns_y_of_npu_rms_norm(torch_npu: TorchNpuDouble) -> None:
    layer, x = norm_layer(16), torch.randn(4, 16, dtype=torch.float16)
    out = rms_norm_npu(layer, x)
    ((name, (kernel_x, gamma, epsilon), _),) = torch_npu.calls
    assert name == "npu_rms_norm"
    assert kernel_x is x
    assert not isinstance(gamma, torch.nn.Parameter)
    assert torch.equal(gamma, layer.weight)
    assert epsilon == 1e-5
    assert isinstance(out, torch.Tensor)
    assert out.shape == x.shape


def test_rms_norm_with_residual_passes_residual_first(torch_npu: TorchNpuDouble) -> None:
    layer = norm_layer(16)
    x, residual = torch.randn(4, 16, dtype=torch.float16), torch.randn(4, 16, dtype=torch.float16)
    before = (x.clone(), residual.clone())
    out, new_residual = rms_norm_npu(layer, x, residual)
    ((name, (x1, x2, _, epsilon), _),) = torch_npu.calls
    assert name == "npu_add_rms_norm"
    assert x1 is residual  # forward_npu: npu_add_rms_norm(residual, x, weight, eps)
    assert x2 is x
    assert epsilon == 1e-5
    torch.testing.assert_close(new_residual, (before[0].float() + before[1].float()).half())
    assert torch.equal(x, before[0])  # new tensors: the inputs are left as they were
    assert torch.equal(residual, before[1])
    assert out.data_ptr() != x.data_ptr()


def test_rms_norm_declines_a_foreign_weight_dtype(torch_npu: TorchNpuDouble) -> None:
    with pytest.raises(Unsupported, match="gamma dtype"):
        rms_norm_npu(norm_layer(16, torch.float32), torch.randn(2, 16, dtype=torch.float16))
    assert torch_npu.calls == []


def rope_inputs(
    dtype: torch.dtype = torch.bfloat16, interleaved: bool = False
) -> tuple[object, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    contract = STANDARD_OPS["rotary_embedding"]
    case = next(
        c
        for c in contract.cases
        if c.params["head_size"] == 64
        and c.params["q_heads"] == 4
        and c.params["interleaved"] is interleaved
    )
    generator = torch.Generator().manual_seed(3)
    inputs = contract.make_inputs(case, dtype, torch.device("cpu"), generator)
    return (inputs.obj, *inputs.args)  # type: ignore[return-value]


@pytest.mark.parametrize(("interleaved", "mode"), [(False, "half"), (True, "interleave")])
def test_rotary_is_npu_mrope_on_flattened_rotary_parts(
    torch_npu: TorchNpuDouble, interleaved: bool, mode: str
) -> None:
    obj, query, key, cos, sin, positions = rope_inputs(interleaved=interleaved)
    q_out, k_out = rotary_embedding_npu(obj, query, key, cos, sin, positions, interleaved, True)
    ((name, (kernel_positions, q2d, k2d, cache, head_size), kwargs),) = torch_npu.calls
    assert name == "npu_mrope"
    assert kernel_positions is positions
    assert q2d.shape == (query.shape[0], 4 * 32)
    assert k2d.shape == (key.shape[0], 2 * 32)
    assert cache is obj.cos_sin_cache  # the layer's cache, as forward_npu passes it
    assert head_size == 32  # the rotary part of each 64-wide head
    assert kwargs == {"mrope_section": [0, 0, 0], "rotary_mode": mode}
    assert q_out is query  # written back into the caller's views
    assert k_out is key


def test_rotary_declines_a_cache_in_another_dtype(torch_npu: TorchNpuDouble) -> None:
    obj, query, key, cos, sin, positions = rope_inputs()
    obj.cos_sin_cache = obj.cos_sin_cache.float()  # SGLANG_ROPE_CACHE_FP32
    before = query.clone()
    with pytest.raises(Unsupported, match="query dtype"):
        rotary_embedding_npu(obj, query, key, cos, sin, positions)
    assert torch_npu.calls == []
    assert torch.equal(query, before)
