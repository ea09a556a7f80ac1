"""The conformance checks: what passes, what fails (and how it says so), what is skipped."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from sglang_fl import UnknownOpError, Unsupported
from sglang_fl.dispatch.types import BackendImplKind, OpImpl, Provenance
from sglang_fl.ops import STANDARD_OPS, Tolerance, get_contract
from sglang_fl.testing.checks import (
    FAILED,
    PASSED,
    SKIPPED,
    check_case,
    check_signature,
    compare,
    contract_grid,
    dtype_name,
    parse_selector,
    registered_by,
)

PROVENANCE = Provenance(plugin="acme", distribution="sglang-fl-acme", version="1.2.3")


def vendor_impl(op: str, fn: Any) -> OpImpl:
    impl = OpImpl(op, "vendor.acme", BackendImplKind.VENDOR, fn=fn, vendor="acme")
    return impl.with_provenance(PROVENANCE)


def case_named(op: str, *fragments: str):
    """The first case of ``op`` whose name contains every fragment."""
    return next(c for c in get_contract(op).cases if all(f in c.name.split(",") for f in fragments))


KERNELS = [op for op, contract in STANDARD_OPS.items() if contract.collective is None]


# The collectives' references are checked on 2 and 4 ranks in test_collectives.py.
@pytest.mark.parametrize("op", KERNELS)
def test_reference_passes_every_case_and_dtype(op: str) -> None:
    contract = get_contract(op)
    impl = vendor_impl(op, contract.reference)
    outcomes = [
        check_case(impl, case, dtype) for dtype in contract.dtypes for case in contract.cases
    ]
    assert len(outcomes) == len(contract.cases) * len(contract.dtypes)
    assert [o for o in outcomes if o.status != PASSED] == []


def test_wrong_values_name_vendor_op_case_dtype_and_errors() -> None:
    def scaled(obj: Any, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:] * 1.05

    case = case_named("silu_and_mul", "tokens=7", "d=128", "strided")
    outcome = check_case(vendor_impl("silu_and_mul", scaled), case, torch.float16)
    assert outcome.status == FAILED
    message = outcome.message
    assert message.startswith(
        "vendor 'acme' (sglang-fl-acme 1.2.3), op 'silu_and_mul', impl 'vendor.acme', "
        "case 'tokens=7,d=128,strided', dtype float16, device cpu:"
    )
    assert "output: max abs error" in message
    assert "max rel error 0.05" in message  # 5% off everywhere
    assert "atol=0.001, rtol=0.001" in message


def test_within_tolerance_passes() -> None:
    def nudged(obj: Any, x: torch.Tensor) -> torch.Tensor:
        out = STANDARD_OPS["silu_and_mul"].reference(obj, x.float())
        return (out * (1 + 1e-4)).to(x.dtype)

    case = case_named("silu_and_mul", "tokens=33", "d=352")
    assert check_case(vendor_impl("silu_and_mul", nudged), case, torch.bfloat16).status == PASSED


def test_wrong_dtype_and_shape_are_reported() -> None:
    def float32_out(obj: Any, x: torch.Tensor) -> torch.Tensor:
        return STANDARD_OPS["silu_and_mul"].reference(obj, x).float()

    def whole(obj: Any, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)

    case = case_named("silu_and_mul", "tokens=7", "d=16")
    wrong_dtype = check_case(vendor_impl("silu_and_mul", float32_out), case, torch.float16)
    assert "output has dtype float32, expected float16" in wrong_dtype.message
    wrong_shape = check_case(vendor_impl("silu_and_mul", whole), case, torch.float32)
    assert "output has shape (7, 32), expected (7, 16)" in wrong_shape.message


def test_rms_norm_with_residual_must_return_both_tensors() -> None:
    def only_out(obj: Any, x: torch.Tensor, residual: torch.Tensor | None = None):
        result = STANDARD_OPS["rms_norm"].reference(obj, x, residual)
        return result[0] if residual is not None else result

    case = case_named("rms_norm", "tokens=7", "hidden=128", "residual")
    outcome = check_case(vendor_impl("rms_norm", only_out), case, torch.float32)
    assert outcome.status == FAILED
    assert "returned a Tensor, expected a tuple of 2 tensors" in outcome.message


def test_preserved_input_written_fails() -> None:
    def clobbers_x(obj: Any, x: torch.Tensor, residual: torch.Tensor | None = None):
        out = STANDARD_OPS["rms_norm"].reference(obj, x, residual)
        x.zero_()
        return out

    case = case_named("rms_norm", "tokens=7", "hidden=16")
    outcome = check_case(vendor_impl("rms_norm", clobbers_x), case, torch.float32)
    assert outcome.status == FAILED
    assert "input 'x' (112 of 112 elements) was modified; it must stay untouched" in outcome.message


def test_layer_weights_must_stay_untouched() -> None:
    def scales_weight(obj: Any, x: torch.Tensor, residual: torch.Tensor | None = None):
        out = STANDARD_OPS["rms_norm"].reference(obj, x, residual)
        obj.weight.mul_(2)
        return out

    case = case_named("rms_norm", "tokens=1", "hidden=16")
    outcome = check_case(vendor_impl("rms_norm", scales_weight), case, torch.float32)
    assert "input 'obj.weight' (16 of 16 elements) was modified" in outcome.message


def rotary_copy(
    obj: Any, query, key, cos, sin, position_ids, rotary_interleaved=False, inplace=True
):
    """Right values, but always in new tensors: breaks ``inplace=True``."""
    return STANDARD_OPS["rotary_embedding"].reference(
        obj, query.clone(), key.clone(), cos, sin, position_ids, rotary_interleaved, False
    )


def test_inplace_outputs_must_share_storage_and_fill_the_input() -> None:
    case = case_named("rotary_embedding", "tokens=5", "rotary_dim=32/64", "neox", "inplace")
    outcome = check_case(vendor_impl("rotary_embedding", rotary_copy), case, torch.float16)
    assert outcome.status == FAILED
    message = outcome.message
    assert "output[0] must be written in place into input 'query'" in message
    assert "output[1] must be written in place into input 'key'" in message
    assert "input 'query' after the call: max abs error" in message


def test_out_of_place_rotary_leaves_query_and_key() -> None:
    def always_inplace(
        obj, query, key, cos, sin, position_ids, rotary_interleaved=False, inplace=True
    ):
        return STANDARD_OPS["rotary_embedding"].reference(
            obj, query, key, cos, sin, position_ids, rotary_interleaved, True
        )

    case = case_named("rotary_embedding", "tokens=5", "interleaved", "out-of-place")
    outcome = check_case(vendor_impl("rotary_embedding", always_inplace), case, torch.float32)
    assert outcome.status == FAILED
    assert "input 'query'" in outcome.message
    assert "input 'key'" in outcome.message
    assert "must stay untouched" in outcome.message
    # The same implementation is right for the in-place cases.
    inplace = case_named("rotary_embedding", "tokens=5", "interleaved", "inplace")
    assert (
        check_case(vendor_impl("rotary_embedding", always_inplace), inplace, torch.float32).status
        == PASSED
    )


def test_unsupported_is_a_skip_with_the_reason() -> None:
    def fp32_only(obj: Any, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            raise Unsupported(f"acme: no {x.dtype} kernel")
        return STANDARD_OPS["silu_and_mul"].reference(obj, x)

    impl = vendor_impl("silu_and_mul", fp32_only)
    case = case_named("silu_and_mul", "tokens=1", "d=16")
    skipped = check_case(impl, case, torch.bfloat16)
    assert skipped.status == SKIPPED
    assert "case 'tokens=1,d=16', dtype bfloat16" in skipped.message
    assert "declined with Unsupported: acme: no torch.bfloat16 kernel" in skipped.message
    assert check_case(impl, case, torch.float32).status == PASSED


def test_unsupported_after_writing_fails() -> None:
    def late_decline(
        obj, query, key, cos, sin, position_ids, rotary_interleaved=False, inplace=True
    ):
        query.zero_()
        raise Unsupported("changed my mind")

    case = case_named("rotary_embedding", "tokens=1", "inplace")
    outcome = check_case(vendor_impl("rotary_embedding", late_decline), case, torch.float32)
    assert outcome.status == FAILED
    assert "raised Unsupported (changed my mind) after writing to 'query'" in outcome.message


def test_other_exceptions_fail_with_the_traceback() -> None:
    def broken(obj: Any, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("kernel launch failed")

    case = case_named("silu_and_mul", "tokens=1", "d=16")
    outcome = check_case(vendor_impl("silu_and_mul", broken), case, torch.float32)
    assert outcome.status == FAILED
    assert "raised RuntimeError: kernel launch failed" in outcome.message
    assert "Traceback (most recent call last)" in outcome.message


def test_signature_check() -> None:
    def good(obj, x, residual=None):
        return x

    def renamed(obj, x, res=None):
        return x

    assert check_signature(vendor_impl("rms_norm", good)).status == PASSED
    outcome = check_signature(vendor_impl("rms_norm", renamed))
    assert outcome.status == FAILED
    assert "optional parameters are not named as in the contract" in outcome.message
    assert outcome.message.endswith("the contract is rms_norm(obj, x, residual=None)")


def test_compare_reports_nan_as_out_of_tolerance() -> None:
    want = torch.ones(4)
    got = torch.tensor([1.0, float("nan"), 1.0, 1.0])
    message = compare(got, want, Tolerance(1e-5, 1e-5), "output")
    assert message is not None
    assert "1 of 4 elements out of tolerance" in message
    assert "max abs error inf" in message
    assert compare(want.clone(), want, Tolerance(0, 0), "output") is None


def test_compare_relative_error_ignores_zero_references() -> None:
    want = torch.tensor([0.0, 2.0])
    got = torch.tensor([0.5, 3.0])
    message = compare(got, want, Tolerance(1e-3, 1e-3), "output")
    assert message is not None
    assert "max abs error 1, max rel error 0.5" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, (None, None)),
        ("", (None, None)),
        ("acme", ("acme", None)),
        ("acme:rms_norm", ("acme", "rms_norm")),
        (":rms_norm", (None, "rms_norm")),
    ],
)
def test_parse_selector(text: str | None, expected: tuple[str | None, str | None]) -> None:
    assert parse_selector(text) == expected


def test_parse_selector_unknown_op_suggests() -> None:
    with pytest.raises(UnknownOpError, match="did you mean 'rms_norm'"):
        parse_selector("acme:rms_nrom")


def test_contract_grid_spans_every_case_and_dtype_with_kit_ids():
    contract = STANDARD_OPS["rms_norm"]
    grid = list(contract_grid("rms_norm"))
    assert len(grid) == len(contract.cases) * len(contract.dtypes)
    assert {(case.name, dtype) for case, dtype, _ in grid} == {
        (case.name, dtype) for case in contract.cases for dtype in contract.dtypes
    }
    case, dtype, case_id = grid[0]
    assert case_id == f"{dtype_name(dtype)}/{case.name}"


def test_registered_by_holds_only_that_registration():
    def register(registry):
        registry.register(
            OpImpl("silu_and_mul", "vendor.solo", BackendImplKind.VENDOR, lambda obj, x: x, "solo")
        )

    registry = registered_by(register)
    assert [i.impl_id for i in registry.implementations("silu_and_mul")] == ["vendor.solo"]
    assert registry.implementations("rms_norm") == ()


def test_a_collective_is_not_checked_in_one_process() -> None:
    contract = get_contract("all_reduce")
    impl = vendor_impl("all_reduce", contract.reference)
    outcome = check_case(impl, contract.cases[0], torch.float32)
    assert outcome.status == FAILED
    assert "is a collective" in outcome.message
    assert "check_collective" in outcome.message
