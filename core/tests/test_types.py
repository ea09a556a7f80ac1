"""The plugin-author API: one module, re-exported by ``sglang_fl``; the seed paths' objects."""

from __future__ import annotations

import subprocess
import sys

import sglang_fl
import sglang_fl.collective_library
import sglang_fl.dispatch.backends
import sglang_fl.dispatch.probes
import sglang_fl.dispatch.registry
import sglang_fl.dispatch.types
import sglang_fl.errors
import sglang_fl.hookspecs
import sglang_fl.ops.attention.plan
import sglang_fl.ops.attention.sglang_backend
import sglang_fl.ops.collectives.group
import sglang_fl.ops.graph_runner
from sglang_fl import types

DEFINED_IN = {
    "AttentionBatch": sglang_fl.ops.attention.plan,
    "AttentionPlan": sglang_fl.ops.attention.plan,
    "Availability": sglang_fl.dispatch.types,
    "Backend": sglang_fl.dispatch.backends,
    "BackendImplKind": sglang_fl.dispatch.types,
    "BackendPriority": sglang_fl.dispatch.types,
    "ChipSdk": sglang_fl.dispatch.probes,
    "CollectiveGroup": sglang_fl.ops.collectives.group,
    "DefaultPlanner": sglang_fl.ops.attention.plan,
    "DtypeSet": sglang_fl.collective_library,
    "GraphMode": sglang_fl.ops.attention.plan,
    "OpImpl": sglang_fl.dispatch.types,
    "OpRegistry": sglang_fl.dispatch.registry,
    "PreparedKernel": sglang_fl.dispatch.types,
    "ProcessGroupLibrary": sglang_fl.collective_library,
    "Provenance": sglang_fl.dispatch.types,
    "SglangAttentionBackendOffer": sglang_fl.ops.attention.sglang_backend,
    "SglangGraphRunnerOffer": sglang_fl.ops.graph_runner,
    "UnevenCalls": sglang_fl.collective_library,
    "Unsupported": sglang_fl.errors,
    "hookimpl": sglang_fl.hookspecs,
}


def test_types_exports_exactly_the_plugin_author_api():
    assert sorted(types.__all__) == sorted(DEFINED_IN)


def test_every_name_is_the_seed_object_and_reexported_by_sglang_fl():
    for name, module in DEFINED_IN.items():
        assert getattr(types, name) is getattr(module, name), name
        assert getattr(sglang_fl, name) is getattr(module, name), name
        assert name in sglang_fl.__all__, name


def test_every_name_is_documented_in_the_module_docstring():
    doc = types.__doc__ or ""
    for name in DEFINED_IN:
        assert f"`{name}`" in doc, name


def test_unknown_attribute_is_an_attribute_error():
    for module in (types, sglang_fl):
        assert not hasattr(module, "OpRegistryy")


def test_importing_the_api_does_not_import_torch():
    """OpRegistry (which imports torch through the op contracts) loads on first use only."""
    code = (
        "import sys\n"
        "from sglang_fl import OpImpl, Backend, ChipSdk, hookimpl, Unsupported\n"
        "from sglang_fl.types import Availability, BackendImplKind, BackendPriority, Provenance\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "from sglang_fl.types import OpRegistry\n"
        "assert 'torch' in sys.modules and OpRegistry.__name__ == 'OpRegistry'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
