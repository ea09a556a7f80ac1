"""The conformance checks themselves, free of pytest so they can be unit-tested and reused.

:func:`plan` turns a selection (vendor, op, device) into named :class:`Check` objects, one per
pytest item: a plugin check, a signature check per implementation, then either one skipped
"unavailable" check or one check per contract case and dtype. Each check's :meth:`Check.run`
returns an :class:`Outcome`; a failure's message names vendor, op, case, dtype and the error.
"""

from __future__ import annotations

import dataclasses
import traceback
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .._strenum import StrEnum
from ..comparison import compare
from ..config import Settings
from ..dispatch.availability import AvailabilityCache
from ..dispatch.prepare import prepared_weights, with_weights
from ..dispatch.registry import OpRegistry
from ..dispatch.types import Availability, OpImpl
from ..errors import Unsupported
from ..loader import PluginRecord, PluginStatus
from ..ops import STANDARD_OPS, OpCase, OpContract, OpInputs, Tolerance, get_contract
from ..runtime import Runtime, get_runtime
from .plans import host_read, plan_problems, planner_of

__all__ = [
    "FAILED",
    "PASSED",
    "SKIPPED",
    "Check",
    "CheckStatus",
    "Outcome",
    "check_case",
    "check_collective",
    "check_plan",
    "check_plugin",
    "check_signature",
    "compare",
    "parse_selector",
    "plan",
]


class CheckStatus(StrEnum):
    """The result of one check, as a pytest item reports it."""

    PASSED = "passed"
    SKIPPED = "skipped"  # e.g. unavailable here, or declined with Unsupported
    FAILED = "failed"


# Short names for the statuses, used by check functions and vendors' own tests.
PASSED, SKIPPED, FAILED = CheckStatus.PASSED, CheckStatus.SKIPPED, CheckStatus.FAILED

# The kit probes availability once per process, like the runtime (which keeps its own cache),
# waiting for a probe as long as the runtime does (SGLANG_FL_PLUGIN_TIMEOUT): made on first use.
_AVAILABILITY: AvailabilityCache | None = None


@dataclass(frozen=True)
class Outcome:
    """What one check found: ``passed``, ``skipped`` (with the reason) or ``failed`` (why)."""

    status: CheckStatus
    message: str = ""


@dataclass(frozen=True)
class Check:
    """One pytest item: an id (``acme/rms_norm/float16/tokens=7,...``) and the work to do."""

    id: str
    run: Callable[[], Outcome]


def parse_selector(text: str | None) -> tuple[str | None, str | None]:
    """``"acme:rms_norm"`` -> ``("acme", "rms_norm")``; empty parts mean "all"."""
    if not text:
        return None, None
    vendor, _, op_text = text.partition(":")
    op = op_text.strip() or None
    if op is not None:
        get_contract(op)  # an unknown op raises UnknownOpError naming the close match
    return vendor.strip() or None, op


def describe(impl: OpImpl) -> str:
    """``vendor 'acme' (sglang-fl-acme 0.1.0), op 'rms_norm', impl 'vendor.acme'``."""
    provenance = impl.provenance
    origin = f" ({provenance.distribution} {provenance.version})" if provenance else ""
    return f"vendor {vendor_of(impl)!r}{origin}, op {impl.op_name!r}, impl {impl.impl_id!r}"


def vendor_of(impl: OpImpl) -> str:
    """The plugin (entry-point) name that registered ``impl``; the vendor id as a fallback."""
    if impl.provenance is not None:
        return impl.provenance.plugin
    return impl.vendor or impl.impl_id


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# -- single checks ------------------------------------------------------------------------------


def check_plugin(record: PluginRecord, registered: int) -> Outcome:
    """The vendor's entry point loaded and registered at least one implementation."""
    who = f"plugin {record.name!r} ({record.distribution} {record.version})"
    if record.status is PluginStatus.DISABLED:
        return Outcome(SKIPPED, f"{who} is disabled: {record.error}")
    if record.status is not PluginStatus.LOADED:
        return Outcome(FAILED, f"{who} failed to load: {record.error}")
    if registered == 0:
        return Outcome(FAILED, f"{who} loaded but registered no implementation")
    return Outcome(PASSED)


def check_signature(impl: OpImpl) -> Outcome:
    """``impl.fn`` accepts the op's standard arguments, positionally and by keyword."""
    contract = get_contract(impl.op_name)
    problem = contract.signature_problem(impl.fn)
    if problem is None:
        return Outcome(PASSED)
    return Outcome(
        FAILED, f"{describe(impl)}: {problem}; the contract is {contract.signature_text()}"
    )


