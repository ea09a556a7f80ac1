"""The hardware conformance runner, on the CPU, with the reference functions as a fake vendor."""

from __future__ import annotations

import subprocess
import sys
import types
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from sglang_fl import Unsupported
from sglang_fl.dispatch.registry import OpRegistry
from sglang_fl.dispatch.types import Availability, BackendImplKind, OpImpl
from sglang_fl.ops import STANDARD_OPS
from sglang_fl.testing.hardware import (
    SGLANG_BASELINE_OPS,
    HardwareTarget,
    load_script,
    max_errors,
    render,
    run_cases,
    run_hardware_conformance,
)

# The kernels: a hardware script checks them in one process (collectives need several ranks).
KERNEL_OPS = {op: c for op, c in STANDARD_OPS.items() if c.collective is None}
REFERENCE_FNS = {op: contract.reference for op, contract in KERNEL_OPS.items()}


def registering(fns: dict[str, Callable[..., Any]]) -> Callable[[OpRegistry], None]:
    def register(registry: OpRegistry) -> None:
        registry.register_many(
            OpImpl(op, "vendor.fake", BackendImplKind.VENDOR, fn=fn, vendor="fake")
            for op, fn in fns.items()
        )

    return register


class Synchronize:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


def fake_target(fns: dict[str, Callable[..., Any]] = REFERENCE_FNS) -> HardwareTarget:
    return HardwareTarget(
        title="sglang-fl-fake",
        register=registering(fns),
        probe=lambda: Availability(True, "fake chip ready"),
        device="cpu",
        synchronize=Synchronize(),
        sglang_forward="forward_fake",
    )


def row_prefix(op: str, dtype: str, status: str) -> str:
    return f"{op:<17} {dtype:<9} {status:<7} "


