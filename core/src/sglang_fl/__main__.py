"""``python -m sglang_fl`` is the ``sglang-fl`` command."""

import sys

from .cli import main

sys.exit(main())