def check_case(
    impl: OpImpl,
    case: OpCase,
    dtype: torch.dtype,
    device: str = "cpu",
    *,
    reference_device: str | None = None,
) -> Outcome:
    """Run ``impl`` on one case and dtype; compare with the reference and the in-place rules.

    The implementation and the reference each get their own copy of the inputs (made twice from
    the same seed, so strided views stay strided). Raising :class:`~sglang_fl.Unsupported` is a
    skip, unless the implementation wrote to its inputs first. ``reference_device`` computes the
    reference there instead (on the same values: inputs are drawn on the host, then moved) and
    moves its result to ``device`` for the comparison: a chip's own aten ops may not compute the
    reference's math exactly (torch_npu documents ``F.gelu`` ignoring ``approximate``).
    """
    contract = get_contract(impl.op_name)
    where = f"{describe(impl)}, case {case.name!r}, dtype {dtype_name(dtype)}, device {device}"
    if contract.collective is not None:
        return Outcome(
            FAILED,
            f"{where}: op {impl.op_name!r} is a collective; its cases run on several ranks at "
            "once: use check_collective (sglang_fl.testing.collectives)",
        )
    inputs = _make_inputs(contract, case, dtype, device)
    expected_inputs = _make_inputs(contract, case, dtype, reference_device or device)
    if contract.plan_stage is not None:
        try:
            inputs = _planned_by(impl, contract, inputs)
        except Exception as exc:
            return Outcome(
                FAILED,
                f"{where}: its planner raised {type(exc).__name__}: {exc}\n"
                f"{traceback.format_exc()}",
            )
    before = _snapshot(contract, inputs)
    try:
        args, kwargs = call_arguments(contract, impl, inputs)
        got = impl.fn(inputs.obj, *args, **kwargs)
    except Unsupported as exc:
        written = _changed(contract, inputs, before, _all_names(contract, inputs))
        if written:
            return Outcome(
                FAILED,
                f"{where}: raised Unsupported ({exc}) after writing to {', '.join(written)}; "
                "an implementation may only decline a call before it writes anything",
            )
        return Outcome(SKIPPED, f"{where}: declined with Unsupported: {exc}")
    except Exception as exc:
        return Outcome(
            FAILED,
            f"{where}: raised {type(exc).__name__}: {exc}\n{traceback.format_exc()}",
        )
    want = contract.reference(expected_inputs.obj, *expected_inputs.args, **expected_inputs.kwargs)
    if reference_device is not None:
        want = _moved(want, device)
    problems = list(
        _output_problems(
            contract.canonical_output(got),
            contract.canonical_output(want),
            contract.tolerance(dtype),
        )
    )
    problems += _in_place_problems(contract, inputs, got, want, contract.tolerance(dtype))
    untouched = _changed(contract, inputs, before, _preserved_names(inputs))
    problems += [f"input {name} was modified; it must stay untouched" for name in untouched]
    if contract.plan_stage is not None and not problems:
        read = host_read(impl.fn, inputs.obj, inputs.args)
        if read is not None:
            problems.append(
                f"the per-layer call reads a device value on the host: {read}; it must take "
                "what the host needs from the plan (a pipeline stall per layer eagerly, an "
                "error under graph capture)"
            )
    if problems:
        return Outcome(FAILED, f"{where}:\n  " + "\n  ".join(problems))
    return Outcome(PASSED)


