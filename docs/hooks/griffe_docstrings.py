"""Griffe extension: read the package's reST-flavoured Google docstrings as mkdocstrings expects them.

The docstrings follow Lightning's habit (``Example::`` before the doctest, Sphinx roles such as
``:class:`~lightning_privacy.DPSGD```). Griffe's Google parser knows ``Examples:`` sections and Markdown code, so
before parsing, ``Example::`` (and ``Example:``, which Griffe would read as an admonition) becomes ``Examples:`` and each role becomes a code span naming its target (``~`` keeps
the last component, as Sphinx does). Loaded by mkdocs.yml (``extensions:`` of the python handler).
"""

from __future__ import annotations

import ast
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:mod|class|func|meth|attr|data|obj|exc|const):`(~?)([^`]+)`")
_EXAMPLE = re.compile(r"^(\s*)Examples?::?\s*$", flags=re.M)


def _role(match: re.Match) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def to_markdown(text: str) -> str:
    """Return ``text`` with ``Example::`` as an ``Examples:`` section and Sphinx roles as code spans.

    Example::

        >>> to_markdown("See :class:`~lightning_privacy.DPSGD`.")
        'See `DPSGD`.'
    """
    return _ROLE.sub(_role, _EXAMPLE.sub(r"\1Examples:", text))


class ReSTToMarkdown(griffe.Extension):
    """Rewrite every docstring with :func:`to_markdown` as the object is created."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)

    def on_function_instance(self, *, func: griffe.Function, **kwargs: Any) -> None:
        """Show a default that names a module constant (``delta=DEFAULT_DELTA``) as the constant's value."""
        for parameter in func.parameters:
            name = str(parameter.default) if parameter.default is not None else ""
            if not name.isidentifier():
                continue
            scope = func.parent
            while scope is not None:
                member = scope.members.get(name) if hasattr(scope, "members") else None
                if isinstance(member, griffe.Attribute) and member.value is not None:
                    try:
                        value = ast.literal_eval(str(member.value))
                    except (ValueError, SyntaxError):
                        break
                    parameter.default = repr(value)
                    break
                scope = scope.parent
