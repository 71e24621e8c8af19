"""Comparing a declared search index with its live counterpart (reference collections §7.3).

Atlas fills its own defaults into a definition, and may add options of its own. So both sides
are first expanded to their *effective* form (defaults filled on both sides, type lists and
vector fields treated as sets); then any option only the server has is dropped from the live
side before comparing — only inside option objects, never a field, a mapping type, a vector field
or a list the server has on its own. The dropped dotted paths are returned as ``ignored``.

Cost of that tolerance, by design: deleting such an option from a declaration goes unnoticed.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from migronaut.declared.canonical import canonical

__all__ = ["PATH_LIMIT", "SearchDiff", "compare_definitions", "effective_definition"]

#: How many differing dotted paths a comparison lists (the rest are counted in ``more``).
PATH_LIMIT = 5

_SEARCH_TOP: dict[str, Any] = {"analyzer": "lucene.standard", "storedSource": False,
                               "numPartitions": 1, "analyzers": [], "synonyms": []}
_FIELD_DEFAULTS: dict[str, dict[str, Any]] = {
    "string": {"indexOptions": "offsets", "store": True, "norms": "include"},
    "number": {"representation": "double", "indexIntegers": True, "indexDoubles": True},
    "numberFacet": {"representation": "double", "indexIntegers": True, "indexDoubles": True},
    "autocomplete": {"minGrams": 2, "maxGrams": 15, "foldDiacritics": True,
                     "tokenization": "edgeGram"},
    "token": {"normalization": "none"},
    "geo": {"indexShapes": False},
    "document": {"dynamic": False, "fields": {}},
    "embeddedDocuments": {"dynamic": False, "fields": {}},
}
_VECTOR_DEFAULTS: dict[str, dict[str, Any]] = {
    "vector": {"quantization": "none", "indexingMethod": "hnsw"},
    "autoEmbed": {"numDimensions": 1024, "quantization": "scalar", "indexingMethod": "hnsw"},
}
_HNSW = {"maxEdges": 16, "numEdgeCandidates": 100}
_AUTO_EMBED_FIXED = ("model", "numDimensions", "quantization", "modality")


@dataclass(frozen=True)
class SearchDiff:
    """What differs: top-level ``diffs`` (``('type',)`` for a type change), the first
    :data:`PATH_LIMIT` dotted ``paths`` and how many ``more``, the server-only options
    ``ignored``, and the ``immutable`` autoEmbed changes (a vector index cannot take them)."""

    diffs: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    more: int = 0
    ignored: tuple[str, ...] = ()
    immutable: tuple[str, ...] = ()


# ------------------------------------------------------------------------- effective form


def _field(mapping: Any) -> Any:
    """A search field mapping (or a list of them, a set) with Atlas's defaults filled."""
    if isinstance(mapping, list):
        return sorted((_field(item) for item in mapping), key=canonical)
    if not isinstance(mapping, Mapping):
        return mapping
    filled = {**_FIELD_DEFAULTS.get(str(mapping.get("type")), {}), **mapping}
    for key in ("fields", "multi"):
        if isinstance(filled.get(key), Mapping):
            filled[key] = {name: _field(sub) for name, sub in filled[key].items()}
    return filled


def _vector_field(entry: Any) -> Any:
    if not isinstance(entry, Mapping):
        return entry
    filled = {**_VECTOR_DEFAULTS.get(str(entry.get("type")), {}), **entry}
    if filled.get("indexingMethod") == "hnsw" and filled.get("type") in _VECTOR_DEFAULTS:
        options = filled.get("hnswOptions")
        filled["hnswOptions"] = {**_HNSW, **(options if isinstance(options, Mapping) else {})}
    return filled


def _vector_key(entry: Any) -> tuple[str, str, str]:
    if isinstance(entry, Mapping):
        return str(entry.get("type")), str(entry.get("path")), canonical(entry)
    return "", "", canonical(entry)


def effective_definition(kind: str, definition: Mapping[str, Any]) -> dict[str, Any]:
    """``definition`` as Atlas holds it: its defaults filled, sets sorted (§7.3 step 2)."""
    if kind == "vectorSearch":
        filled: dict[str, Any] = {"storedSource": False, **copy.deepcopy(dict(definition))}
        if isinstance(filled.get("fields"), list):
            filled["fields"] = [_vector_field(entry) for entry in filled["fields"]]
        return filled
    filled = {**_SEARCH_TOP, **copy.deepcopy(dict(definition))}
    filled.setdefault("searchAnalyzer", filled["analyzer"])
    mappings = filled.get("mappings")
    if isinstance(mappings, Mapping):
        mappings = {"dynamic": False, "fields": {}, **mappings}
        if isinstance(mappings["fields"], Mapping):
            mappings["fields"] = {name: _field(sub) for name, sub in mappings["fields"].items()}
        filled["mappings"] = mappings
    return filled


# ------------------------------------------------------------------ server-only options


def _trim(declared: Any, live: Any, path: str, ignored: list[str],
          nested: tuple[str, ...] = ()) -> Any:
    """``live`` without the options ``declared`` does not set; ``nested`` names the keys
    holding named field mappings, recursed into by name (never trimmed themselves)."""
    if not isinstance(declared, Mapping) or not isinstance(live, Mapping):
        return live
    kept: dict[str, Any] = {}
    for key, value in live.items():
        where = f"{path}.{key}" if path else key
        if key not in declared:
            ignored.append(where)
        elif key in nested and isinstance(value, Mapping) \
                and isinstance(declared[key], Mapping):
            kept[key] = {name: _trim_field(declared[key].get(name), sub, f"{where}.{name}",
                                           ignored) for name, sub in value.items()}
        else:
            kept[key] = value
    return kept


