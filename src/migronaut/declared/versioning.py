"""The ``versioning`` block of a definition: its shape and resolved form (reference §3.2).

Invariant: a block that passes names a usable contract — ``current`` ≥ 1, ``min`` within
0…``current``, two distinct valid system field names — and an unknown key is refused, because a
typo must never mean "not versioned". What converge derives from it (validator rules, the
version index) is built from :class:`VersioningSpec`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from migronaut._values import is_int
from migronaut.declared.issues import Issues

__all__ = ["VersioningSpec", "check_system_field", "validate_versioning"]

#: Definition key → spelling, per source style (Python snake_case, the original's camelCase).
KEYS = {"python": ("current", "min", "field", "revision", "revision_field", "index"),
        "json": ("current", "min", "field", "revision", "revisionField", "index")}


@dataclass(frozen=True)
class VersioningSpec:
    """The resolved block; ``revision_field`` is ``None`` when revisions are off."""

    current: int
    min: int = 1
    field: str = "__v"
    revision: bool = True
    revision_field: str | None = "__rev"
    index: bool = True


def check_system_field(value: Any) -> str | None:
    """Why ``value`` cannot name a field migronaut writes, or ``None``."""
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if len(value) > 64:
        return "must be at most 64 characters"
    if value.startswith("$") or "." in value or "\x00" in value:
        return "must not start with '$' or contain '.' or NUL"
    if value == "_id":
        return "must not be _id"
    return None


def validate_versioning(
    raw: Any, path: str, issues: Issues, *, style: Literal["python", "json"]
) -> VersioningSpec | None:
    """Check a ``versioning`` block written in ``style`` (``python`` or ``json`` keys)."""
    if not isinstance(raw, Mapping):
        issues.add(path, "must be a mapping with at least current")
        return None
    names = KEYS[style]
    revision_key = names[4]
    before = len(issues.found)
    issues.refuse_unknown(raw, names, path,
                          "is not a versioning key (expected " + ", ".join(names) + ")")
    current: Any = raw.get("current")
    if not is_int(current) or current < 1:
        issues.add(f"{path}.current", "is required: an integer ≥ 1 (the version new documents "
                   "are written at)")
        current = None
    low = raw.get("min", 1)
    if not is_int(low) or low < 0 or (isinstance(current, int) and low > current):
        issues.add(f"{path}.min", "must be an integer from 0 to current")
    field = raw.get("field", "__v")
    problem = check_system_field(field)
    if problem:
        issues.add(f"{path}.field", problem)
    revision = raw.get("revision", True)
    if not isinstance(revision, bool):
        issues.add(f"{path}.revision", "must be a boolean")
    revision_field = raw.get(revision_key, "__rev")
    if revision_key in raw and revision is False:
        issues.add(f"{path}.{revision_key}", "is set but revision is false")
    else:
        problem = check_system_field(revision_field)
        if problem:
            issues.add(f"{path}.{revision_key}", problem)
        elif revision_field == field and revision is not False:
            issues.add(f"{path}.{revision_key}", f'must differ from field ("{field}")')
    index = raw.get("index", True)
    if not isinstance(index, bool):
        issues.add(f"{path}.index", "must be a boolean")
    if len(issues.found) > before or current is None:
        return None
    return VersioningSpec(current=current, min=low, field=field, revision=revision,
                          revision_field=revision_field if revision else None, index=index)
