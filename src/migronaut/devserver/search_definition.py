"""Which search index definitions the dev server's ``--search`` mode builds, and which FAIL.

Atlas accepts a ``createSearchIndexes``/``updateSearchIndex`` whose command is well formed and
then builds the definition in the background; a definition it cannot build ends ``FAILED`` with a
message. :func:`definition_problem` says what such a build would fail on — a subset of Atlas's own
rules, enough to be stricter than migronaut's declaration checks (``migronaut.declared.search``),
so the ``FAILED`` path can be reached over the wire: unknown definition keys, field mapping types,
analyzers, and the vector field attributes Atlas requires (``numDimensions``, ``similarity``).
Options inside a field mapping are not checked (Atlas adds its own, see reference §7.3).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from migronaut._values import is_int

__all__ = ["definition_problem"]

_SEARCH_KEYS: Final = frozenset({
    "analyzer", "searchAnalyzer", "mappings", "analyzers", "synonyms", "storedSource",
    "numPartitions", "typeSets", "sort",
})
_VECTOR_KEYS: Final = frozenset({"fields", "storedSource"})
_FIELD_TYPES: Final = (
    "autocomplete", "boolean", "date", "dateFacet", "document", "embeddedDocuments", "geo",
    "knnVector", "number", "numberFacet", "objectId", "string", "stringFacet", "token", "uuid",
)
_VECTOR_FIELD_TYPES: Final = ("vector", "filter", "autoEmbed")
_SIMILARITIES: Final = ("euclidean", "cosine", "dotProduct")
_QUANTIZATIONS: Final = ("none", "scalar", "binary")
_MAX_DIMENSIONS: Final = 8192


class _Problem(Exception):
    """The first reason the definition cannot be built."""


def definition_problem(kind: Any, definition: Mapping[str, Any]) -> str | None:
    """Why Atlas would fail to build ``definition`` as a ``kind`` index; ``None`` if it builds."""
    try:
        if kind == "search":
            _search(definition)
        elif kind == "vectorSearch":
            _vector(definition)
        else:
            raise _Problem(f'"type" must be one of [search, vectorSearch] (got {kind!r})')
    except _Problem as problem:
        return f"Invalid index definition: {problem}"
    return None


def _one_of(value: Any, allowed: tuple[str, ...], path: str) -> None:
    if value not in allowed:
        raise _Problem(f'"{path}" must be one of [{", ".join(allowed)}]')


def _only(definition: Mapping[str, Any], allowed: frozenset[str], prefix: str = "") -> None:
    for key in definition:
        if key not in allowed:
            raise _Problem(f'"{prefix}{key}" is not allowed')


def _search(definition: Mapping[str, Any]) -> None:
    if "mappings" not in definition and "fields" in definition:
        raise _Problem('"mappings" is required ("fields" is the format of a vectorSearch index)')
    _only(definition, _SEARCH_KEYS)
    mappings = definition.get("mappings")
    if not isinstance(mappings, Mapping):
        raise _Problem('"mappings" is required and must be an object')
    custom = [entry.get("name") for entry in definition.get("analyzers") or []
              if isinstance(entry, Mapping)]
    for key in ("analyzer", "searchAnalyzer"):
        _analyzer(definition.get(key), key, custom)
    dynamic = mappings.get("dynamic", False)
    if not isinstance(dynamic, (bool, Mapping)):
        raise _Problem('"mappings.dynamic" must be a boolean or an object')
    _fields(mappings.get("fields", {}), "mappings.fields", custom)


def _analyzer(name: Any, path: str, custom: list[Any]) -> None:
    if name is None or (isinstance(name, str) and (name.startswith("lucene.") or name in custom)):
        return
    raise _Problem(f'"{path}" names an analyzer that does not exist: {name!r}')


def _fields(fields: Any, path: str, custom: list[Any]) -> None:
    if not isinstance(fields, Mapping):
        raise _Problem(f'"{path}" must be an object')
    for name, mapping in fields.items():
        for one in mapping if isinstance(mapping, list) else [mapping]:
            _field(one, f"{path}.{name}", custom)


def _field(mapping: Any, path: str, custom: list[Any]) -> None:
    if not isinstance(mapping, Mapping):
        raise _Problem(f'"{path}" must be an object')
    _one_of(mapping.get("type"), _FIELD_TYPES, f"{path}.type")
    for key in ("analyzer", "searchAnalyzer"):
        _analyzer(mapping.get(key), f"{path}.{key}", custom)
    if mapping["type"] in ("document", "embeddedDocuments"):
        _fields(mapping.get("fields", {}), f"{path}.fields", custom)
    if "multi" in mapping:
        _fields(mapping["multi"], f"{path}.multi", custom)


def _vector(definition: Mapping[str, Any]) -> None:
    if "mappings" in definition and "fields" not in definition:
        raise _Problem('"fields" is required ("mappings" is the format of a search index)')
    _only(definition, _VECTOR_KEYS)
    fields = definition.get("fields")
    if not isinstance(fields, list) or not fields:
        raise _Problem('"fields" must be a non-empty array')
    paths: set[str] = set()
    for position, field in enumerate(fields):
        where = f"fields[{position}]"
        if not isinstance(field, Mapping):
            raise _Problem(f'"{where}" must be an object')
        _one_of(field.get("type"), _VECTOR_FIELD_TYPES, f"{where}.type")
        path = field.get("path")
        if not isinstance(path, str) or not path:
            raise _Problem(f'"{where}.path" is required and must be a non-empty string')
        if path in paths:
            raise _Problem(f'"{where}.path" repeats the path {path!r}')
        paths.add(path)
        if field["type"] == "vector":
            _vector_field(field, where)
        elif field["type"] == "autoEmbed" and not (
                isinstance(field.get("model"), str) and field["model"]):
            raise _Problem(f'"{where}.model" is required for an autoEmbed field')


def _vector_field(field: Mapping[str, Any], where: str) -> None:
    dimensions = field.get("numDimensions")
    if not is_int(dimensions) or \
            not 1 <= dimensions <= _MAX_DIMENSIONS:
        raise _Problem(f'"{where}.numDimensions" is required and must be an integer from 1 to '
                       f"{_MAX_DIMENSIONS}")
    _one_of(field.get("similarity"), _SIMILARITIES, f"{where}.similarity")
    if "quantization" in field:
        _one_of(field["quantization"], _QUANTIZATIONS, f"{where}.quantization")
