"""Griffe extension: read hpcdist's docstrings the way they are written.

hpcdist's docstrings are Google style with three habits mkdocstrings does not
read by itself, fixed here while the API reference is built (the source is not
changed):

* ``Example:`` (singular) introduces doctests; griffe reads only ``Examples:``
  as an examples section, and would show the ``>>>`` lines as quotes;
* Sphinx roles (``:func:`~hpcdist.runtime.world```) become code spans;
* ``#:`` comments above a module constant are that constant's docstring.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import griffe

_SECTION = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj|const):`(~?)([^`]+)`")


def _short(match: re.Match) -> str:
    target = match.group(2).strip()
    if match.group(1):  # Sphinx's ~: show the last component only
        target = target.rsplit(".", 1)[-1]
    return f"``{target}``"


def fix_text(text: str) -> str:
    """The docstring with ``Example:`` sections renamed and Sphinx roles made code spans."""
    text = _SECTION.sub(lambda m: f"{m.group(1)}Examples:", text)
    return _ROLE.sub(_short, text)


class HpcdistDocstrings(griffe.Extension):
    """Rewrite docstrings on load; give ``#:``-commented constants their comment."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fix_text(obj.docstring.value)

    def on_attribute_instance(
        self, *, node: ast.AST | Any, attr: griffe.Attribute, **kwargs: Any
    ) -> None:
        if attr.docstring is not None or attr.lineno is None:
            return
        module = attr.module
        path = module.filepath
        if not isinstance(path, Path) or not path.exists():
            return
        lines = path.read_text(encoding="utf-8").splitlines()
        comment: list[str] = []
        index = attr.lineno - 2
        while index >= 0 and lines[index].lstrip().startswith("#:"):
            comment.insert(0, lines[index].lstrip()[2:].strip())
            index -= 1
        if comment:
            attr.docstring = griffe.Docstring(
                fix_text("\n".join(comment)), lineno=index + 2, parent=attr
            )
