"""The conformance kit: prove a vendor's kernels against the op contracts' reference.

In a vendor project's tests (``sglang-fl new-vendor`` writes this file for you)::

    from sglang_fl.testing import conformance_tests

    test_conformance = conformance_tests(vendor="my_chip")

For every implementation the vendor registers this yields pytest items that check the
signature, then each contract case and dtype: values against the reference within the dtype's
tolerance, and the in-place rules. Unavailable implementations are skipped with their reason;
a case the implementation declines with :class:`~sglang_fl.Unsupported` is skipped. Narrow a
run with ``pytest --sglang-fl-conformance=my_chip:rms_norm`` (or ``-k``), pick the device with
``--sglang-fl-device=cuda``; check every installed vendor without writing a test file with
``pytest --pyargs sglang_fl.testing.suite``.

This package imports neither torch nor pytest until a conformance test is collected: its
pytest plugin (entry point ``pytest11``) is loaded by every pytest run in the environment.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .checks import Check

__all__ = ["MARKER", "PARAMETER", "conformance_tests"]

MARKER = "sglang_fl_conformance"
PARAMETER = "sglang_fl_check"


def conformance_tests(
    vendor: str | None = None, op: str | None = None, *, device: str | None = None
) -> Callable[..., None]:
    """A pytest test function, parametrized at collection over the selected implementations.

    Bind it to a ``test_*`` name in a test module. ``vendor`` is the plugin (entry-point) name,
    ``None`` for every installed vendor; ``op`` a standard op name, ``None`` for all; ``device``
    where inputs are made (default ``cpu``; ``--sglang-fl-device`` overrides it).
    """
    import pytest

    from ..ops import get_contract

    if op is not None:
        get_contract(op)  # fail at import, naming the close match, not deep in collection

    @pytest.mark.sglang_fl_conformance(vendor=vendor, op=op, device=device)
    def test_sglang_fl_conformance(sglang_fl_check: Check) -> None:
        from .checks import FAILED, SKIPPED

        outcome = sglang_fl_check.run()
        if outcome.status is SKIPPED:
            pytest.skip(outcome.message)
        if outcome.status is FAILED:
            pytest.fail(outcome.message, pytrace=False)

    return test_sglang_fl_conformance