@pytest.fixture(autouse=True)
def no_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang is not importable (the core test environment has none; the dev one might)."""
    monkeypatch.setitem(sys.modules, "sglang", None)


def test_a_passing_run_exits_0_and_prints_every_op_dtype_and_case(
    capsys: pytest.CaptureFixture[str],
) -> None:
    target = fake_target()
    assert run_hardware_conformance(["--repeat", "2"], target) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "sglang-fl-fake: fake chip ready"
    assert out[1].split() == ["op", "dtype", "status", "max_abs", "max_rel", "t/sglang", "case"]
    rows = out[2:-1]
    expected = [
        (op, str(dtype).removeprefix("torch."), case.name)
        for op, contract in KERNEL_OPS.items()
        for dtype in contract.dtypes
        for case in contract.cases
    ]
    assert len(rows) == len(expected)
    for line, (op, dtype, case) in zip(rows, expected, strict=True):
        assert line.startswith(row_prefix(op, dtype, "passed")), line
        assert line.endswith(f"n/a  {case}"), line  # no SGLang: no baseline to time against
    assert out[-1] == f"{len(expected)} passed, 0 failed, 0 skipped"
    assert target.synchronize.calls == 0  # type: ignore[attr-defined]  # nothing was timed


def test_the_reference_as_a_vendor_has_no_error() -> None:
    rows = run_cases(fake_target(), ["rms_norm"], [torch.bfloat16], repeat=0)
    assert {(r.status, r.max_abs, r.max_rel, r.time_ratio) for r in rows} == {
        ("passed", 0.0, 0.0, None)
    }


def test_a_wrong_implementation_exits_1_naming_op_case_and_errors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def off_by_five_percent(obj: Any, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:] * 1.05

    target = fake_target({**REFERENCE_FNS, "silu_and_mul": off_by_five_percent})
    assert run_hardware_conformance(["--dtype", "float16"], target) == 1
    out = capsys.readouterr().out
    first = STANDARD_OPS["silu_and_mul"].cases[0].name
    assert f"{row_prefix('silu_and_mul', 'float16', 'failed')}{'-':>9} {'-':>9}" in out
    assert f"op 'silu_and_mul', impl 'vendor.fake', case '{first}', dtype float16" in out
    assert "max abs error" in out
    assert "max rel error" in out
    assert row_prefix("rms_norm", "float16", "passed") in out
    # Every case fails but the empty batch, which has no value to get wrong.
    wrong = sum(case.params["tokens"] > 0 for case in STANDARD_OPS["silu_and_mul"].cases)
    assert f", {wrong} failed, 0 skipped" in out.splitlines()[-1]


def test_an_unavailable_backend_exits_2_with_the_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def never(registry: OpRegistry) -> None:
        raise AssertionError("an unavailable backend is not registered")

    target = replace(
        fake_target(), register=never, probe=lambda: Availability(False, "no fake chip visible")
    )
    assert run_hardware_conformance([], target) == 2
    captured = capsys.readouterr()
    assert captured.err == "sglang-fl-fake is unavailable here: no fake chip visible\n"
    assert captured.out == ""


def test_a_declined_case_is_skipped_and_does_not_fail(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def half_precision_only(obj: Any, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            raise Unsupported("float32 is not supported")
        return REFERENCE_FNS["silu_and_mul"](obj, x)

    target = fake_target({"silu_and_mul": half_precision_only})
    assert run_hardware_conformance(["--dtype", "float32", "--dtype", "float16"], target) == 0
    out = capsys.readouterr().out
    cases = len(STANDARD_OPS["silu_and_mul"].cases)
    assert out.count(row_prefix("silu_and_mul", "float32", "skipped")) == cases
    assert out.splitlines()[-1] == f"{cases} passed, 0 failed, {cases} skipped"


def test_options_narrow_the_run_and_an_op_the_vendor_lacks_fails(
    capsys: pytest.CaptureFixture[str],
) -> None:
    target = fake_target({"rms_norm": REFERENCE_FNS["rms_norm"]})
    assert run_cases(target, dtypes=[torch.float16], repeat=0)  # default: the vendor's ops
    assert {r.op for r in run_cases(target, dtypes=[torch.float16], repeat=0)} == {"rms_norm"}

    argv = ["--op", "silu_and_mul", "--dtype", "bfloat16"]
    assert run_hardware_conformance(argv, target) == 1
    out = capsys.readouterr().out
    assert "sglang-fl-fake registers no implementation of op 'silu_and_mul'" in out
    assert "rms_norm" not in out


def test_the_device_name_follows_the_probe_reason(capsys: pytest.CaptureFixture[str]) -> None:
    target = replace(fake_target(), device_name=lambda device: f"Fake X1 ({device})")
    assert run_hardware_conformance(["--op", "rms_norm", "--dtype", "float32"], target) == 0
    assert capsys.readouterr().out.startswith("sglang-fl-fake: fake chip ready; Fake X1 (cpu)\n")


def test_max_errors_over_all_outputs() -> None:
    want = (torch.tensor([1.0, -2.0]), torch.tensor([0.0, 4.0]))
    got = (torch.tensor([1.5, -2.0]), torch.tensor([0.1, 3.0]))
    assert max_errors(got, want) == pytest.approx((1.0, 0.5))
    assert max_errors((torch.tensor([0.5]),), (torch.tensor([0.0]),)) == (0.5, 0.0)
    assert max_errors((torch.empty(0, 4),), (torch.empty(0, 4),)) == (0.0, 0.0)  # empty batch


# -- the SGLang baseline, against stand-ins for SGLang's layers -------------------------------


class FakeSglang:
    """Stand-ins for SGLang's layer modules whose only forward is ``forward_fake``."""

    def __init__(self) -> None:
        self.built: list[tuple[str, tuple[Any, ...]]] = []
        self.calls: list[tuple[str, tuple[torch.Size, ...]]] = []
        fake = self

        def layer_class(op: str, name: str, weights: bool = False) -> type:
            """A module recording how it was built and the shapes of each call."""

            class Layer(torch.nn.Module):
                def __init__(self, *args: Any, **kwargs: Any) -> None:
                    super().__init__()
                    fake.built.append((op, args))
                    if weights:  # norms: the runner sets weight.data (and bias) to the case's
                        self.weight = torch.nn.Parameter(torch.ones(args[0]))
                        self.bias = torch.nn.Parameter(torch.zeros(args[0]))

                def forward_fake(self, *args: Any) -> object:
                    tensors = [a for a in args if isinstance(a, torch.Tensor)]
                    fake.calls.append((op, tuple(t.shape for t in tensors)))
                    if weights:
                        assert self.weight.dtype == kwargs_dtype(self, tensors[0])
                    return tensors[0]

            Layer.__name__ = Layer.__qualname__ = name
            return Layer

        def kwargs_dtype(layer: torch.nn.Module, x: torch.Tensor) -> torch.dtype:
            # RMS norms take the case's weight in x's dtype; LayerNorm in its compute dtype.
            return layer.weight.dtype if type(layer).__name__ == "LayerNorm" else x.dtype

        self.modules: dict[str, list[type]] = {
            "sglang.srt.layers.activation": [
                layer_class("silu_and_mul", "SiluAndMul"),
                layer_class("gelu_and_mul", "GeluAndMul"),
                layer_class("gelu_new", "NewGELU"),
                layer_class("gelu_quick", "QuickGELU"),
            ],
            "sglang.srt.layers.layernorm": [
                layer_class("rms_norm", "RMSNorm", weights=True),
                layer_class("gemma_rms_norm", "GemmaRMSNorm", weights=True),
                layer_class("layer_norm", "LayerNorm", weights=True),
            ],
            "sglang.srt.layers.rotary_embedding": [
                layer_class("rotary_embedding", "RotaryEmbedding"),
                layer_class("mrotary_embedding", "MRotaryEmbedding"),
            ],
            "sglang.kernels.ops.attention.clamp_position": [
                layer_class("clamp_position", "ClampPositionOp"),
            ],
        }

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        parents = {p for name in self.modules for p in _parents(name)}
        for name in sorted(parents):
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
        for name, classes in self.modules.items():
            stand_in = types.ModuleType(name)
            for cls in classes:
                setattr(stand_in, cls.__name__, cls)
            monkeypatch.setitem(sys.modules, name, stand_in)
            parent, _, leaf = name.rpartition(".")
            setattr(sys.modules[parent], leaf, stand_in)


