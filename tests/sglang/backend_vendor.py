"""A throwaway vendor wheel that offers a whole SGLang attention backend, no kernels.

Built as a real wheel and installed with ``pip --target`` (as the other test vendors), its
``sglang_fl_attention_backend`` hook offers a subclass of SGLang's own
``TorchNativeAttnBackend`` that appends its pid to ``BACKEND_VENDOR_CALLS`` on its first
forward, so a test can tell it served inside the scheduler. With ``BACKEND_VENDOR_RAISE=1`` its
factory raises :data:`RAISE_MESSAGE` instead (the kernel-based backend must then serve, or,
under ``SGLANG_FL_STRICT=1``, the engine must fail naming this vendor).
"""

from __future__ import annotations

from pathlib import Path

from sglang_processes import install_source

__all__ = ["PLUGIN", "RAISE_MESSAGE", "VENDOR_IMPL_ID", "backend_vendor_site"]

PLUGIN = "wholebackend"
VENDOR_IMPL_ID = f"vendor.{PLUGIN}.attention_backend"
RAISE_MESSAGE = "the whole-backend vendor cannot build on this runner"

VENDOR_MODULE = f'''
"""A vendor whose wheel carries a whole SGLang attention backend."""
import os

from sglang_fl import SglangAttentionBackendOffer, hookimpl


def _build(model_runner):
    if os.environ.get("BACKEND_VENDOR_RAISE") == "1":
        raise RuntimeError({RAISE_MESSAGE!r})
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    class RecordingBackend(TorchNativeAttnBackend):
        served = False

        def _record(self):
            if not self.served:
                self.served = True
                with open(os.environ["BACKEND_VENDOR_CALLS"], "a") as out:
                    out.write(f"{{os.getpid()}}\\n")

        def forward_extend(self, *args, **kwargs):
            self._record()
            return super().forward_extend(*args, **kwargs)

        def forward_decode(self, *args, **kwargs):
            self._record()
            return super().forward_decode(*args, **kwargs)

    return RecordingBackend(model_runner)


@hookimpl
def sglang_fl_attention_backend():
    return SglangAttentionBackendOffer(factory=_build)
'''

VENDOR_PYPROJECT = f"""
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang-fl-wholebackend"
version = "0.0.1"
dependencies = ["sglang-fl"]

[project.entry-points."sglang_fl.backends"]
{PLUGIN} = "sglang_fl_wholebackend"
"""


def backend_vendor_site(root: Path) -> Path:
    """Build and install the whole-backend vendor under ``root``; returns its site directory."""
    source = root / "src"
    (source / "sglang_fl_wholebackend").mkdir(parents=True)
    (source / "sglang_fl_wholebackend" / "__init__.py").write_text(VENDOR_MODULE)
    (source / "pyproject.toml").write_text(VENDOR_PYPROJECT)
    return install_source(source, root)
