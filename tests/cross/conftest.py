"""The cross-distribution tests' shared helpers live in ``tests/support`` (throwaway plugins
written as installed distributions); make them importable here."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
