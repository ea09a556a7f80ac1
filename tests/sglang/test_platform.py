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

    done = subprocess.run(
        [sys.executable, "-m", "sglang_fl", "doctor", "--json"],
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT_S,
    )
    sglang = json.loads(done.stdout)["sglang"]
    assert {key: sglang[key] for key in report} == report, sglang
    assert sglang["version"] == compat.sglang_version()


def test_doctors_text_shows_the_platform_and_the_attention_backend() -> None:
    import subprocess
    import sys

    from sglang_processes import ENGINE_TIMEOUT_S, clean_env

    text = subprocess.run(
        [sys.executable, "-m", "sglang_fl", "doctor"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT_S,
    ).stdout
    assert f"  platform           {platform.CPU_PLATFORM}  (no accelerator SGLang" in text
    assert "  attention backend  sglang_fl -> reference.sglang_fl_attention  (" in text


# -- SGLang's argument resolution on sglang-fl's platform (server_args.py) ---------------------


def _resolved(model: str, **kwargs: Any) -> Any:
    """``ServerArgs`` resolved as ``sglang.Engine(...)`` resolves them, and a reader of the
    result (SGLang keeps the decisions in its resolution record)."""
    from engines import model_path
    from sglang.srt.arg_groups.overrides import resolution_result
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(model_path=str(model_path(model)), max_total_tokens=4096, **kwargs)
    args.resolve_once()
    return args, lambda field: resolution_result(args, field)


@pytest.mark.parametrize("device", [{}, {"device": "cpu"}], ids=["no device", "device=cpu"])
def test_the_documented_start_gets_sglang_fls_attention_backend(
    router: Any, device: dict[str, str]
) -> None:
    """SGLang alone would pick intel_amx for device="cpu", then torch_native without AMX; and
    without a device it failed on the platform's torch.device."""
    from sglang_fl.integrations.sglang.server_args import attention_backend_reason

    args, resolved = _resolved("llama", **device)
    assert resolved("device") == "cpu"
    assert resolved("attention_backend") == "sglang_fl"
    assert attention_backend_reason(args, "decode", "sglang_fl") == (
        "SGLang's argument resolution: sglang_fl:handle_cpu_backends set 'sglang_fl'"
    )


@pytest.mark.parametrize(
    ("field", "phase"),
    [("attention_backend", "decode"), ("decode_attention_backend", "decode")],
)
def test_an_explicit_attention_backend_wins(router: Any, field: str, phase: str) -> None:
    from sglang_fl.integrations.sglang.server_args import attention_backend_reason

    args, resolved = _resolved("llama", device="cpu", **{field: "torch_native"})
    assert resolved(field) == "torch_native"
    assert attention_backend_reason(args, phase, "torch_native") == (
        f"chosen explicitly ({field}='torch_native')"
    )


@pytest.mark.parametrize(
    ("dtype", "given", "expected"),
    [
        ("float32", None, "float32"),
        ("bfloat16", None, None),
        ("float32", "bfloat16", "bfloat16"),
    ],
    ids=["float32", "bfloat16 (SGLang's default)", "the user's value kept"],
)
def test_a_hybrid_models_conv_states_take_the_models_dtype(
    router: Any,
    monkeypatch: pytest.MonkeyPatch,
    dtype: str,
    given: str | None,
    expected: str | None,
) -> None:
    """SGLang's bfloat16 conv states failed a float32 Qwen3-Next's first prefill ("Index put
    requires the source and destination dtypes match"): on sglang-fl's platform they follow the
    model unless SGLANG_MAMBA_CONV_DTYPE is set."""
    import os

    from sglang_fl.integrations.sglang import server_args

    monkeypatch.delenv(server_args.CONV_DTYPE_VARIABLE, raising=False)
    monkeypatch.setattr(server_args, "_conv_dtype_set", None)
    if given is not None:
        monkeypatch.setenv(server_args.CONV_DTYPE_VARIABLE, given)
    _resolved("qwen3_next", device="cpu", dtype=dtype)
    assert os.environ.get(server_args.CONV_DTYPE_VARIABLE) == expected
    # A dense model leaves the variable alone.
    _resolved("llama", device="cpu", dtype=dtype)
    assert os.environ.get(server_args.CONV_DTYPE_VARIABLE) == expected
