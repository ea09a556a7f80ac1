"""``graph_watch``: graph breaks and recompiles as dynamo records them, and whose they are."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from sglang_fl.graph_watch import DynamoWatch, Owner, RecompileCheck, owner_of


@pytest.mark.parametrize(
    ("path", "owner"),
    [
        ("/site-packages/sglang_fl/graph.py", Owner.SGLANG_FL),
        ("/work/core/src/sglang_fl/ops/attention/plan.py", Owner.SGLANG_FL),
        ("/site-packages/sglang_fl_cuda/attention.py", Owner.VENDOR),
        ("/site-packages/sglang/srt/models/llama.py", Owner.SGLANG),
        ("/site-packages/torch/_dynamo/external_utils.py", Owner.TORCH),
        ("/home/me/model.py", Owner.OTHER),
    ],
)
def test_owner_is_read_from_the_package_directory(path: str, owner: Owner) -> None:
    assert owner_of(path) is owner


def _module(root: Path, package: str, source: str) -> ModuleType:
    """A module at ``root/<package>/step.py``: its path says whose code it is."""
    (root / package).mkdir()
    path = root / package / "step.py"
    path.write_text(source)
    name = f"_watch_{package}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_a_break_is_recorded_with_its_location_owner_and_cause(tmp_path: Path) -> None:
    engine = _module(
        tmp_path,
        "sglang",
        "import torch\n"
        "def step(x):\n"
        "    y = x + 1\n"
        "    torch._dynamo.graph_break()\n"
        "    return y * 2\n",
    )
    torch._dynamo.reset()
    watch = DynamoWatch()
    with watch.watching() as summary:
        got = torch.compile(engine.step, backend="eager")(torch.ones(3))
    assert torch.equal(got, torch.full((3,), 4.0))
    assert summary.graphs == 2  # before and after the break
    (found,) = summary.breaks
    assert found.location == f"{tmp_path / 'sglang' / 'step.py'}:4"
    assert found.owner is Owner.SGLANG
    assert "graph_break" in found.reason  # the line saying what dynamo met, not only its summary
    assert summary.to_json()["graph_breaks"][0]["owner"] == "sglang"


def test_a_recompile_is_recorded_once_per_failed_guard(tmp_path: Path) -> None:
    vendor = _module(
        tmp_path,
        "sglang_fl_acme",
        "SCALE = 2\ndef step(x):\n    return x * SCALE\n",
    )
    torch._dynamo.reset()
    compiled = torch.compile(vendor.step, backend="eager")
    compiled(torch.ones(2))
    check = RecompileCheck()
    compiled(torch.ones(2))
    assert not check.changed()
    vendor.SCALE = 3  # the guard on the global fails: compiled again
    assert torch.equal(compiled(torch.ones(2)), torch.full((2,), 3.0))
    assert check.changed()
    (recompile,) = check.since().recompiles
    assert recompile.owner is Owner.VENDOR
    assert recompile.function.startswith("step at ")
    assert "SCALE" in recompile.reason
    assert not check.since().recompiles  # reported once
