"""The two numbers of the versioning contract as stored in a document (reference §3.1).

Invariant: a missing or ``None`` field reads as 0 — legacy documents are version 0, revision 0 —
and a present value that is not a non-negative safe integer is *invalid*, never guessed at. The
filters here are the only spelling of "exactly N" and "below N" the library sends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from migronaut.declared.versioning import check_system_field
from migronaut.errors import ConfigInvalidError, ShapeVersionError

__all__ = [
    "DEFAULT_FIELD",
    "DEFAULT_REVISION_FIELD",
    "INVALID",
    "MAX_SAFE",
    "as_count",
    "check_field_names",
    "exact_filter",
    "is_version",
    "read_count",
    "revision_of",
    "version_of",
]

DEFAULT_FIELD = "__v"
DEFAULT_REVISION_FIELD = "__rev"
#: The largest integer every driver (and the original's JavaScript) reads exactly.
MAX_SAFE = 2**53 - 1


def as_count(value: Any) -> int | None:
    """``value`` as a non-negative safe integer (int, Int64 or an integral float), else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not value.is_integer():
            return None
        value = int(value)
    if isinstance(value, int) and 0 <= value <= MAX_SAFE:
        return int(value)
    return None


class _Invalid:
    """Marks a present field whose value is not a count."""


INVALID = _Invalid()


def read_count(doc: Mapping[str, Any], field: str) -> int | _Invalid:
    """The stored count under ``field``: 0 when missing or ``None``, :data:`INVALID` otherwise
    when it is not a non-negative safe integer."""
    value = doc.get(field)
    if value is None:
        return 0
    count = as_count(value)
    return INVALID if count is None else count


def is_version(doc: Mapping[str, Any], version: int, *, field: str = DEFAULT_FIELD) -> bool:
    """Whether ``doc`` is at shape ``version`` (missing/``None`` = 0; an invalid value = no)."""
    return isinstance(doc, Mapping) and read_count(doc, field) == version


def version_of(
    doc: Any, field: str, current: int, collection: str | None = None
) -> int:
    """The shape version of ``doc`` (0 when missing); an invalid one raises
    :class:`ShapeVersionError` ``invalid``, because guessing would upgrade the wrong shape."""
    context: dict[str, Any] = {"reason": "invalid", "current": current}
    if collection is not None:
        context["collection"] = collection
    if not isinstance(doc, Mapping):
        raise ShapeVersionError(f"Not a document: {type(doc).__name__}", context)
    version = read_count(doc, field)
    if isinstance(version, _Invalid):
        context["version"] = _shown(doc.get(field))
        where = f" in {collection}" if collection else ""
        raise ShapeVersionError(f"Invalid shape version {doc.get(field)!r} in field "
                                f"{field!r}{where}", context)
    return version


def _shown(value: Any) -> Any:
    """A JSON-safe stand-in for a stored value in an error context."""
    return value if isinstance(value, (int, float, str)) else repr(value)


def revision_of(doc: Mapping[str, Any], revision_field: str = DEFAULT_REVISION_FIELD) -> int:
    """The revision to pass as ``expected_revision`` for a loaded ``doc`` (0 when missing); an
    invalid stored revision is a ``CONFIG_INVALID`` — no guard can match it."""
    value = read_count(doc, revision_field)
    if isinstance(value, _Invalid):
        raise ConfigInvalidError(f"Invalid revision {doc.get(revision_field)!r} in field "
                                 f"{revision_field!r}", {"field": revision_field})
    return value


def exact_filter(field: str, value: int) -> dict[str, Any]:
    """The filter for "exactly ``value``": 0 also matches a missing or ``None`` field.

    An array never matches: a query on a field matches an array holding the value
    (``[0, 5]`` would pass for 5, ``[None]`` for 0), and an array is no count."""
    match = {"$in": [None, 0]} if value == 0 else {"$eq": value}
    return {field: {**match, "$not": {"$type": "array"}}}


def check_field_names(field: str | None, revision_field: str | None) -> None:
    """Refuse custom field names the contract cannot use, before anything is sent."""
    for key, value in (("field", field), ("revision_field", revision_field)):
        if value is None:
            continue
        problem = check_system_field(value)
        if problem:
            raise ConfigInvalidError(f"Invalid {key} {value!r}: {problem}",
                                     {"issues": [{"path": key, "message": problem}]})
    if field is not None and field == revision_field:
        raise ConfigInvalidError(f"revision_field must differ from field ({field!r})",
                                 {"issues": [{"path": "revision_field",
                                              "message": "must differ from field"}]})
