"""The issues a definition check gathers, and the one error that reports them all.

Invariant: a definition problem never stops the check at the first one — every issue of every
definition (inline and files) is collected with its exact path (``bad.json: indexes[0].uniqe``,
``collections[2].indexes[0].key``) and raised once as ``CONFIG_INVALID``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from migronaut._suggest import suggest
from migronaut.errors import ConfigInvalidError

__all__ = ["MESSAGE", "Issues", "invalid_definitions"]

MESSAGE = "Invalid collection definition(s)"


@dataclass
class Issues:
    """Issues found so far, each ``{path, message}``; ``prefix`` (a file name) is put before
    every path as ``<file>: <path>``, and stands alone for an issue of the whole file."""

    prefix: str = ""
    found: list[dict[str, str]] = field(default_factory=list)

    def add(self, path: str, message: str) -> None:
        if self.prefix:
            path = f"{self.prefix}: {path}" if path else self.prefix
        self.found.append({"path": path, "message": message})

    def refuse_unknown(
        self, raw: Iterable[Any], allowed: Collection[str], path: str, message: str
    ) -> None:
        """An issue ``<path>.<key>: <message>`` for each key of ``raw`` not in ``allowed``, with
        the allowed key it most likely meant (``uniqe`` — did you mean 'unique'?)."""
        for key in raw:
            if key not in allowed:
                close = suggest(key, allowed)
                self.add(f"{path}.{key}",
                         message + (f" — did you mean '{close}'?" if close else ""))

    def extend(self, other: Issues) -> None:
        self.found.extend(other.found)

    def __bool__(self) -> bool:
        return bool(self.found)


def invalid_definitions(
    issues: Issues, *, cause: BaseException | None = None
) -> ConfigInvalidError:
    """The ``CONFIG_INVALID`` error listing every issue; its message names the first (the CLI
    prints one line per issue when there are more)."""
    first = issues.found[0]
    message = f"{MESSAGE}: {first['path']}: {first['message']}"
    if len(issues.found) > 1:
        message += f" (and {len(issues.found) - 1} more)"
    return ConfigInvalidError(message, {"issues": list(issues.found)}, cause=cause)
