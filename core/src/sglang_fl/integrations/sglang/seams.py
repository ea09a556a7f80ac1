"""The SGLang seams sglang-fl hooks beside the fused-op resolution, installed in one call.

The entry point (:mod:`.plugin`) builds the router and calls :func:`install_seams`; it never
imports a seam itself (an import-linter contract keeps it so), so the entry point and the
seams cannot grow an import loop again, and a new seam is one line here.
"""

from __future__ import annotations

from ...dispatch_report import DispatchReport
from ...runtime import Runtime
from ...verify import Verifier
from . import attention_backend
from .collectives import route_collectives
from .compat import SglangApi
from .kernel_functions import route_kernel_functions
from .linear_attention import route_linear_attention
from .server_args import install as install_server_args

__all__ = ["install_seams"]


def install_seams(
    api: SglangApi, runtime: Runtime, report: DispatchReport, verifier: Verifier
) -> None:
    """Hook SGLang's kernel functions, register the ``sglang_fl`` attention backend, wrap
    SGLang's server-argument resolution (the platform's defaults), hook the linear-attention
    kernels and the collectives (each reports what it routed). ``verifier``
    is the router's, so verify mode checks the routed functions in the one process verifier."""
    route_kernel_functions(api, runtime, report, verifier)
    attention_backend.install()
    install_server_args(api, report)
    route_linear_attention(api, runtime, report, verifier)
    route_collectives(api, runtime, report)
