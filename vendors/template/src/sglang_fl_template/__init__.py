"""sglang-fl backend template: copy it with ``sglang-fl new-vendor NAME``.

Importing this package imports no chip SDK; the backend probes for its chip lazily.
"""

__version__ = "0.1.0"
