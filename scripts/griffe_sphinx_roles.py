"""A Griffe extension for the API reference: our docstrings' reST markup, rendered as Markdown.

The docstrings are written for ``help()`` and editors, with Sphinx roles
(``:class:`~migronaut.Migrator```) and reST literal blocks (a paragraph ending in ``::``).
mkdocstrings renders Markdown, so before rendering each role becomes a cross-reference (a link
when the target is on the site, plain code otherwise) and ``::`` a plain ``:`` (the indented
block after it is already a Markdown code block). The source docstrings stay as they are.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|exc|data|obj):`(?P<body>[^`]+)`")
_LITERAL_BLOCK = re.compile(r"(?<=\S)::$", re.MULTILINE)


class SphinxRoles(griffe.Extension):
    """Rewrite every docstring of the loaded package once it is fully loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._walk(pkg, seen=set())

    def _walk(self, obj: griffe.Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None:
            obj.docstring.value = _markdown(obj.docstring.value, obj)
        for member in obj.members.values():
            if not member.is_alias:
                self._walk(member, seen)  # type: ignore[arg-type]


def _markdown(text: str, scope: griffe.Object) -> str:
    def role(match: re.Match[str]) -> str:
        body = match["body"].strip()
        explicit = re.fullmatch(r"(?P<title>.+?)\s*<(?P<target>[^>]+)>", body)
        if explicit:
            title, target = explicit["title"], explicit["target"]
        else:
            target = body.lstrip("~")
            title = target.rsplit(".", 1)[-1] if body.startswith("~") else target
        identifier = _resolve(target, scope)
        return f'<autoref identifier="{identifier}" optional><code>{title}</code></autoref>'

    return _LITERAL_BLOCK.sub(":", _ROLE.sub(role, text))


def _resolve(name: str, scope: griffe.Object) -> str:
    """The full path of ``name`` as seen from ``scope`` (``name`` itself when unresolved)."""
    head, _, rest = name.partition(".")
    current: griffe.Object | None = scope
    while current is not None:
        try:
            resolved = current.resolve(head)
        except Exception:  # best effort: an unresolved name is left as it is, never fatal
            resolved = None
        if resolved:
            return f"{resolved}.{rest}" if rest else resolved
        current = current.parent
    return name
