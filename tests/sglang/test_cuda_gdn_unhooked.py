"""The CUDA wheel's GDN adapters reach SGLang's own functions, not the hooks sglang-fl routes.

sglang-fl routes SGLang's GDN functions with ``AROUND`` hooks in SGLang's real
``HookRegistry``, which also rebinds every ``from ... import`` copy in ``sys.modules``. The CUDA
adapters call those same functions through ``sglang_fl_cuda.sglang_triton``; were they to
call the hook, the hook would call the adapter again. Here, in a fresh SGLang 0.5.23 process
(the Triton kernels themselves need a GPU, so a call on the CPU fails inside SGLang), hooks are
applied to the five functions and the module is checked to peel them off, and only them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CUDA_SRC = Path(__file__).parents[2] / "vendors" / "cuda" / "src"

SCRIPT = textwrap.dedent(
    """
    import importlib, json
    import torch
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    import sglang_fl_cuda.sglang_triton as facade

    TARGETS = {
        "chunk_gated_delta_rule": "sglang.kernels.ops.attention.fla.chunk",
        "fused_recurrent_gated_delta_rule": "sglang.kernels.ops.attention.fla.fused_recurrent",
        "fused_recurrent_gated_delta_rule_packed_decode":
            "sglang.kernels.ops.attention.fla.fused_recurrent",
        "fused_sigmoid_gating_delta_rule_update":
            "sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent",
        "fused_gdn_gating": "sglang.kernels.ops.attention.linear.fused_gdn_gating",
    }
    originals = {n: getattr(importlib.import_module(m), n) for n, m in TARGETS.items()}
    own = {n: getattr(facade, n) for n in TARGETS}
    hooked = []

    def around(original, *args, **kwargs):
        hooked.append(original.__name__)
        return original(*args, **kwargs)

    for name, module in TARGETS.items():
        HookRegistry.register(f"{module}.{name}", around, HookType.AROUND)
    HookRegistry.apply_hooks()
    result = {
        "patched": [getattr(importlib.import_module(m), n) is not originals[n]
                    for n, m in TARGETS.items()],
        "peeled": [facade.unhooked(getattr(importlib.import_module(m), n)) is originals[n]
                   for n, m in TARGETS.items()],
        "own_kept": [getattr(facade, n) is own[n] for n in TARGETS],
        # SGLang's own decorator (torch.compiler.disable) is not a hook: it stays.
        "decorator_kept": facade.unhooked(originals["chunk_gated_delta_rule"])
        is originals["chunk_gated_delta_rule"],
    }
    try:  # the Triton launch fails on the CPU: inside SGLang's kernel, never through the hook
        a = torch.randn(3, 4)
        facade.fused_gdn_gating(torch.rand(4), a, a.clone(), torch.randn(4))
        result["error"] = None
    except Exception as exc:
        result["error"] = type(exc).__name__
    result["hook_calls"] = hooked
    print(json.dumps(result))
    """
)


@pytest.mark.timeout(300)
def test_the_adapters_module_calls_sglang_s_functions_without_the_routing_hooks() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(CUDA_SRC), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["patched"] == [True] * 5  # the hooks are really in place
    assert found["peeled"] == [True] * 5
    assert found["own_kept"] == [True] * 5  # SGLang's patch propagation left the module alone
    assert found["decorator_kept"] is True
    assert found["hook_calls"] == []
    assert found["error"] not in (None, "RecursionError")
