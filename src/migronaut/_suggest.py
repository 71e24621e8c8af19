"""The one answer to "did you mean …?" for every unknown name a user can type: config keys,
definition and index keys, option names, CLI commands.

Invariant: a suggestion is always one of the known names, and only one. The order of the guesses
is fixed so that every message agrees: an alias of intent (``rollback`` → ``down``), then the same
name in the other spelling convention (``batchSize`` ↔ ``batch_size``), then the closest by
:mod:`difflib` similarity above ``cutoff`` among the known names and the aliases (``rolback`` →
``down``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Mapping

__all__ = ["camel_case", "snake_case", "suggest"]

_UPPER = re.compile(r"(?<=[a-z0-9])([A-Z])")
_UNDERSCORED = re.compile(r"_([a-z0-9])")


def snake_case(name: str) -> str:
    """``batchSize`` → ``batch_size``."""
    return _UPPER.sub(r"_\1", name).lower()


def camel_case(name: str) -> str:
    """``batch_size`` → ``batchSize``."""
    return _UNDERSCORED.sub(lambda match: match[1].upper(), name)


def suggest(
    name: object,
    known: Collection[str],
    *,
    aliases: Mapping[str, str] | None = None,
    cutoff: float = 0.6,
) -> str | None:
    """The known name ``name`` most likely meant, or ``None`` (also for a non-string name)."""
    if not isinstance(name, str) or not known:
        return None
    intents = {alias: meant for alias, meant in (aliases or {}).items() if meant in known}
    if name in intents:
        return intents[name]
    for spelling in (snake_case(name), camel_case(name)):
        if spelling != name and spelling in known:
            return spelling
    close = difflib.get_close_matches(name, sorted({*known, *intents}), n=1, cutoff=cutoff)
    return intents.get(close[0], close[0]) if close else None
