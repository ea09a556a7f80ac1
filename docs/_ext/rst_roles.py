"""A griffe extension for the API pages: core's docstrings are written in reStructuredText style.

They use Sphinx roles (``:class:`OpImpl```, ``:mod:`sglang_fl.ops```) and ``::`` before literal
blocks, which Markdown would print as they are. This turns each role into a code span (the
target's last name when written ``~a.b.C``, as Sphinx shows it) and a paragraph-ending ``::`` into
``:``; the indented block that follows is already a Markdown code block. Docstrings stay as
they are in the source, readable by ``help()`` and by Sphinx alike.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|mod|func|meth|data|attr|exc|obj|const):`(~?)([^`]+)`")
TRAILING_MARKER = re.compile(r"(?<=\S)::$", re.MULTILINE)  # "Example::" -> "Example:"
LONE_MARKER = re.compile(r"^[ \t]*::[ \t]*$", re.MULTILINE)  # a "::" line of its own goes


def _role(match: re.Match[str]) -> str:
    target = match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if match.group(1) else target}`"


def markdown_from_rst(text: str) -> str:
    """The docstring with Sphinx roles as code spans and ``::`` literal markers as ``:``."""
    text = ROLE.sub(_role, text)
    return LONE_MARKER.sub("", TRAILING_MARKER.sub(":", text))


class RstRoles(griffe.Extension):
    """Rewrite every docstring griffe loads (modules, classes, functions, attributes)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_from_rst(obj.docstring.value)
