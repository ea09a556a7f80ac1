"""template kernels against the sglang-fl reference, over every op contract's cases and dtypes.

Ops unavailable here (no chip, or no probe written yet) are reported skipped with the reason,
as are cases a kernel declines with ``Unsupported``. On the chip: ``pytest
--sglang-fl-device=<torch device>``; one op: ``pytest --sglang-fl-conformance=template:rms_norm``.
"""

from sglang_fl.testing import conformance_tests

test_conformance = conformance_tests(vendor="template")
