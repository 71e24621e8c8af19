"""Declared indexes: validation and the normalized form the converge planner compares.

An index definition is the driver's flat ``createIndexes`` shape — ``key`` plus options at the
same level, named as MongoDB names them (``expireAfterSeconds``, ``partialFilterExpression``) in
Python and JSON definitions alike. Invariant: every option that reaches :class:`DeclaredIndex` is
one the server stores as sent, so a declared index that exists compares equal to its listing —
unknown options are refused (the driver would drop them silently), ``False`` booleans are never
sent (the server would store them verbatim and then differ), ``background`` is neither sent nor
compared.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from migronaut.declared.canonical import canonical, fill_collation_defaults
from migronaut.declared.issues import Issues
from migronaut.declared.values import check_sendable

__all__ = [
    "DECLARED_ONLY_OPTIONS",
    "INDEX_KEYS",
    "MAX_DECLARED",
    "MAX_INDEXES",
    "SEMANTIC_OPTIONS",
    "DeclaredIndex",
    "default_index_name",
    "normalize_index",
    "server_key",
    "signature",
    "validate_indexes",
]

Direction = int | str
KeyPairs = tuple[tuple[str, Direction], ...]

#: Compared even when not declared (absence means the server default).
SEMANTIC_OPTIONS = ("unique", "sparse", "hidden", "expireAfterSeconds", "partialFilterExpression",
                    "collation", "wildcardProjection", "weights", "default_language",
                    "language_override")
#: Compared only when declared (the server fills in its own values).
DECLARED_ONLY_OPTIONS = ("bits", "min", "max", "storageEngine", "textIndexVersion",
                         "2dsphereIndexVersion")
#: Accepted so a spec copied from ``listIndexes`` validates; never sent, never compared.
IGNORED_OPTIONS = ("background",)
INDEX_KEYS = ("key", "name", *SEMANTIC_OPTIONS, *DECLARED_ONLY_OPTIONS, *IGNORED_OPTIONS)
DIRECTIONS = (1, -1, "text", "hashed", "2d", "2dsphere")
_BOOLEANS = ("unique", "sparse", "hidden", "background")
_OBJECTS = ("partialFilterExpression", "wildcardProjection", "weights", "storageEngine")
_STRINGS = ("default_language", "language_override")
_POSITIVE = ("textIndexVersion", "2dsphereIndexVersion", "bits")
_TEXT_ONLY = ("weights", "default_language", "language_override", "textIndexVersion")
_SAFE_INTEGER = 2**53 - 1
#: MongoDB's limit of indexes per collection (``_id_`` is one), and so what may be declared.
MAX_INDEXES = 64
MAX_DECLARED = MAX_INDEXES - 1
WILDCARD = "$**"


@dataclass(frozen=True)
class DeclaredIndex:
    """One declared index, normalized. ``key`` is in declared order; ``server_key`` is the key
    the server lists (text fields collapsed into ``_fts``/``_ftsx``); ``options`` hold the
    semantic and declared-only options present, without ``False`` booleans."""

    name: str
    key: KeyPairs
    server_key: KeyPairs
    is_text: bool
    options: Mapping[str, Any] = field(default_factory=dict)
    #: Set on the index a ``versioning`` block declares (reference §3.3.2).
    is_version_index: bool = False

    def spec(self) -> dict[str, Any]:
        """The index as sent in ``createIndexes``: ``{key, name, **options}`` (a fresh copy)."""
        return {"key": dict(self.key), "name": self.name, **copy.deepcopy(dict(self.options))}

    def signature(self) -> str:
        """What makes two indexes the same index whatever their names (:func:`signature`)."""
        return signature(self.server_key, self.options)


def default_index_name(key: KeyPairs) -> str:
    """The server's default name: ``field_direction`` pairs joined by ``_`` (``a_1_b_-1``)."""
    return "_".join(f"{name}_{direction}" for name, direction in key)


