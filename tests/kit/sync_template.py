"""Re-render ``vendors/template`` from the template shipped in core (run after editing it).

``vendors/template`` is ``sglang-fl new-vendor template`` output, checked in so that CI builds
and tests exactly what a chip maker gets; ``core/tests/test_scaffold.py`` fails when the two
drift. Usage: ``python tests/kit/sync_template.py``.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from sglang_fl.scaffold import VendorNames, render

TEMPLATE_VENDOR = Path(__file__).resolve().parents[2] / "vendors" / "template"


def main() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "."],
        cwd=TEMPLATE_VENDOR,
        capture_output=True,
        check=True,
        text=True,
    ).stdout.split("\0")
    for relative in filter(None, tracked):
        (TEMPLATE_VENDOR / relative).unlink()
    with tempfile.TemporaryDirectory() as staging:
        for path in render(VendorNames.parse("template"), Path(staging)):
            (TEMPLATE_VENDOR / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(staging, path), TEMPLATE_VENDOR / path)
            print(f"vendors/template/{path.as_posix()}")


if __name__ == "__main__":
    main()