def _trim_field(declared: Any, live: Any, path: str, ignored: list[str]) -> Any:
    """A field mapping (or list of them): trimmed against the declared one of the same type."""
    if isinstance(declared, list) and isinstance(live, list):
        pool = [item for item in declared if isinstance(item, Mapping)]
        out = []
        for i, item in enumerate(live):
            match = next((d for d in pool if isinstance(item, Mapping)
                          and d.get("type") == item.get("type")), None)
            if match is None:
                out.append(item)
                continue
            pool.remove(match)
            out.append(_trim_field(match, item, f"{path}[{i}]", ignored))
        return out
    if not isinstance(declared, Mapping) or not isinstance(live, Mapping) \
            or declared.get("type") != live.get("type"):
        return live
    return _trim(declared, live, path, ignored, nested=("fields", "multi"))


def _tolerate(kind: str, declared: dict[str, Any], live: dict[str, Any]
              ) -> tuple[dict[str, Any], list[str]]:
    """The live side without server-only options, and their dotted paths (§7.3 step 3)."""
    ignored: list[str] = []
    trimmed = _trim(declared, live, "", ignored)
    if kind == "vectorSearch":
        fields = trimmed.get("fields")
        mine = declared.get("fields")
        if isinstance(fields, list) and isinstance(mine, list):
            paired = {(e.get("type"), e.get("path")): e for e in mine if isinstance(e, Mapping)}
            out = []
            for entry in fields:
                match = paired.get((entry.get("type"), entry.get("path"))) \
                    if isinstance(entry, Mapping) else None
                if match is None:
                    out.append(entry)
                    continue
                where = f"fields[{entry.get('type')}:{entry.get('path')}]"
                entry = _trim(match, entry, where, ignored)
                if isinstance(entry.get("hnswOptions"), Mapping):
                    entry["hnswOptions"] = _trim(match.get("hnswOptions"), entry["hnswOptions"],
                                                 f"{where}.hnswOptions", ignored)
                out.append(entry)
            trimmed["fields"] = out
    elif isinstance(trimmed.get("mappings"), Mapping):
        trimmed["mappings"] = _trim(declared.get("mappings"), trimmed["mappings"], "mappings",
                                    ignored, nested=("fields",))
    return trimmed, ignored


# ------------------------------------------------------------------------------ diffing


def _paths(left: Any, right: Any, path: str, out: list[str]) -> None:
    """Every dotted path where ``left`` and ``right`` differ, depth first."""
    if canonical(left) == canonical(right):
        return
    if isinstance(left, Mapping) and isinstance(right, Mapping):
        for key in sorted(set(left) | set(right)):
            _paths(left.get(key), right.get(key), f"{path}.{key}" if path else key, out)
    elif isinstance(left, list) and isinstance(right, list) and len(left) == len(right):
        for i, (a, b) in enumerate(zip(left, right, strict=True)):
            _paths(a, b, f"{path}[{i}]", out)
    else:
        out.append(path)


def _immutable(declared: Mapping[str, Any], live: Mapping[str, Any]) -> tuple[str, ...]:
    """autoEmbed changes a vector index cannot take in place (§7.3 step 5)."""
    def embedded(definition: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
        fields = definition.get("fields")
        return {str(e.get("path")): e for e in fields if isinstance(e, Mapping)
                and e.get("type") in ("vector", "autoEmbed")} if isinstance(fields, list) else {}

    mine, theirs = embedded(declared), embedded(live)
    found: list[str] = []
    switched = {path for path in set(mine) & set(theirs)
                if mine[path].get("type") != theirs[path].get("type")}
    found.extend(f"{path}.type" for path in sorted(switched))
    auto_mine = {p for p, e in mine.items() if e.get("type") == "autoEmbed"} - switched
    auto_theirs = {p for p, e in theirs.items() if e.get("type") == "autoEmbed"} - switched
    if auto_mine != auto_theirs:
        found.append("path")
    for path in sorted(auto_mine & auto_theirs):
        found.extend(f"{path}.{attr}" for attr in _AUTO_EMBED_FIXED
                     if canonical(mine[path].get(attr)) != canonical(theirs[path].get(attr)))
    return tuple(found)


def _sets(kind: str, definition: dict[str, Any]) -> dict[str, Any]:
    if kind == "vectorSearch" and isinstance(definition.get("fields"), list):
        definition["fields"] = sorted(definition["fields"], key=_vector_key)
    return definition


def compare_definitions(kind: str, definition: Mapping[str, Any], live_kind: str,
                        live_definition: Mapping[str, Any]) -> SearchDiff:
    """Compare a declared ``(kind, definition)`` with the live one (§7.3 steps 1–5)."""
    if kind != live_kind:
        return SearchDiff(diffs=("type",), paths=("type",))
    mine = effective_definition(kind, definition)
    theirs, ignored = _tolerate(kind, mine, effective_definition(kind, live_definition))
    mine, theirs = _sets(kind, mine), _sets(kind, theirs)
    diffs = tuple(key for key in sorted(set(mine) | set(theirs))
                  if canonical(mine.get(key)) != canonical(theirs.get(key)))
    if not diffs:
        return SearchDiff(ignored=tuple(ignored))
    paths: list[str] = []
    _paths(mine, theirs, "", paths)
    immutable = _immutable(mine, theirs) if kind == "vectorSearch" else ()
    return SearchDiff(diffs=diffs, paths=tuple(paths[:PATH_LIMIT]),
                      more=max(0, len(paths) - PATH_LIMIT), ignored=tuple(ignored),
                      immutable=immutable)
