"""The probe vendor: a throwaway vendor wheel that one build serves to SGLang and to vLLM.

Its implementations are the reference math, recording in which process each op first ran
(``PROBE_VENDOR_CALLS``), so an engine test can tell that the vendor's kernels ran inside the
engine's worker processes. Built as a real wheel and installed with ``pip --target`` into a
directory of its own that the engine subprocess gets on ``PYTHONPATH``; the SGLang tests
(``test_engine.py``) and the vLLM tests (``tests/vllm``) install the same wheel this way.
"""

from __future__ import annotations

from pathlib import Path

from sglang_processes import install_source

__all__ = ["probe_vendor_site"]

VENDOR_MODULE = '''
"""A throwaway vendor: the reference math, recording in which process each op first ran."""
import json
import os

from sglang_fl import hookimpl
from sglang_fl.dispatch.types import BackendImplKind, BackendPriority, OpImpl
from sglang_fl.ops import STANDARD_OPS


def _recording(op_name, math):
    first = True

    def fn(*args, **kwargs):
        nonlocal first
        if first:
            first = False
            with open(os.environ["PROBE_VENDOR_CALLS"], "a") as out:
                out.write(json.dumps({"op": op_name, "pid": os.getpid()}) + "\\n")
        return math(*args, **kwargs)

    return fn


@hookimpl
def sglang_fl_platform():
    return os.environ.get("PROBE_VENDOR_PLATFORM") or None


@hookimpl
def sglang_fl_register_ops(registry):
    registry.register_many(
        OpImpl(op_name=name, impl_id=f"vendor.probe.{name}", kind=BackendImplKind.VENDOR,
               fn=_recording(name, contract.reference), vendor="probe",
               priority=BackendPriority.VENDOR)
        for name, contract in STANDARD_OPS.items()
    )
'''

VENDOR_PLATFORM_MODULE = """
from sglang_fl.integrations.sglang.platform import SglangFlCpuPlatform


class ProbePlatform(SglangFlCpuPlatform):
    def get_dispatch_key_name(self):
        return "probe"
"""

VENDOR_PYPROJECT = """
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang-fl-probe"
version = "0.0.1"
dependencies = ["sglang-fl"]

[project.entry-points."sglang_fl.backends"]
probe = "sglang_fl_probe"
"""


def probe_vendor_site(root: Path) -> Path:
    """Build the probe vendor as a real wheel under ``root`` and pip-install it into a directory
    of its own, returned: put it on ``PYTHONPATH`` beside the engine."""
    source = root / "src"
    (source / "sglang_fl_probe").mkdir(parents=True)
    (source / "sglang_fl_probe" / "__init__.py").write_text(VENDOR_MODULE)
    (source / "sglang_fl_probe" / "platform.py").write_text(VENDOR_PLATFORM_MODULE)
    (source / "pyproject.toml").write_text(VENDOR_PYPROJECT)
    return install_source(source, root)