def call_arguments(
    contract: OpContract, impl: OpImpl, inputs: OpInputs
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments (after ``obj``) ``impl`` is called with on ``inputs``: as made, with the
    contract's weights replaced by what ``impl``'s ``prepare`` returns for them, if it has one."""
    if not contract.weights or impl.prepare is None:
        return inputs.args, inputs.kwargs
    weights = tuple(inputs.argument(name, contract.signature) for name in contract.weights)
    prepared = prepared_weights(contract, impl, inputs.obj, weights)
    return with_weights(contract, inputs.args, inputs.kwargs, prepared)


def check_plan(impl: OpImpl, case: OpCase, device: str = "cpu") -> Outcome:
    """A planned op's planner on one case: its plan holds the default plan's values, and a
    graph-mode plan (when the planner claims a graph mode) updates in place for the next
    batch (:mod:`.plans`)."""
    contract = get_contract(impl.op_name)
    where = f"{describe(impl)}, case {case.name!r}, device {device}"
    if contract.plan_stage is None:
        return Outcome(FAILED, f"{where}: op {impl.op_name!r} has no plan stage")
    inputs = _make_inputs(contract, case, contract.dtypes[0], device)
    try:
        problems = list(plan_problems(impl, contract, inputs))
    except Exception as exc:
        return Outcome(
            FAILED,
            f"{where}: planning raised {type(exc).__name__}: {exc}\n{traceback.format_exc()}",
        )
    if problems:
        return Outcome(FAILED, f"{where}:\n  " + "\n  ".join(problems))
    return Outcome(PASSED)


def _planned_by(impl: OpImpl, contract: OpContract, inputs: OpInputs) -> OpInputs:
    """``inputs`` with the reference's plan replaced by ``impl``'s planner's."""
    *tensors, _ = inputs.args
    plan = planner_of(impl, contract).plan(inputs.batch)
    return dataclasses.replace(inputs, args=(*tensors, plan))


# -- planning -------------------------------------------------------------------------------------


def plan(
    vendor: str | None = None,
    op: str | None = None,
    device: str = "cpu",
    runtime: Runtime | None = None,
) -> list[Check]:
    """The checks for the installed implementations of ``vendor`` (all if ``None``) and ``op``.

    The built-in reference backend is never a subject: it is what the others are compared to.
    A selection that matches nothing is one failing (unknown vendor) or skipped check, never an
    empty run that would look green.
    """
    runtime = runtime or get_runtime()
    ops = (get_contract(op).name,) if op else tuple(STANDARD_OPS)
    plugins = [p for p in runtime.plugins if not p.builtin]
    if vendor is not None:
        selected = [p for p in plugins if p.name == vendor]
        if not selected:
            installed = ", ".join(p.name for p in plugins) or "none"
            message = (
                f"no sglang_fl.backends plugin named {vendor!r} is installed (installed: "
                f"{installed}); install the vendor's wheel, e.g. `pip install -e .` in its project"
            )
            return [Check(f"{vendor}/plugin", _const(Outcome(FAILED, message)))]
    else:
        selected = plugins
        if not selected:
            reason = "no vendor plugin is installed (entry-point group sglang_fl.backends)"
            return [Check("no-vendor", _const(Outcome(SKIPPED, reason)))]
    checks: list[Check] = []
    for record in selected:
        impls = [
            impl
            for op_name in STANDARD_OPS
            for impl in runtime.registry.implementations(op_name)
            if impl.provenance is not None and impl.provenance.plugin == record.name
        ]
        checks.append(Check(f"{record.name}/plugin", _bind(check_plugin, record, len(impls))))
        impls = [impl for impl in impls if impl.op_name in ops]
        if record.status is PluginStatus.LOADED and op is not None and not impls:
            message = f"plugin {record.name!r} registers no implementation of op {op!r}"
            checks.append(Check(f"{record.name}/{op}", _const(Outcome(FAILED, message))))
        for impl in impls:
            if get_contract(impl.op_name).collective is not None:
                checks.extend(_collective_checks(impl, _label(impl, impls), impls, record.name))
            else:
                checks.extend(_impl_checks(impl, _label(impl, impls), device))
    return checks


def _collective_checks(
    impl: OpImpl, label: str, siblings: list[OpImpl], plugin: str
) -> Iterator[Check]:
    """A collective's checks: its signature, then one item per world size, dtype and case.

    The cases of one world size run together, in one multi-process run (the kit starts the
    ranks, gloo on the CPU, with a hard timeout) made by the first of its items to run and
    read by the others. A peer op (``recv`` for ``send``) is the same vendor's when it
    registers one.
    """
    yield Check(f"{label}/signature", _bind(check_signature, impl))
    availability = probe(impl)
    if not availability:
        reason = f"{describe(impl)} is unavailable here: {availability.reason}"
        yield Check(f"{label}/unavailable", _const(Outcome(SKIPPED, reason)))
        return
    contract = get_contract(impl.op_name)
    spec = contract.collective
    assert spec is not None
    impls = {impl.op_name: impl.impl_id}
    for peer in spec.peers:
        same_vendor = [i for i in siblings if i.op_name == peer]
        if same_vendor:
            impls[peer] = same_vendor[0].impl_id
    run = _CollectiveRuns(impl, impls, plugin)
    for world_size in spec.world_sizes:
        for case, dtype, case_id in contract_grid(impl.op_name):
            yield Check(
                f"{label}/world={world_size}/{case_id}",
                _bind(run.case, world_size, dtype_name(dtype), case.name),
            )


class _CollectiveRuns:
    """One vendor collective's multi-process runs, one per world size, made on first use."""

    def __init__(self, impl: OpImpl, impls: Mapping[str, str], plugin: str) -> None:
        self.impl, self.impls, self.plugin = impl, dict(impls), plugin
        self._runs: dict[int, dict[tuple[str, str], Any]] = {}

    def case(self, world_size: int, dtype: str, case: str) -> Outcome:
        """One case's outcome, from its world size's run."""
        from .collectives import run_collective_checks

        if world_size not in self._runs:
            results = run_collective_checks(
                world_size, self.impls, ops=[self.impl.op_name], plugin=self.plugin
            )
            self._runs[world_size] = {(r.dtype, r.case): r for r in results}
        result = self._runs[world_size].get((dtype, case))
        where = f"{describe(self.impl)}, case {dtype}/{case} on {world_size} ranks"
        if result is None:
            return Outcome(FAILED, f"{where}: the kit ran no such case")
        if result.declined:
            return Outcome(SKIPPED, f"{where} declined: {result.message}")
        if not result.passed:
            return Outcome(FAILED, f"{where} failed:\n{result.message}")
        return Outcome(PASSED)


def check_collective(
    impl: OpImpl, impls: Mapping[str, str], world_size: int, plugin: str
) -> Outcome:
    """Every case and dtype of a collective on ``world_size`` spawned ranks (gloo, CPU), as
    one outcome (the hardware scripts' summary; the pytest items are one per case)."""
    from .collectives import run_collective_checks

    results = run_collective_checks(world_size, impls, ops=[impl.op_name], plugin=plugin)
    failed = [r for r in results if not r.passed]
    if not results:
        return Outcome(FAILED, f"{describe(impl)}: the kit ran no case on {world_size} ranks")
    if all(r.declined for r in results):
        return Outcome(SKIPPED, f"{describe(impl)} declined every case: {results[0].message}")
    if failed:
        shown = "\n".join(f"{r.case_id}: {r.message}" for r in failed[:5])
        more = f"\n(and {len(failed) - 5} more)" if len(failed) > 5 else ""
        return Outcome(
            FAILED,
            f"{describe(impl)}, {len(failed)} of {len(results)} cases on {world_size} ranks "
            f"failed:\n{shown}{more}",
        )
    return Outcome(PASSED)


def _impl_checks(impl: OpImpl, label: str, device: str) -> Iterator[Check]:
    yield Check(f"{label}/signature", _bind(check_signature, impl))
    availability = probe(impl)
    if not availability:
        reason = f"{describe(impl)} is unavailable here: {availability.reason}"
        yield Check(f"{label}/unavailable", _const(Outcome(SKIPPED, reason)))
        return
    for case, dtype, case_id in contract_grid(impl.op_name):
        yield Check(f"{label}/{case_id}", _bind(check_case, impl, case, dtype, device))
    if get_contract(impl.op_name).plan_stage is not None:
        for case in get_contract(impl.op_name).cases:
            yield Check(f"{label}/plan/{case.name}", _bind(check_plan, impl, case, device))


def contract_grid(op: str) -> Iterator[tuple[OpCase, torch.dtype, str]]:
    """Every case and dtype of ``op``'s contract, with its id ``dtype/case`` as the kit names it."""
    contract = get_contract(op)
    for dtype in contract.dtypes:
        for case in contract.cases:
            yield case, dtype, f"{dtype_name(dtype)}/{case.name}"


def registered_by(register: Callable[[OpRegistry], object]) -> OpRegistry:
    """A fresh registry filled by one vendor's registration alone (its hook function or seed
    ``register_builtins``): checks that vendor's adapters without loading any plugin."""
    registry = OpRegistry()
    register(registry)
    return registry


def probe(impl: OpImpl) -> Availability:
    """The implementation's availability, probed at most once per process by the kit; a probe
    that does not answer within ``SGLANG_FL_PLUGIN_TIMEOUT`` is unavailable, as at run time."""
    global _AVAILABILITY
    if _AVAILABILITY is None:
        _AVAILABILITY = AvailabilityCache(timeout=Settings.from_environment().plugin_timeout)
    return _AVAILABILITY.check(impl)


def _label(impl: OpImpl, siblings: list[OpImpl]) -> str:
    label = f"{vendor_of(impl)}/{impl.op_name}"
    same_op = [s for s in siblings if s.op_name == impl.op_name]
    return label if len(same_op) == 1 else f"{label}/{impl.impl_id}"


def _const(outcome: Outcome) -> Callable[[], Outcome]:
    return lambda: outcome


def _bind(fn: Callable[..., Outcome], *args: Any) -> Callable[[], Outcome]:
    return lambda: fn(*args)


# -- case internals -------------------------------------------------------------------------------


def _moved(output: Any, device: str) -> Any:
    """A reference output (a tensor or a tuple of them) on ``device``; copies are exact."""
    if isinstance(output, torch.Tensor):
        return output.to(device)
    if isinstance(output, tuple):
        return tuple(_moved(part, device) for part in output)
    return output


def _make_inputs(contract: OpContract, case: OpCase, dtype: torch.dtype, device: str) -> OpInputs:
    seed = zlib.crc32(f"{contract.name}/{case.name}/{dtype}".encode())
    generator = torch.Generator().manual_seed(seed)
    return contract.make_inputs(case, dtype, torch.device(device), generator)


def _tensors(contract: OpContract, inputs: OpInputs, names: tuple[str, ...]) -> dict[str, Any]:
    """``'x'`` -> argument tensor, ``'obj.weight'`` -> layer attribute tensor."""
    found: dict[str, Any] = {}
    for name in names:
        if name.startswith("obj."):
            value = getattr(inputs.obj, name.removeprefix("obj."))
        else:
            value = inputs.argument(name, contract.signature)
        if isinstance(value, torch.Tensor):
            found[name] = value
    return found


def _all_names(contract: OpContract, inputs: OpInputs) -> tuple[str, ...]:
    layer_attrs = tuple(f"obj.{k}" for k in getattr(inputs.obj, "__dict__", {}))
    return (*contract.parameter_names[1:], *layer_attrs)


def _preserved_names(inputs: OpInputs) -> tuple[str, ...]:
    # Layer attributes (weights, caches) are never an op's output: they always stay untouched.
    layer_attrs = tuple(f"obj.{k}" for k in getattr(inputs.obj, "__dict__", {}))
    return (*inputs.preserved, *layer_attrs)


def _snapshot(contract: OpContract, inputs: OpInputs) -> Mapping[str, torch.Tensor]:
    return {
        name: tensor.detach().clone()
        for name, tensor in _tensors(contract, inputs, _all_names(contract, inputs)).items()
    }


def _changed(
    contract: OpContract,
    inputs: OpInputs,
    before: Mapping[str, torch.Tensor],
    names: tuple[str, ...],
) -> list[str]:
    """``'x' (3 of 128 elements)`` for each named tensor that differs from its snapshot."""
    changed = []
    for name, tensor in _tensors(contract, inputs, names).items():
        if name in before and not torch.equal(tensor, before[name]):
            count = int((tensor != before[name]).sum())
            changed.append(f"{name!r} ({count} of {tensor.numel()} elements)")
    return changed


def _output_problems(got: object, want: object, tolerance: Tolerance) -> Iterator[str]:
    if isinstance(want, torch.Tensor):
        problem = compare(got, want, tolerance, "output")
        if problem:
            yield problem
        return
    assert isinstance(want, tuple)
    if not isinstance(got, (tuple, list)) or len(got) != len(want):
        shape = type(got).__name__ + (f" of {len(got)}" if isinstance(got, (tuple, list)) else "")
        yield f"returned a {shape}, expected a tuple of {len(want)} tensors"
        return
    for index, (g, w) in enumerate(zip(got, want, strict=True)):
        problem = compare(g, w, tolerance, f"output[{index}]")
        if problem:
            yield problem


def _in_place_problems(
    contract: OpContract, inputs: OpInputs, got: object, want: object, tolerance: Tolerance
) -> list[str]:
    """Outputs the contract says are written in place share storage with, and fill, the input."""
    problems: list[str] = []
    outputs = got if isinstance(got, (tuple, list)) else (got,)
    wanted = want if isinstance(want, tuple) else (want,)
    for index, name in inputs.written_in_place.items():
        argument = inputs.argument(name, contract.signature)
        output = outputs[index] if index < len(outputs) else None
        if not isinstance(output, torch.Tensor) or (
            output.untyped_storage().data_ptr() != argument.untyped_storage().data_ptr()
        ):
            problems.append(
                f"output[{index}] must be written in place into input {name!r}, "
                "but it does not share that input's storage"
            )
        problem = compare(argument, wanted[index], tolerance, f"input {name!r} after the call")
        if problem:
            problems.append(problem + f" (it must hold output[{index}])")
    return problems