def _parents(module: str) -> list[str]:
    """``a.b.c`` -> ``["a", "a.b"]``."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def test_each_case_is_timed_against_sglangs_own_method(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sglang = FakeSglang()
    sglang.install(monkeypatch)
    target = fake_target()
    unbaselined = [op for op in KERNEL_OPS if op not in SGLANG_BASELINE_OPS]
    others = run_cases(target, unbaselined, dtypes=[torch.float16], repeat=2)
    assert others
    assert all(r.status == "passed" and r.time_ratio is None for r in others)
    assert sglang.calls == []  # no SGLang layer to time them against: checked, not timed
    rows = run_cases(target, SGLANG_BASELINE_OPS, dtypes=[torch.float16], repeat=2)
    assert all(r.status == "passed" for r in rows)
    # An empty batch is checked but not timed: nothing to time, and SGLang may refuse it.
    timed = [r for r in rows if "tokens=0," not in r.case]
    assert [r for r in rows if r.time_ratio is not None] == timed
    assert all(r.time_ratio is not None and r.time_ratio > 0 for r in timed)
    # Per case: 2 timings (ours, SGLang's), each warmed up and synchronized before and after.
    assert target.synchronize.calls == 4 * len(timed)  # type: ignore[attr-defined]
    half_ops = {op for op, contract in KERNEL_OPS.items() if torch.float16 in contract.dtypes}
    assert {op for op, _ in sglang.calls} == half_ops & set(SGLANG_BASELINE_OPS)
    assert len(sglang.calls) == (3 + 2) * len(timed)  # 3 warm-up calls, 2 timed
    index_rows = run_cases(target, ["clamp_position"], repeat=1)  # its int32/int64 cases
    assert {r.dtype for r in index_rows} == {"int32", "int64"}
    assert all(r.status == "passed" for r in index_rows)

    cases = [c.params for c in STANDARD_OPS["rotary_embedding"].cases if c.params["tokens"]]
    ropes = [args for op, args in sglang.built if op == "rotary_embedding"]
    assert [rope[4] for rope in ropes] == [not p["interleaved"] for p in cases]  # is_neox_style
    assert [rope[:2] for rope in ropes] == [(p["head_size"], p["rotary_dim"]) for p in cases]
    shapes = [s for op, s in sglang.calls if op == "rotary_embedding"][:: 3 + 2]
    for (positions, q, k), p in zip(shapes, cases, strict=True):  # whole heads, flattened
        assert positions == (p["tokens"],)
        assert q == (p["tokens"], p["q_heads"] * p["head_size"])
        assert k == (p["tokens"], p["kv_heads"] * p["head_size"])

    assert run_hardware_conformance(["--op", "silu_and_mul", "--repeat", "1"], target) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"{len(STANDARD_OPS['silu_and_mul'].cases) * 3} passed")
    assert "; time vs SGLang forward_fake: median " in last


@pytest.mark.parametrize("argv", [["--no-baseline"], ["--repeat", "0"]])
def test_timing_can_be_skipped(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sglang = FakeSglang()
    sglang.install(monkeypatch)
    assert run_hardware_conformance(["--op", "silu_and_mul", *argv], fake_target()) == 0
    out = capsys.readouterr().out
    assert sglang.calls == []
    assert "median" not in out
    contract = STANDARD_OPS["silu_and_mul"]
    assert out.count("n/a  ") == len(contract.cases) * len(contract.dtypes)


def test_render_indents_a_failures_message() -> None:
    rows = run_cases(
        fake_target({"silu_and_mul": lambda obj, x: x}), dtypes=[torch.float32], repeat=0
    )
    lines = render(rows).splitlines()
    assert lines[1].startswith(row_prefix("silu_and_mul", "float32", "failed"))
    assert lines[2].startswith("    vendor ")
    assert "op 'silu_and_mul', impl 'vendor.fake', case 'tokens=" in lines[2]
    assert lines[3] == "      output has shape (1, 32), expected (1, 16)"  # indented too


def test_importing_the_runner_imports_no_chip_sdk_and_no_sglang() -> None:
    code = (
        "import sys, sglang_fl.testing.hardware; "
        "print(sorted(m for m in ('sglang', 'torch_npu', 'sgl_kernel') if m in sys.modules))"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert found.strip() == "[]"


def test_load_script_imports_a_vendor_script_from_its_file(tmp_path: Path) -> None:
    script = tmp_path / "acme" / "scripts" / "conformance.py"
    script.parent.mkdir(parents=True)
    script.write_text("TITLE = 'sglang-fl-acme'\n")
    first, second = load_script(script), load_script(str(script))
    assert (first.TITLE, first.__name__) == ("sglang-fl-acme", "acme_conformance")
    assert first is not second  # a fresh module each time: tests may patch it freely
    with pytest.raises(ImportError, match="cannot import the conformance script"):
        load_script(tmp_path / "acme" / "scripts" / "conformance.txt")


def test_a_collective_is_reported_as_left_to_the_multi_process_kit() -> None:
    """A registered collective gets one explicit skipped row saying where it is checked."""
    target = fake_target({"all_reduce": STANDARD_OPS["all_reduce"].reference})
    rows = run_cases(target, repeat=0)
    assert [(r.op, r.status) for r in rows] == [("all_reduce", "skipped")]
    assert "run_collective_checks" in rows[0].message
