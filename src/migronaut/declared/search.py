"""Declared Atlas Search / Vector Search indexes: shape checks and the normalized form
(reference collections §7.1).

Only the shape is checked here — Atlas validates the rest of its own definition format when the
index is built. Invariant: each declared search index has a unique effective name (``default``
when unnamed), a type of ``search`` or ``vectorSearch``, and a definition that can be sent as
written; a definition in the other type's format is refused with the fix named.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from migronaut.declared.issues import Issues
from migronaut.declared.values import check_sendable

__all__ = ["SEARCH_INDEX_KEYS", "DeclaredSearchIndex", "validate_search_indexes"]

SEARCH_INDEX_KEYS = ("name", "type", "definition")
SEARCH_TYPES = ("search", "vectorSearch")
DEFAULT_NAME = "default"


@dataclass(frozen=True)
class DeclaredSearchIndex:
    """One declared search index: ``{name, type, definition}`` with the defaults applied."""

    name: str
    type: str
    definition: Mapping[str, Any] = field(default_factory=dict)


def validate_search_indexes(
    raw: Any, path: str, issues: Issues
) -> tuple[DeclaredSearchIndex, ...]:
    """Check a ``searchIndexes`` list; the normalized indexes that passed."""
    if not isinstance(raw, (list, tuple)):
        issues.add(path, "must be a list of search index definitions")
        return ()
    out: list[DeclaredSearchIndex] = []
    named: dict[str, int] = {}
    for position, item in enumerate(raw):
        where = f"{path}[{position}]"
        index = _search_index(item, where, issues)
        if index is None:
            continue
        if index.name in named:
            unnamed = " (an index without a name is named 'default')" \
                if index.name == DEFAULT_NAME else ""
            issues.add(f"{where}.name", f'"{index.name}" is already the name of '
                       f"{path}[{named[index.name]}]{unnamed}")
            continue
        named[index.name] = position
        out.append(index)
    return tuple(out)


def _search_index(raw: Any, path: str, issues: Issues) -> DeclaredSearchIndex | None:
    if not isinstance(raw, Mapping):
        issues.add(path, "must be a mapping with a definition (and optionally name, type)")
        return None
    before = len(issues.found)
    issues.refuse_unknown(raw, SEARCH_INDEX_KEYS, path,
                          "is not a search index key (expected name, type, definition)")
    name = raw.get("name", DEFAULT_NAME)
    if not isinstance(name, str) or not name:
        issues.add(f"{path}.name", "must be a non-empty string")
    kind = raw.get("type", "search")
    if kind not in SEARCH_TYPES:
        issues.add(f"{path}.type", "must be 'search' or 'vectorSearch'")
    definition = raw.get("definition")
    if not isinstance(definition, Mapping):
        issues.add(f"{path}.definition", "is required and must be a mapping (Atlas's index "
                   "definition)")
    else:
        check_sendable(definition, f"{path}.definition", issues)
        if kind == "search":
            _search_shape(definition, f"{path}.definition", issues)
        elif kind == "vectorSearch":
            _vector_shape(definition, f"{path}.definition", issues)
    if len(issues.found) > before or not isinstance(definition, Mapping):
        return None
    return DeclaredSearchIndex(name=name, type=kind, definition=copy.deepcopy(dict(definition)))


def _search_shape(definition: Mapping[str, Any], path: str, issues: Issues) -> None:
    if "mappings" in definition:
        if not isinstance(definition["mappings"], Mapping):
            issues.add(f"{path}.mappings", "must be a mapping")
    elif "fields" in definition:
        issues.add(path, "has fields but no mappings: a vector index needs "
                   "type: 'vectorSearch'")
    else:
        issues.add(f"{path}.mappings", "is required for a search index (e.g. "
                   "{dynamic: true})")


def _vector_shape(definition: Mapping[str, Any], path: str, issues: Issues) -> None:
    fields = definition.get("fields")
    if "mappings" in definition and "fields" not in definition:
        issues.add(path, "has mappings but no fields: for a search index leave type out or "
                   "set type: 'search'")
        return
    if not isinstance(fields, (list, tuple)) or not fields:
        issues.add(f"{path}.fields", "must be a non-empty list of field definitions")
        return
    seen: dict[tuple[str, str], int] = {}
    kinds: set[str] = set()
    for position, item in enumerate(fields):
        where = f"{path}.fields[{position}]"
        if not isinstance(item, Mapping):
            issues.add(where, "must be a mapping with type and path")
            continue
        kind, field_path = item.get("type"), item.get("path")
        if not isinstance(kind, str) or not kind:
            issues.add(f"{where}.type", "must be a non-empty string")
            continue
        if not isinstance(field_path, str) or not field_path:
            issues.add(f"{where}.path", "must be a non-empty string")
            continue
        if (kind, field_path) in seen:
            issues.add(where, f"repeats {path}.fields[{seen[kind, field_path]}] (same type "
                       "and path)")
            continue
        seen[kind, field_path] = position
        kinds.add(kind)
    if {"vector", "autoEmbed"} <= kinds:
        issues.add(f"{path}.fields", "mixes vector and autoEmbed fields; one index holds one "
                   "kind")
