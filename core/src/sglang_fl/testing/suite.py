"""A ready-made conformance test module for every installed vendor (no test file to write).

``pytest --pyargs sglang_fl.testing.suite [--sglang-fl-conformance=VENDOR[:OP]]``
"""

from sglang_fl.testing import conformance_tests

test_conformance = conformance_tests()