def server_key(key: KeyPairs) -> KeyPairs:
    """The key as the server stores it: a text index's text fields become ``_fts: 'text',
    _ftsx: 1`` at the position of the first text field."""
    out: list[tuple[str, Direction]] = []
    for name, direction in key:
        if direction == "text":
            if ("_fts", "text") not in out:
                out.extend((("_fts", "text"), ("_ftsx", 1)))
            continue
        out.append((name, direction))
    return tuple(out)


def signature(key: KeyPairs, options: Mapping[str, Any]) -> str:
    """Server key, partial filter and collation (universal defaults filled): two declarations
    with equal signatures are one index to the server, whatever else differs."""
    collation = fill_collation_defaults(options.get("collation"))
    return canonical([[list(pair) for pair in key], options.get("partialFilterExpression"),
                      collation])


def _key_pairs(value: Any, path: str, issues: Issues) -> KeyPairs | None:
    """The key as ordered pairs. Integer-like field names (``"0"``) need no special form, unlike
    in the original (JS objects reorder them): Python dicts keep insertion order and pymongo
    decodes a listed key in server order, so declared and live keys compare field by field."""
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and all(
        isinstance(pair, Sequence) and not isinstance(pair, (str, bytes)) and len(pair) == 2
        for pair in value
    ):  # pymongo's own spelling: [("email", ASCENDING)]
        items = [(pair[0], pair[1]) for pair in value]
    else:
        issues.add(path, "must be a mapping of field → direction (or a list of "
                   "(field, direction) pairs)")
        return None
    if not items:
        issues.add(path, "must name at least one field")
        return None
    pairs: list[tuple[str, Direction]] = []
    seen: set[str] = set()
    for name, direction in items:
        if not isinstance(name, str) or not name:
            issues.add(path, f"field names must be non-empty strings (got {name!r})")
            return None
        if name in seen:
            issues.add(f"{path}.{name}", "is listed twice")
            return None
        seen.add(name)
        normalized = _direction(direction)
        if normalized is None:
            issues.add(f"{path}.{name}", "direction must be one of 1, -1, 'text', 'hashed', "
                       f"'2d', '2dsphere' (got {direction!r})")
            return None
        pairs.append((name, normalized))
    if pairs == [("_id", 1)]:
        issues.add(path, "{_id: 1} is the index every collection has; do not declare it")
        return None
    return tuple(pairs)


def _direction(value: Any) -> Direction | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)) and value in (1, -1):
        return int(value)
    if isinstance(value, str) and value in DIRECTIONS:
        return value
    return None


