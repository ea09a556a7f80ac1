"""The reference pages of the documentation name every setting and every standard op there is.

``docs/reference/configuration.md`` has one table row per ``SGLANG_FL_*`` variable and
``docs/reference/operators.md`` one per standard op. Both are written by hand (they say what a
value means, which kernel each vendor maps), so a setting or an op added to core without its
row would be undocumented; these tests compare the rows with what the installed core defines.
"""

from __future__ import annotations

import re
from pathlib import Path

from sglang_fl.config import ENV_PREFIX, SETTINGS
from sglang_fl.ops import STANDARD_OPS

ROOT = Path(__file__).resolve().parents[2]
CONFIGURATION = ROOT / "docs" / "reference" / "configuration.md"
OPERATORS = ROOT / "docs" / "reference" / "operators.md"
# A table row's first two cells: "| `NAME` | rest |".
ROW = re.compile(r"^\| `([^`]+)` \|([^|]*)\|", re.MULTILINE)


def rows(page: Path) -> dict[str, str]:
    """First cell (without its backticks) -> second cell, for every table row of ``page``."""
    return {name: second.strip() for name, second in ROW.findall(page.read_text())}


def test_every_setting_has_its_row_with_its_file_key() -> None:
    documented = {
        name: key for name, key in rows(CONFIGURATION).items() if name.startswith(ENV_PREFIX)
    }
    defined = {setting.env: setting.key for setting in SETTINGS}
    config_file = ENV_PREFIX + "CONFIG"  # names the file; no key of its own
    assert set(documented) == {*defined, config_file}, (
        f"{CONFIGURATION.name}: undocumented {sorted({*defined, config_file} - set(documented))}, "
        f"documented but not defined {sorted(set(documented) - {*defined, config_file})}"
    )
    for variable, key in defined.items():
        assert documented[variable].startswith(f"`{key}`"), (variable, documented[variable])
    assert documented[config_file] == ""


def test_every_standard_op_has_its_row() -> None:
    documented = set(rows(OPERATORS))
    assert documented == set(STANDARD_OPS), (
        f"{OPERATORS.name}: undocumented {sorted(set(STANDARD_OPS) - documented)}, "
        f"documented but not standard {sorted(documented - set(STANDARD_OPS))}"
    )
