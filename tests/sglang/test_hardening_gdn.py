"""Hardening III (issue 33): the gated-delta-rule routes held to strict mode and verify mode.

``gdn_route_run.py`` calls two of SGLang's own GDN functions after ``load_plugins()`` (so the
hooks sglang-fl registered are the ones SGLang applied), in a fresh interpreter with the hostile
vendor distribution (``hostile_vendor.py``) switched per run. No engine: the routes' behaviour
is the same in a scheduler. What each test guards against, as on 4ee63c2:

- under ``SGLANG_FL_STRICT=1`` a vendor decline on a GDN route was served by the reference,
  silently (the routes built their chain from the decision, not the strict-trimmed one);
- verify mode never checked the GDN routes: a vendor ``rms_norm_gated`` returning zeros, or a
  decode kernel writing a state slot no index names, gave no verify record at all.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from engines import EnginePool
from installed_dists import pythonpath_with
from sglang_processes import ENGINE_TIMEOUT_S, clean_env
from test_attention_selection import forward, result

pytest.importorskip("sglang")

PACKED = "fused_recurrent_gated_delta_rule_packed_decode"
PACKED_TARGET = f"sglang.kernels.ops.attention.fla.fused_recurrent.{PACKED}"
NORM_TARGET = "sglang.kernels.ops.attention.fla.layernorm_gated.RMSNorm.forward"


def run(pool: EnginePool, tmp_path: Path, **env: str) -> Any:
    return forward(pool, tmp_path, "hostile", script="gdn_route_run.py", **env)


def test_a_gdn_decline_falls_back_reported(engine_pool: EnginePool, tmp_path: Path) -> None:
    proc, rows = run(engine_pool, tmp_path, HOSTILE_GDN="decline")
    found = result(proc)
    assert all(d["out_error"] == 0.0 and d["slots_differing"] == [] for d in found["decode"])
    routes = [r for r in rows if r["event"] == "function" and r["function"] == PACKED_TARGET]
    (route,) = [r for r in routes if "declined_by" not in r]  # the route, then its decline
    assert route["impl_id"] == f"vendor.hostile_kernels.{PACKED}"
    (decline,) = [r for r in rows if r.get("declined_by")]
    assert (decline["served_by"], decline["reason"]) == (
        f"reference.{PACKED}",
        "hostile: no packed decode kernel",
    )


def test_under_strict_a_gdn_decline_is_an_error_not_the_reference(
    engine_pool: EnginePool, tmp_path: Path
) -> None:
    proc, rows = run(engine_pool, tmp_path, HOSTILE_GDN="decline", SGLANG_FL_STRICT="1")
    assert proc.returncode != 0, "the reference served the declined call"
    assert (
        f"StrictModeError: SGLANG_FL_STRICT=1: vendor.hostile_kernels.{PACKED} declined a call "
        f"of {PACKED} (hostile: no packed decode kernel)"
    ) in proc.stderr, proc.stderr[-3000:]
    assert not [r for r in rows if r.get("declined_by")]


def test_verify_mode_checks_the_gdn_routes_and_flags_a_write_outside_the_indices(
    engine_pool: EnginePool, tmp_path: Path
) -> None:
    proc, rows = run(engine_pool, tmp_path, HOSTILE_GDN="outside", SGLANG_FL_VERIFY="2")
    found = result(proc)
    assert any(d["slots_differing"] for d in found["decode"]), "the vendor wrote no extra slot"
    checks = [r for r in rows if r["event"] == "verify" and r["layer"] == PACKED_TARGET]
    assert len(checks) == 2  # the budget: 2 calls of the function
    assert {r["impl_id"] for r in checks} == {f"vendor.hostile_kernels.{PACKED}"}
    failed = [r for r in checks if r["verdict"] == "fail"]
    assert failed, checks
    # The pool is written in place and returned as the op's output[1]: each failure names it.
    assert all(r["problem"].startswith("output[1]: ") for r in failed), failed
    # The route without a vendor is checked too: the reference passes its own check.
    norms = [r for r in rows if r["event"] == "verify" and r["layer"] == NORM_TARGET]
    assert [(r["impl_id"], r["verdict"]) for r in norms] == [("reference.rms_norm_gated", "pass")]


def test_verify_mode_flags_a_gated_norm_returning_zeros(
    engine_pool: EnginePool, tmp_path: Path
) -> None:
    proc, rows = run(engine_pool, tmp_path, HOSTILE_GDN="zeros", SGLANG_FL_VERIFY="1")
    assert result(proc)["norm_error"] > 0.1
    (check,) = [r for r in rows if r["event"] == "verify" and r["layer"] == NORM_TARGET]
    assert (check["impl_id"], check["verdict"]) == ("vendor.hostile_kernels.rms_norm_gated", "fail")
    assert check["problem"].startswith("output: ")


KIT = """
import json
from sglang_fl.testing.checks import plan

outcomes = [(c.id, c.run()) for c in plan("hostile_kernels", op="{op}")]
print(json.dumps([[i, o.status, o.message] for i, o in outcomes]))
"""


def test_the_kit_fails_a_gdn_kernel_writing_outside_its_indices(
    engine_pool: EnginePool, tmp_path: Path
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", KIT.format(op=PACKED)],
        env=clean_env(
            PYTHONPATH=pythonpath_with(engine_pool.site("hostile")), HOSTILE_GDN="outside"
        ),
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcomes = json.loads(proc.stdout.strip().splitlines()[-1])
    # The op's cases (not the plugin's load check, not the signature check).
    cases = [(i, s, m) for i, s, m in outcomes if f"/{PACKED}/" in i and "/signature" not in i]
    assert cases
    assert all(status == "failed" for _, status, _ in cases), cases[:2]
    # The pool is the op's last output: the slot written by mistake is off by the 1 written.
    for _, _, message in cases:
        worst = re.search(r"got (\S+), want (\S+) \(it must hold output\[1\]\)", message)
        assert worst, message
        assert float(worst[1]) - float(worst[2]) == pytest.approx(1.0, abs=1e-3), message
