"""sglang-fl's platform entry point and its SGLang API detection, in this (CPU-only) process."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("sglang")

from sglang.kernels.fused_op import BaseFusedOp

from sglang_fl.integrations.sglang import compat, platform


def test_cpu_machine_gets_sglang_fls_cpu_platform(router: Any) -> None:
    from sglang.srt.platforms import current_platform

    assert platform.in_tree_accelerator() is None, "these tests expect a machine without one"
    assert platform.activate() == platform.CPU_PLATFORM
    assert type(current_platform).__name__ == "SglangFlCpuPlatform"
    assert current_platform.is_out_of_tree()
    assert current_platform.device_type == "cpu"
    assert current_platform.get_dispatch_key_name() == platform.DISPATCH_KEY


def test_sglang_cpu_engine_request_is_left_to_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    assert platform.activate() is None


def test_selecting_sglang_fl_by_name_always_gets_a_platform(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    monkeypatch.setenv("SGLANG_PLATFORM", platform.ENTRY_POINT_NAME)
    assert platform.activate() == platform.CPU_PLATFORM


def test_missing_hook_point_names_the_sglang_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """An SGLang without the per-instance resolution step (older or newer) fails clearly."""
    monkeypatch.delattr(BaseFusedOp, "_resolve_forward_method")
    with pytest.raises(compat.SglangApiError) as excinfo:
        compat.find_sglang_api()
    message = str(excinfo.value)
    assert f"found SGLang {compat.sglang_version()}" in message
    assert "_resolve_forward_method" in message


def test_cpu_device_module_shim_keeps_torch_compile_working() -> None:
    """The shim answers ``torch.cpu`` and keeps ``__wrapped__``, which dynamo reads when it
    builds its handlers: without it every ``torch.compile`` (Gemma-3's rope) failed."""
    import subprocess
    import sys

    program = (
        "import sglang.srt.platforms\n"  # SGLang first: it activates the platform entry points
        "import torch\n"
        "from sglang_fl.integrations.sglang.platform import device_module_without_accelerator\n"
        "device_module_without_accelerator()\n"
        "assert torch.get_device_module() is torch.cpu, torch.get_device_module()\n"
        "assert torch.get_device_module('cpu') is torch.cpu\n"
        "f = torch.compile(lambda x: torch.cat((-x[..., 2:], x[..., :2]), dim=-1))\n"
        "x = torch.arange(8.0).reshape(2, 4)\n"
        "assert torch.equal(f(x), torch.cat((-x[..., 2:], x[..., :2]), dim=-1))\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok", done.stdout


@pytest.mark.parametrize(
    ("env", "report"),
    [
        (
            {},
            {
                "platform": platform.CPU_PLATFORM,
                "platform_source": "sglang-fl-cpu",
                "attention_backend": "sglang_fl",
                "attention_implementation": "reference.sglang_fl_attention",
            },
        ),
        (
            {"SGLANG_USE_CPU_ENGINE": "1"},
            {
                "platform": None,
                "platform_source": "sglang-cpu-engine",
                "attention_backend": "intel_amx",
                "attention_implementation": None,
            },
        ),
    ],
    ids=["sglang-fl-cpu", "sglang-cpu-engine"],
)
def test_doctor_names_the_platform_and_the_attention_backend_an_engine_gets(
    env: dict[str, str], report: dict[str, Any]
) -> None:
    """What ``sglang.Engine(model_path=..., device="cpu")`` gets here, asked in a fresh process
    the way an operator asks it."""
    import json
    import subprocess
    import sys

    from sglang_processes import ENGINE_TIMEOUT_S, clean_env

    command = [sys.executable, "-m", "sglang_fl", "doctor"]
    done = subprocess.run(
        [*command, "--json"],
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT_S,
    )
    sglang = json.loads(done.stdout)["sglang"]
    assert {key: sglang[key] for key in report} == report, sglang
    assert sglang["version"] == compat.sglang_version()
    text = subprocess.run(
        command, env=clean_env(**env), capture_output=True, text=True, timeout=ENGINE_TIMEOUT_S
    ).stdout
    shown = report["platform"] or "SGLang's own"
    assert f"  platform           {shown}  (" in text
    assert f"  attention backend  {report['attention_backend']}" in text
