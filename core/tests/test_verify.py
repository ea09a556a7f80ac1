"""Verify mode: the wrapper, its records and warning, the settings, and ``sglang-fl verify-report``.

The implementations under test are plain functions with the op's standard signature, run on
the CPU: the wrapper is engine-agnostic, so no SGLang is needed here (tests/sglang runs it in a
live engine).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from sglang_fl import ConfigError, cli
from sglang_fl.config import DEFAULT_VERIFY_CALLS, Settings
from sglang_fl.dispatch.types import BackendImplKind, OpImpl, Provenance
from sglang_fl.dispatch_report import DispatchReport, ReportEvent
from sglang_fl.ops import get_contract
from sglang_fl.ops.contract import layer
from sglang_fl.verify import Verifier, VerifyVerdict
from sglang_fl.verify_report import VerifyLogError, read_verify_records

RMS_NORM = get_contract("rms_norm")
ROTARY = get_contract("rotary_embedding")
LABEL = "models.Llama.RMSNorm"


def bf16_accumulating_rms_norm(obj: Any, x: torch.Tensor, residual: Any = None) -> Any:
    """Subtly wrong: the variance is accumulated in bfloat16, not float32."""
    if residual is not None:
        x = x + residual
    variance = x.to(torch.bfloat16).pow(2).mean(dim=-1, keepdim=True).to(x.dtype)
    out = x * torch.rsqrt(variance + obj.variance_epsilon) * obj.weight
    return out if residual is None else (out, x)


def impl(fn: Any, op: str = "rms_norm", impl_id: str = "vendor.acme") -> OpImpl:
    return OpImpl(
        op_name=op, impl_id=impl_id, kind=BackendImplKind.VENDOR, fn=fn, vendor="acme"
    ).with_provenance(Provenance("acme", "sglang-fl-acme", "1.2.3"))


def norm_layer(hidden: int = 64) -> Any:
    return layer(weight=torch.ones(hidden) + 0.1, variance_epsilon=1e-6)


def sample(tokens: int = 5, hidden: int = 64, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(0)).to(dtype)


class Sink(list[dict[str, Any]]):
    def __call__(self, record: dict[str, Any]) -> None:
        self.append(dict(record))


# -- the wrapper -----------------------------------------------------------------------------------


def test_off_returns_the_implementation_itself() -> None:
    fn = RMS_NORM.reference
    assert Verifier(0, None, Sink()).wrap(fn, impl(fn), LABEL) is fn
    # An op that SGLANG_FL_VERIFY_OPS does not name is left alone as well.
    assert Verifier(4, ("silu_and_mul",), Sink()).wrap(fn, impl(fn), LABEL) is fn


def test_a_wrong_norm_is_reported_with_errors_and_tolerance(caplog) -> None:
    sink = Sink()
    verified = Verifier(2, None, sink).wrap(bf16_accumulating_rms_norm, impl(None), LABEL)
    x = sample()
    with caplog.at_level(logging.WARNING, logger="sglang_fl.verify"):
        out = verified(norm_layer(), x)
        verified(norm_layer(), x)
    # The layer gets the implementation's own (wrong) result: verify observes, never corrects.
    assert torch.equal(out, bf16_accumulating_rms_norm(norm_layer(), x))
    assert len(sink) == 2
    record = sink[0]
    assert record["verdict"] is VerifyVerdict.FAIL
    assert (record["op"], record["layer"], record["instance"], record["call"]) == (
        "rms_norm",
        LABEL,
        0,
        1,
    )
    assert (record["impl_id"], record["distribution"], record["version"]) == (
        "vendor.acme",
        "sglang-fl-acme",
        "1.2.3",
    )
    assert (record["dtype"], record["shape"]) == ("float32", [5, 64])
    assert (record["atol"], record["rtol"]) == (1e-5, 1e-5)
    want = RMS_NORM.reference(norm_layer(), x)
    assert record["max_abs_error"] == pytest.approx((out - want).abs().max().item())
    assert record["max_abs_error"] > 1e-4  # well beyond float32's tolerance
    assert record["worst"] == "output"
    assert "out of tolerance" in record["problem"]
    # One warning per op, naming the op, the implementation and its distribution.
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "rms_norm" in warnings[0]
    assert "vendor.acme" in warnings[0]
    assert "sglang-fl-acme 1.2.3" in warnings[0]


def test_the_reference_itself_passes_with_zero_error() -> None:
    sink = Sink()
    verified = Verifier(1, None, sink).wrap(RMS_NORM.reference, impl(None), LABEL)
    residual = sample(hidden=64) * 0.5
    verified(norm_layer(), sample(), residual)
    (record,) = sink
    assert record["verdict"] is VerifyVerdict.PASS
    assert (record["max_abs_error"], record["max_rel_error"], record["problem"]) == (0, 0, None)


def test_budget_is_per_layer_class_across_instances_then_the_call_goes_straight_through() -> None:
    sink = Sink()
    calls: list[int] = []

    def counting(obj: Any, x: torch.Tensor, residual: Any = None) -> Any:
        calls.append(1)
        return RMS_NORM.reference(obj, x, residual)

    verifier = Verifier(3, None, sink)
    first, second = (verifier.wrap(counting, impl(counting), LABEL) for _ in range(2))
    other = verifier.wrap(counting, impl(counting), "models.Llama.OtherNorm")
    for _ in range(2):
        first(norm_layer(), sample())
        second(norm_layer(), sample())
    other(norm_layer(), sample())
    assert [(r["layer"], r["instance"], r["call"]) for r in sink] == [
        (LABEL, 0, 1),
        (LABEL, 1, 2),
        (LABEL, 0, 3),
        ("models.Llama.OtherNorm", 0, 1),
    ]
    assert len(calls) == 5  # the implementation runs once per call, checked or not


def test_calls_traced_by_torch_compile_are_not_checked_and_spend_no_budget() -> None:
    sink = Sink()
    verified = Verifier(1, None, sink).wrap(bf16_accumulating_rms_norm, impl(None), LABEL)
    obj, x = norm_layer(), sample()
    compiled = torch.compile(lambda t: verified(obj, t), backend="eager", fullgraph=True)
    assert torch.equal(compiled(x), bf16_accumulating_rms_norm(obj, x))
    assert sink == []
    verified(obj, x)  # the first eager call is the one checked
    assert [r["verdict"] for r in sink] == [VerifyVerdict.FAIL]


def test_in_place_results_are_compared_even_when_the_outputs_are_right() -> None:
    """A rotary kernel that returns the right tensors but leaves garbage in ``query``."""

    def scribbling(obj, query, key, cos, sin, position_ids, rotary_interleaved=False, inplace=True):
        want = ROTARY.reference(
            obj, query.clone(), key.clone(), cos, sin, position_ids, rotary_interleaved, False
        )
        query.mul_(2.0)
        key.copy_(want[1])
        return want

    inputs = ROTARY.make_inputs(ROTARY.cases[0], torch.float32, torch.device("cpu"), _gen())
    sink = Sink()
    verified = Verifier(1, None, sink).wrap(scribbling, impl(None, "rotary_embedding"), LABEL)
    verified(inputs.obj, *inputs.args, **inputs.kwargs)
    (record,) = sink
    assert record["verdict"] is VerifyVerdict.FAIL
    assert record["worst"] == "input query"
    assert "input query" in record["problem"]
    assert "input key" not in record["problem"]


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(1)


def test_uncheckable_dtype_and_wrong_shape_are_reported_not_raised(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="sglang_fl.verify")
    sink = Sink()
    verifier = Verifier(2, None, sink)
    # float64 is not one of the contract's dtypes: the reference cannot judge it.
    float64 = verifier.wrap(RMS_NORM.reference, impl(None), "B")
    float64(
        layer(weight=torch.ones(64, dtype=torch.float64), variance_epsilon=1e-6),
        sample(dtype=torch.float64),
    )
    wrong_shape = verifier.wrap(lambda obj, x, residual=None: x[:, :3], impl(None), "A")
    for _ in range(2):
        wrong_shape(norm_layer(), sample())
    dtype_record, shape_record, _ = sink
    assert dtype_record["verdict"] is VerifyVerdict.UNCHECKED
    assert "no tolerance for dtype torch.float64" in dtype_record["problem"]
    assert shape_record["verdict"] is VerifyVerdict.FAIL
    assert shape_record["problem"] == "output has shape (5, 3), expected (5, 64)"
    # One warning each: the unchecked call does not hide the op's first violation.
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "op rms_norm" in messages[0]
    assert "could not be checked" in messages[0]
    assert "op rms_norm" in messages[1]
    assert "violates the contract's tolerance" in messages[1]


def test_an_exception_of_the_implementation_propagates_without_a_record() -> None:
    def broken(obj: Any, x: torch.Tensor, residual: Any = None) -> Any:
        raise RuntimeError("kernel launch failed")

    sink = Sink()
    verified = Verifier(1, None, sink).wrap(broken, impl(broken), LABEL)
    with pytest.raises(RuntimeError, match="kernel launch failed"):
        verified(norm_layer(), sample())
    assert sink == []


# -- settings --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "calls"),
    [("", 0), ("0", 0), ("off", 0), ("1", 1), ("40", 40), ("on", DEFAULT_VERIFY_CALLS)],
)
def test_verify_variable(raw: str, calls: int) -> None:
    assert Settings.from_environment({"SGLANG_FL_VERIFY": raw}).verify == calls


@pytest.mark.parametrize("raw", ["-1", "maybe", "1.5"])
def test_verify_variable_errors_name_what_is_allowed(raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_environment({"SGLANG_FL_VERIFY": raw})
    message = str(info.value)
    assert f"SGLANG_FL_VERIFY={raw!r}" in message
    assert "calls to check per layer class" in message


def test_verify_in_the_config_file_and_the_op_filter(tmp_path: Path) -> None:
    config = tmp_path / "fl.toml"
    config.write_text('verify = true\nverify_ops = ["rms_norm", "silu_and_mul"]\n')
    settings = Settings.from_environment({"SGLANG_FL_CONFIG": str(config)})
    assert (settings.verify, settings.verify_ops) == (
        DEFAULT_VERIFY_CALLS,
        ("rms_norm", "silu_and_mul"),
    )
    config.write_text("verify = 3\n")
    assert Settings.from_environment({"SGLANG_FL_CONFIG": str(config)}).verify == 3
    with pytest.raises(ConfigError, match=r"did you mean 'rms_norm'\?"):
        Settings.from_environment({"SGLANG_FL_VERIFY_OPS": "rms_nrom"})


# -- the report ----------------------------------------------------------------------------------


def verified_log(tmp_path: Path, *impls: tuple[Any, str]) -> Path:
    """A dispatch log written by the real report: ``impls`` each checked on two calls."""
    log = tmp_path / "dispatch.jsonl"
    report = DispatchReport(log)
    report.emit(ReportEvent.PLUGIN, plugins=[])  # other events are skipped by the summary
    verifier = Verifier(2, None, lambda record: report.emit(ReportEvent.VERIFY, **record))
    for fn, impl_id in impls:
        verified = verifier.wrap(fn, impl(fn, impl_id=impl_id), f"Norm[{impl_id}]")
        for _ in range(2):
            verified(norm_layer(), sample())
    return log


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_report_names_the_offending_implementation_and_exits_1(tmp_path, capsys) -> None:
    log = verified_log(
        tmp_path, (bf16_accumulating_rms_norm, "vendor.acme"), (RMS_NORM.reference, "ref")
    )
    code, out, _ = run_cli(capsys, "verify-report", str(log), "--json")
    assert code == 1
    payload = json.loads(out)
    assert payload["violations"] == 1
    bad, good = payload["rows"]
    assert (bad["op"], bad["impl_id"], bad["verdict"]) == ("rms_norm", "vendor.acme", "fail")
    assert (bad["calls_checked"], bad["calls_failed"]) == (2, 2)
    assert bad["distribution"] == "sglang-fl-acme"
    assert bad["first_offending_layer"].startswith("Norm[vendor.acme] #0 (pid ")
    assert bad["max_abs_error"] > 1e-4
    assert bad["atol"] == 1e-5
    assert (good["impl_id"], good["verdict"], good["max_abs_error"]) == ("ref", "pass", 0)
    code, text, _ = run_cli(capsys, "verify-report", str(log))
    assert code == 1
    assert "vendor.acme" in text
    assert "1 implementation(s) out of tolerance" in text


def test_report_of_a_clean_run_exits_0(tmp_path, capsys) -> None:
    log = verified_log(tmp_path, (RMS_NORM.reference, "ref"))
    code, text, _ = run_cli(capsys, "verify-report", str(log))
    assert code == 0
    assert "every checked call within tolerance" in text


def test_report_refuses_logs_it_cannot_read(tmp_path, capsys) -> None:
    missing = tmp_path / "missing.jsonl"
    code, _, err = run_cli(capsys, "verify-report", str(missing))
    assert (code, err.strip()) == (2, f"sglang-fl: error: dispatch log {str(missing)!r} not found")
    unverified = tmp_path / "plain.jsonl"
    DispatchReport(unverified).emit(ReportEvent.PLUGIN, plugins=[])
    with pytest.raises(VerifyLogError, match="holds no verify records; run with SGLANG_FL_VERIFY"):
        read_verify_records(unverified)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"event": "plugin"}\nnot json\n')
    with pytest.raises(VerifyLogError, match=r"broken.jsonl:2: not a JSON record"):
        read_verify_records(broken)
