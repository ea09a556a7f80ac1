"""The Ascend GDN adapter against the double of sgl_kernel_npu's gating operator (no NPU).

Every case and dtype of ``fused_gdn_gating`` runs through core's conformance check, with both
output layouts sgl_kernel_npu has had; then the call itself, the refusal, the probe order and
the double's constraints.
"""

from __future__ import annotations

import pytest
import torch
from sgl_kernel_npu_double import SglKernelNpuGatingDouble
from sglang_fl_ascend import plugin
from sglang_fl_ascend.backend import SGL_KERNEL_NPU_GATING, SglKernelNpuBackend
from sglang_fl_ascend.impl import linear_attention as gdn

from sglang_fl import Unsupported
from sglang_fl.ops import OpCase
from sglang_fl.testing.checks import PASSED, check_case
from sglang_fl.testing.doubles import constraint_tests, install_double
from sglang_fl.testing.vendor import VendorSuite

SUITE = VendorSuite("ascend", plugin.sglang_fl_register_ops)
CASES = [p for p in SUITE.contract_cases() if p.values[0] in gdn.ADAPTERS]


@pytest.fixture(params=[False, True], ids=["g [1, T, HV]", "g [T, HV] (#747)"])
def gating(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> SglKernelNpuGatingDouble:
    return install_double(
        monkeypatch, SglKernelNpuGatingDouble(flat_g=request.param), SGL_KERNEL_NPU_GATING
    )


def test_registers_the_gating_adapter_under_its_own_probe() -> None:
    impl = SUITE.implementations["fused_gdn_gating"]
    assert impl.fn is gdn.fused_gdn_gating
    assert impl.impl_id == "vendor.ascend"
    assert isinstance(getattr(impl.available, "__self__", None), SglKernelNpuBackend)
    assert set(gdn.NO_KERNEL).isdisjoint(gdn.ADAPTERS)
    # The ten GDN ops and Qwen3.5's two (its contiguous split, the attention output gate).
    assert len(set(gdn.NO_KERNEL) | set(gdn.ADAPTERS)) == 12


@pytest.mark.parametrize(("op", "case", "dtype"), CASES)
def test_contract_case(
    gating: SglKernelNpuGatingDouble, op: str, case: OpCase, dtype: torch.dtype
) -> None:
    outcome = check_case(SUITE.implementations[op], case, dtype)
    assert outcome.status == PASSED, outcome.message
    # An empty batch never reaches the operator (its grid is one program per row).
    assert gating.called == (["fused_gdn_gating_npu"] if case.params["tokens"] else [])


def test_strided_rows_are_packed_for_the_dense_kernel(gating: SglKernelNpuGatingDouble) -> None:
    a = torch.randn(5, 8)[:, ::2]
    b = torch.randn(5, 4)
    g, beta = gdn.fused_gdn_gating(None, torch.rand(4), a, b, torch.randn(4))
    (call,) = gating.calls
    assert call.args[1].is_contiguous()
    torch.testing.assert_close(call.args[1], a)
    assert g.shape == beta.shape == (1, 5, 4)
    assert g.dtype == beta.dtype == torch.float32


def test_refuses_a_shape_it_cannot_serve(gating: SglKernelNpuGatingDouble) -> None:
    with pytest.raises(Unsupported, match=r"\[T, HV\]"):
        gdn.fused_gdn_gating(None, torch.rand(4), torch.randn(2, 3, 4), torch.randn(2, 3, 4),
                             torch.randn(4))  # fmt: skip
    assert gating.calls == []


def test_without_torch_npu_the_reason_is_torch_npu_s() -> None:
    """The gating module is not even imported without an NPU: torch_npu's probe answers."""
    availability = SglKernelNpuBackend().is_available()
    assert not availability
    assert availability.reason.startswith("torch_npu import failed")
    assert SGL_KERNEL_NPU_GATING.module is None


D = SglKernelNpuGatingDouble
test_valid_calls_pass, test_rejects_what_the_operator_rejects, test_every_constraint_is_covered = (
    constraint_tests(
        SglKernelNpuGatingDouble,
        valid=[lambda sdk: sdk.fused_gdn_gating_npu(torch.rand(4), torch.randn(3, 4),
                                                    torch.randn(3, 4), torch.randn(4))],
        rejected={
            D.GATING_LAYOUT: lambda sdk: sdk.fused_gdn_gating_npu(
                torch.rand(4), torch.randn(3, 8)[:, ::2], torch.randn(3, 4), torch.randn(4)
            ),
            D.GATING_ROWS: lambda sdk: sdk.fused_gdn_gating_npu(
                torch.rand(4), torch.randn(0, 4), torch.randn(0, 4), torch.randn(4)
            ),
        },
    )
)  # fmt: skip
