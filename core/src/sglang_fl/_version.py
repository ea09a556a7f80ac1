"""The distribution's version, in a module of its own so core never imports the package root.

``sglang_fl/__init__.py`` re-exports it; core modules import it from here, since the root
re-exports the runtime and would close an import loop (see the layers in ``pyproject.toml``).
"""

__version__ = "0.1.0"
