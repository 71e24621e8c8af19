"""One collection definition: its keys, its rules, and the normalized model.

A definition is written with Python keys (``search_indexes``, ``validation_level``) inline and in
``.py`` files, or with the original's keys (``searchIndexes``, ``validationLevel``) in ``.json``
files, so a Node project's JSON definitions load unchanged. Index options and search definitions
keep MongoDB's and Atlas's own names in both. Invariant: a :class:`CollectionDefinition` exists
only for a definition with no issue; every issue is gathered with its path, none stops the check.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from migronaut._names import OWN_PREFIX
from migronaut._suggest import suggest
from migronaut.declared.indexes import (
    MAX_DECLARED,
    MAX_INDEXES,
    DeclaredIndex,
    validate_indexes,
)
from migronaut.declared.issues import Issues
from migronaut.declared.search import DeclaredSearchIndex, validate_search_indexes
from migronaut.declared.values import check_sendable
from migronaut.declared.versioning import VersioningSpec, validate_versioning

__all__ = [
    "DEFINITION_KEYS",
    "MAX_DEPTH",
    "TOO_DEEP",
    "VALIDATION_ACTIONS",
    "VALIDATION_LEVELS",
    "CollectionDefinition",
    "Style",
    "collection_name_problem",
    "module_definition",
    "validate_definition",
]

Style = Literal["python", "json"]
#: Internal (Python) name → the key as written in each style.
DEFINITION_KEYS: dict[Style, dict[str, str]] = {
    "python": {key: key for key in (
        "name", "indexes", "search_indexes", "validator", "validation_level",
        "validation_action", "prune", "versioning")},
    "json": {"name": "name", "indexes": "indexes", "search_indexes": "searchIndexes",
             "validator": "validator", "validation_level": "validationLevel",
             "validation_action": "validationAction", "prune": "prune",
             "versioning": "versioning"},
}
#: The most levels of nesting MongoDB stores in a document; a definition nested deeper cannot
#: be sent, and checking it would recurse past Python's limit.
MAX_DEPTH = 100
TOO_DEEP = f"MongoDB stores at most {MAX_DEPTH} levels of nesting"
VALIDATION_LEVELS = ("off", "strict", "moderate")
VALIDATION_ACTIONS = ("error", "warn", "errorAndLog")


@dataclass(frozen=True)
class CollectionDefinition:
    """A validated definition. ``None`` means "not managed": ``indexes``/``search_indexes``
    omitted, or no validator declared (``manages_validator`` False). A declared ``validator``
    of ``None``/``{}`` means "there must be no validator" (``validator`` None, managed)."""

    name: str
    #: Where it was declared: ``collections[0]`` or a file name (for duplicate messages).
    source: str
    indexes: tuple[DeclaredIndex, ...] | None = None
    search_indexes: tuple[DeclaredSearchIndex, ...] | None = None
    manages_validator: bool = False
    validator: Mapping[str, Any] | None = None
    validation_level: str | None = None
    validation_action: str | None = None
    prune: bool | None = None
    versioning: VersioningSpec | None = None


def collection_name_problem(name: Any, reserved: Collection[str]) -> str | None:
    """Why ``name`` cannot be a declared collection, or ``None``."""
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    if "$" in name or "\x00" in name:
        return "must not contain '$' or NUL"
    if name.startswith("system."):
        return "must not start with 'system.'"
    if name.startswith(".") or name.endswith(".") or ".." in name:
        return "must not start or end with '.' or contain '..'"
    if name in reserved or name.startswith(OWN_PREFIX):
        return f'"{name}" is one of migronaut\'s own collections and cannot be declared'
    return None


#: Values that are never containers, told apart before the slower ``Mapping`` check.
_SCALARS = (str, int, float, bool, bytes, type(None))


def too_deep(raw: Any, base: str) -> str | None:
    """The path of the first value nested deeper than :data:`MAX_DEPTH` levels in ``raw``, or
    ``None`` — found without recursion, in one pass over the containers (a circular structure
    is left to the value checks)."""
    Link = tuple[Any, Any, bool] | None  # (parent link, key, key is a list position)
    active: set[int] = set()
    stack: list[tuple[bool, Any, int, Link]] = [(True, raw, 1, None)]
    while stack:
        entering, value, depth, link = stack.pop()
        if not entering:
            active.discard(id(value))
            continue
        if depth > MAX_DEPTH:
            return _link_path(base, link)
        if id(value) in active:
            continue
        active.add(id(value))
        stack.append((False, value, depth, link))
        positional = isinstance(value, (list, tuple))
        for key, item in enumerate(value) if positional else value.items():
            if isinstance(item, (dict, list, tuple)) or (
                    not isinstance(item, _SCALARS) and isinstance(item, Mapping)):
                stack.append((True, item, depth + 1, (link, key, positional)))
    return None


def _link_path(base: str, link: tuple[Any, Any, bool] | None) -> str:
    parts: list[str] = []
    while link is not None:
        link, key, positional = link
        parts.append(f"[{key}]" if positional else f".{key}")
    path = base + "".join(reversed(parts))
    return path[1:] if not base and path.startswith(".") else path


def _join(base: str, key: str) -> str:
    return f"{base}.{key}" if base else key


def validate_definition(
    raw: Any,
    issues: Issues,
    *,
    base: str = "",
    style: Style = "python",
    source: str = "",
    fallback_name: str | None = None,
    reserved: Collection[str] = (),
) -> CollectionDefinition | None:
    """Check one definition; ``base`` prefixes paths (``collections[2]``), ``fallback_name`` is
    the name a file gives when the definition sets none. ``None`` when there was any issue."""
    if not isinstance(raw, Mapping):
        issues.add(base, f"must be a mapping (got {type(raw).__name__})")
        return None
    deep = too_deep(raw, base)
    if deep is not None:
        issues.add(deep, f"is nested too deeply ({TOO_DEEP})")
        return None
    keys = DEFINITION_KEYS[style]
    spelled = {written: internal for internal, written in keys.items()}
    before = len(issues.found)
    for key in raw:
        if key not in spelled:
            issues.add(_join(base, str(key)), _unknown_key(key, style))
    values = {spelled[key]: value for key, value in raw.items() if key in spelled}

    name = _name(values, issues, base, keys, fallback_name, reserved)
    versioning = None
    if "versioning" in values:
        versioning = validate_versioning(values["versioning"], _join(base, keys["versioning"]),
                                         issues, style=style)
    indexes = None
    if "indexes" in values:
        indexes = validate_indexes(values["indexes"], _join(base, "indexes"), issues)
    search = None
    if "search_indexes" in values:
        search = validate_search_indexes(values["search_indexes"],
                                         _join(base, keys["search_indexes"]), issues)
    validator = _validator(values, issues, base, keys)
    prune = values.get("prune")
    if "prune" in values and not isinstance(prune, bool):
        issues.add(_join(base, "prune"), "must be a boolean")
    has_rules = validator is not None or "versioning" in values
    for internal, choices in (("validation_level", VALIDATION_LEVELS),
                              ("validation_action", VALIDATION_ACTIONS)):
        if internal not in values:
            continue
        path = _join(base, keys[internal])
        if values[internal] not in choices:
            issues.add(path, "must be one of " + ", ".join(repr(c) for c in choices))
        elif not has_rules:
            issues.add(path, "has no effect without a validator (or versioning)")
    if not any(key in values for key in ("indexes", "search_indexes", "validator",
                                         "versioning")):
        issues.add(base, "has nothing to manage: declare indexes, "
                   f"{keys['search_indexes']}, validator or versioning")
    if versioning is not None:
        _check_versioning_overlap(versioning, values, indexes, issues, base, keys)
    if len(issues.found) > before or name is None:
        return None
    return CollectionDefinition(
        name=name, source=source or base, indexes=indexes, search_indexes=search,
        manages_validator="validator" in values, validator=validator,
        validation_level=values.get("validation_level"),
        validation_action=values.get("validation_action"), prune=prune, versioning=versioning,
    )


def _unknown_key(key: Any, style: Style) -> str:
    expected = list(DEFINITION_KEYS[style].values())
    other: Style = "json" if style == "python" else "python"
    hint = None
    for internal, written in DEFINITION_KEYS[other].items():
        if key == written:
            hint = DEFINITION_KEYS[style][internal]
    if hint is None:
        hint = suggest(str(key), expected)
    suggestion = f" — did you mean '{hint}'?" if hint else ""
    return ("is not a definition key (expected one of " + ", ".join(expected) + ")"
            + suggestion)


def _name(
    values: Mapping[str, Any], issues: Issues, base: str, keys: Mapping[str, str],
    fallback: str | None, reserved: Collection[str],
) -> str | None:
    if "name" in values:
        name = values["name"]
        problem = collection_name_problem(name, reserved)
        if problem:
            issues.add(_join(base, "name"), problem)
            return None
        return str(name)
    if fallback is None:
        issues.add(_join(base, "name"), "is required")
        return None
    problem = collection_name_problem(fallback, reserved)
    if problem:
        issues.add(_join(base, "name"), f"the file name gives {fallback!r}, which {problem}; "
                   "set name explicitly in the definition")
        return None
    return fallback


def _validator(
    values: Mapping[str, Any], issues: Issues, base: str, keys: Mapping[str, str]
) -> dict[str, Any] | None:
    """The declared validator, ``None`` for none (or when not declared, or invalid)."""
    if "validator" not in values or values["validator"] is None:
        return None
    validator = values["validator"]
    path = _join(base, "validator")
    if not isinstance(validator, Mapping):
        issues.add(path, "must be a mapping (a query document or {$jsonSchema: …}) or None")
        return None
    check_sendable(validator, path, issues)
    return copy.deepcopy(dict(validator)) if validator else None


def _check_versioning_overlap(
    versioning: VersioningSpec, values: Mapping[str, Any],
    indexes: tuple[DeclaredIndex, ...] | None, issues: Issues, base: str,
    keys: Mapping[str, str],
) -> None:
    """The rules §3.3 puts on a versioned definition: the validator may not remove or
    contradict the version rules, and the version index may not be declared twice."""
    managed = [versioning.field] + ([versioning.revision_field]
                                    if versioning.revision_field else [])
    path = _join(base, "validator")
    if "validator" in values and values["validator"] is None:
        issues.add(path, "cannot be None on a versioned collection (it would remove the "
                   "version rules); leave validator out or declare your own rules")
    validator = values.get("validator")
    if isinstance(validator, Mapping) and validator:
        for key in validator:
            if key in managed:
                issues.add(f"{path}.{key}", "is managed by versioning; remove this rule")
        schema = validator.get("$jsonSchema")
        if "$jsonSchema" in validator and not isinstance(schema, Mapping):
            issues.add(f"{path}.$jsonSchema", "must be a mapping")
        elif isinstance(schema, Mapping):
            required = schema.get("required")
            if "required" in schema and not isinstance(required, (list, tuple)):
                issues.add(f"{path}.$jsonSchema.required", "must be a list")
            elif required:
                for field in managed:
                    if field in required:
                        issues.add(f"{path}.$jsonSchema.required", f'lists "{field}", which '
                                   "versioning manages; remove it")
            properties = schema.get("properties")
            if isinstance(properties, Mapping):
                for field in managed:
                    if field in properties:
                        issues.add(f"{path}.$jsonSchema.properties.{field}",
                                   "is managed by versioning; remove this rule")
    if versioning.index and indexes is not None and len(indexes) >= MAX_DECLARED:
        issues.add(_join(base, "indexes"), f"declares {len(indexes)} indexes and versioning "
                   f"one more; a collection holds at most {MAX_INDEXES}, _id_ included")
    if versioning.index and indexes and len(indexes) == len(values["indexes"]):
        version_key = ((versioning.field, 1), ("_id", 1))
        for position, index in enumerate(indexes):
            if index.key == version_key:
                issues.add(f"{_join(base, 'indexes')}[{position}].key",
                           "is the version index versioning declares; remove it or set "
                           f"{keys['versioning']}.index to false")


_CONSTANT = re.compile(r"^[A-Z][A-Z0-9_]*$")


def module_definition(module: ModuleType, issues: Issues) -> dict[str, Any] | None:
    """The definition a ``.py`` file exports: its public lower-case module-level names, minus
    imports. A function or class defined in the file is refused."""
    out: dict[str, Any] = {}
    for key, value in vars(module).items():
        if key.startswith("_") or _CONSTANT.match(key) or isinstance(value, ModuleType):
            continue
        if callable(value) and getattr(value, "__module__", None) != module.__name__:
            continue  # imported: from bson import Regex
        if callable(value):
            kind = "class" if isinstance(value, type) else "function"
            issues.add(key, f"is a {kind}: a definition file holds data (indexes = [...], "
                       "validator = {...}), not a model or code — prefix helpers with _")
            continue
        out[key] = value
    return out if not issues else None
