"""The SGLang-only contract of a whole attention backend a vendor offers instead of kernels.

A chip maker whose wheel already carries a complete SGLang ``AttentionBackend`` (its own
metadata, graph-capture state, kernels) returns a :class:`SglangAttentionBackendOffer` from the
``sglang_fl_attention_backend`` hook. The offers and sglang-fl's own kernel-based backend are
the candidates of one selection, :data:`SGLANG_ATTENTION_BACKEND`, chosen by the same policy as
an op (``prefer``, ``per_op``, the vendor lists, availability, strict mode), when SGLang builds
the ``sglang_fl`` attention backend of a model runner. vLLM's integration never reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, final

__all__ = ["SGLANG_ATTENTION_BACKEND", "SglangAttentionBackendOffer"]

# The selection's name: what ``per_op`` keys and ``sglang-fl explain`` take, and the ``op`` of
# its decision and report records.
SGLANG_ATTENTION_BACKEND = "sglang_attention_backend"


@final
@dataclass(frozen=True)
class SglangAttentionBackendOffer:
    """A whole SGLang attention backend, offered by one plugin (at most one per plugin).

    ``factory(model_runner)`` builds the backend for one SGLang ``ModelRunner`` (SGLang's own
    registry calls its backends' factories the same way) and must return an instance of
    ``sglang.srt.layers.attention.base_attn_backend.AttentionBackend``; import SGLang and the
    chip SDK inside it, not at plugin import time. It is plugin code, bounded like a hook: it
    runs in a worker thread that carries the engine thread's accelerator device and stream and
    its grad/inference modes (so it allocates where the engine would), waited for at most
    ``SGLANG_FL_PLUGIN_TIMEOUT`` seconds (raise it for a factory that compiles kernels at
    construction); one that does not return in time is abandoned, as an abandoned hook is.

    ``available`` is a no-argument probe (``bool`` or :class:`~sglang_fl.types.Availability`),
    asked at most once per process like an op's; a plain ``bool`` is a fixed answer.
    ``priority`` ranks this offer among other vendors' offers the order ranks equally
    (``None``: :attr:`~sglang_fl.types.BackendPriority.VENDOR`, as for a vendor's kernels).

    The fields are checked as an ``OpImpl`` registration's are: ``factory`` callable,
    ``priority`` ``None`` or an ``int`` (not a ``bool``, float or numeric string),
    ``available`` ``None``, a ``bool`` or a callable; an offer that fails a check is not a
    candidate, and ``sglang-fl explain sglang_attention_backend`` shows it rejected with the
    reason (``SGLANG_FL_STRICT=1``: an error).

    The candidate's ``impl_id`` is ``vendor.<entry-point name>.attention_backend`` and its
    vendor the plugin's entry-point name, so ``SGLANG_FL_DENY_VENDORS`` and ``vendor:<name>``
    reach it. If the factory raises (any exception, ``SystemExit`` included), does not return in
    time or returns something else, the next candidate (down to the kernel-based backend)
    serves that model runner and the dispatch report says why (``SGLANG_FL_STRICT=1``: an
    error naming the vendor).
    """

    factory: Callable[[Any], Any]
    priority: int | None = None
    available: Callable[[], object] | bool | None = field(default=None, compare=False)