def _is_integer(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _check_option(name: str, value: Any, path: str, issues: Issues) -> None:
    if name in _BOOLEANS and not isinstance(value, bool):
        issues.add(path, "must be a boolean")
    elif name in _OBJECTS:
        if not isinstance(value, Mapping):
            issues.add(path, "must be a mapping")
        else:
            check_sendable(value, path, issues)
    elif name == "expireAfterSeconds" and not (
        _is_integer(value) and 0 <= value <= _SAFE_INTEGER
    ):
        issues.add(path, "must be a non-negative integer (seconds; 0 is allowed)")
    elif name == "collation":
        locale = value.get("locale") if isinstance(value, Mapping) else None
        if not isinstance(locale, str) or not locale:
            issues.add(path, "must be a mapping with a non-empty string locale")
        else:
            check_sendable(value, path, issues)
    elif name in _STRINGS and not (isinstance(value, str) and value):
        issues.add(path, "must be a non-empty string")
    elif name in _POSITIVE and not (_is_integer(value) and value > 0):
        issues.add(path, "must be a positive integer")
    elif name in ("min", "max") and not (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ):
        issues.add(path, "must be a finite number")


def normalize_index(raw: Any, path: str, issues: Issues) -> DeclaredIndex | None:
    """Check one index definition; the normalized index, or ``None`` with issues added."""
    if not isinstance(raw, Mapping):
        issues.add(path, "must be a mapping with a key (and options)")
        return None
    before = len(issues.found)
    issues.refuse_unknown(raw, INDEX_KEYS, path, "is not a supported index option (expected "
                          + ", ".join(INDEX_KEYS) + ")")
    if "key" not in raw:
        issues.add(f"{path}.key", "is required")
        key = None
    else:
        key = _key_pairs(raw["key"], f"{path}.key", issues)
    name = raw.get("name")
    if "name" in raw and not (isinstance(name, str) and name):
        issues.add(f"{path}.name", "must be a non-empty string")
    elif name == "_id_":
        issues.add(f"{path}.name", "_id_ is the name of the index every collection has")
    for option in INDEX_KEYS[2:]:
        if option in raw:
            _check_option(option, raw[option], f"{path}.{option}", issues)
    if key is None:
        return None
    is_text = any(direction == "text" for _, direction in key)
    for option in _TEXT_ONLY:
        if option in raw and not is_text:
            issues.add(f"{path}.{option}", "is only valid on a text index")
    if "wildcardProjection" in raw and not any(field == WILDCARD for field, _ in key):
        issues.add(f"{path}.wildcardProjection", "is only valid with the all-fields wildcard "
                   "key '$**' (not a path wildcard such as 'a.$**')")
    if len(issues.found) > before:
        return None
    options = {option: copy.deepcopy(raw[option]) for option in SEMANTIC_OPTIONS
               + DECLARED_ONLY_OPTIONS if option in raw and raw[option] is not False}
    if "expireAfterSeconds" in options:
        options["expireAfterSeconds"] = int(options["expireAfterSeconds"])
    return DeclaredIndex(
        name=name if isinstance(name, str) else default_index_name(key),
        key=key, server_key=server_key(key), is_text=is_text, options=options,
    )


def validate_indexes(raw: Any, path: str, issues: Issues) -> tuple[DeclaredIndex, ...]:
    """Check a list of index definitions (at most :data:`MAX_DECLARED`), then the clashes
    between them, each reported on the later index against the earliest it clashes with: a
    shared name, two text indexes, or the same declared signature."""
    if not isinstance(raw, (list, tuple)):
        issues.add(path, "must be a list of index definitions")
        return ()
    if len(raw) > MAX_DECLARED:
        issues.add(path, f"declares {len(raw)} indexes; a collection holds at most "
                   f"{MAX_INDEXES}, _id_ included ({MAX_DECLARED} declared at most)")
        return ()
    indexes: list[tuple[int, DeclaredIndex]] = []
    for position, item in enumerate(raw):
        index = normalize_index(item, f"{path}[{position}]", issues)
        if index is not None:
            indexes.append((position, index))
    # the first earlier index of each name, text-ness and signature: each index meets the
    # earliest one it clashes with in one look-up per rule, not by a walk over all before it
    by_name: dict[str, int] = {}
    by_signature: dict[str, int] = {}
    text: int | None = None
    for later, (position, index) in enumerate(indexes):
        signature_ = index.signature()
        found = [earlier for earlier in (by_name.get(index.name),
                                         text if index.is_text else None,
                                         by_signature.get(signature_)) if earlier is not None]
        if found:
            earlier = min(found)
            clash = _clash(index, indexes[earlier][1], f"{path}[{indexes[earlier][0]}]")
            if clash:
                issues.add(f"{path}[{position}]", clash)
        by_name.setdefault(index.name, later)
        by_signature.setdefault(signature_, later)
        if index.is_text and text is None:
            text = later
    return tuple(index for _, index in indexes)


def _clash(index: DeclaredIndex, other: DeclaredIndex, where: str) -> str | None:
    if index.name == other.name:
        return f'has the same name "{index.name}" as {where}'
    if index.is_text and other.is_text:
        return f"is a second text index ({where} is one; a collection holds at most one)"
    if index.signature() == other.signature():
        return f"declares the same index as {where} (same key, partial filter and collation)"
    return None
