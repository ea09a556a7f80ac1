"""The conformance kit's pytest plugin (entry point ``pytest11``); inert unless asked for.

It adds two options and parametrizes only test functions made by
:func:`sglang_fl.testing.conformance_tests` (they carry the ``sglang_fl_conformance`` marker),
so an unrelated test suite in the same environment is untouched: nothing is imported, no
plugin is loaded, no item is added.
"""

from __future__ import annotations

import pytest

from . import MARKER, PARAMETER

# The parsed ``--sglang-fl-conformance`` value: (vendor or None, op or None).
SELECTOR = pytest.StashKey[tuple[str | None, str | None]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sglang-fl", "sglang-fl conformance kit")
    group.addoption(
        "--sglang-fl-conformance",
        metavar="VENDOR[:OP]",
        default=None,
        help="narrow the sglang-fl conformance tests to one vendor (plugin name) and/or op, "
        "e.g. my_chip, my_chip:rms_norm or :rms_norm",
    )
    group.addoption(
        "--sglang-fl-device",
        metavar="DEVICE",
        default=None,
        help="torch device the conformance inputs are made on (default: cpu, or the device "
        "given to conformance_tests())",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(vendor, op, device): sglang-fl conformance test made by "
        "sglang_fl.testing.conformance_tests()",
    )
    option = config.getoption("--sglang-fl-conformance")
    if option:
        # Checked here, before collection, so a typo is a usage error and not a broken module.
        from ..errors import UnknownOpError
        from .checks import parse_selector

        try:
            config.stash[SELECTOR] = parse_selector(option)
        except UnknownOpError as exc:
            raise pytest.UsageError(f"--sglang-fl-conformance={option}: {exc}") from None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is None or PARAMETER not in metafunc.fixturenames:
        return
    from .checks import SKIPPED, Check, Outcome, plan

    vendor, op = marker.kwargs.get("vendor"), marker.kwargs.get("op")
    option = metafunc.config.getoption("--sglang-fl-conformance")
    wanted_vendor, wanted_op = metafunc.config.stash.get(SELECTOR, (None, None))
    device = metafunc.config.getoption("--sglang-fl-device") or marker.kwargs.get("device")
    if (vendor and wanted_vendor and vendor != wanted_vendor) or (
        op and wanted_op and op != wanted_op
    ):
        reason = f"deselected by --sglang-fl-conformance={option} (this test checks "
        reason += f"vendor={vendor or 'all'}, op={op or 'all'})"
        checks = [Check("deselected", lambda: Outcome(SKIPPED, reason))]
    else:
        checks = plan(vendor or wanted_vendor, op or wanted_op, device or "cpu")
    metafunc.parametrize(PARAMETER, checks, ids=[check.id for check in checks])


def pytest_collection_finish(session: pytest.Session) -> None:
    """A selector with no conformance test to narrow is a mistake: say what would run one."""
    option = session.config.getoption("--sglang-fl-conformance")
    if not option or any(item.get_closest_marker(MARKER) for item in session.items):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            f"--sglang-fl-conformance={option}: no sglang-fl conformance test was collected; "
            f"run `pytest --pyargs sglang_fl.testing.suite --sglang-fl-conformance={option}` "
            "or bind sglang_fl.testing.conformance_tests() in a test module",
            yellow=True,
        )
