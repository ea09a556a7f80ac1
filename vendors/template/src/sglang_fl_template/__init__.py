"""sglang-fl backend for the template chip (entry point ``template``).

Importing this package imports no chip SDK; the backend probes for the chip lazily.
"""

__version__ = "0.1.0"
