"""Inline ``collections`` (a list in the config) and the names no definition may take.

Kept apart from :mod:`.sources` so the config can check inline definitions when it resolves —
they are data, validated with the rest of the config — without importing the file loader.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from migronaut.declared.definition import CollectionDefinition, validate_definition
from migronaut.declared.issues import Issues
from migronaut.observability.runstore import logs_collection_name

__all__ = ["REBUILDS_SUFFIX", "reserved_names", "validate_inline"]

#: The rebuilds converge has begun and not seen through live in ``<converge_log_collection>`` +
#: this (:mod:`migronaut.commands.converge_rebuilds`).
REBUILDS_SUFFIX = "_rebuilds"


def reserved_names(
    *, migrations_collection: str, lock_collection: str, converge_log_collection: str,
    background_collection: str, runs_collection: str,
) -> frozenset[str]:
    """migronaut's own collections, which no definition may name (nor converge prune): the
    configured ones, wherever they are renamed to, beside every ``_migronaut_*`` name
    (:func:`~migronaut.declared.definition.collection_name_problem`)."""
    return frozenset((migrations_collection, lock_collection, converge_log_collection,
                      converge_log_collection + REBUILDS_SUFFIX,
                      background_collection, background_collection + "_partitions",
                      background_collection + "_watch", runs_collection,
                      logs_collection_name(runs_collection)))


def validate_inline(
    raw: Any, issues: Issues, reserved: Collection[str]
) -> list[CollectionDefinition]:
    """Check the inline ``collections`` list (Python keys); paths are ``collections[i]…``."""
    if raw is None:
        return []
    if not isinstance(raw, (list, tuple)):
        issues.add("collections", "must be a list of collection definitions")
        return []
    out: list[CollectionDefinition] = []
    declared: dict[str, str] = {}
    for position, item in enumerate(raw):
        base = f"collections[{position}]"
        definition = validate_definition(item, issues, base=base, style="python",
                                         source=base, reserved=reserved)
        if definition is None:
            continue
        if definition.name in declared:
            issues.add(f"{base}.name", f'"{definition.name}" is already declared in '
                       f"{declared[definition.name]}")
            continue
        declared[definition.name] = base
        out.append(definition)
    return out
