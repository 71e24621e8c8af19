"""Optimistic-concurrency writes, prepared and judged without I/O (reference §3.4.2).

A :class:`GuardedWrite` is everything a guarded writer sends — the caller's filter plus the
revision guard, the stamped update or replacement, the driver options — built only after every
refusal has passed, so a refused write sends nothing. The sync and async writers
(:mod:`.writers`) only add the I/O: one write, and on a miss one re-read to name the reason.
Invariant: the filter is never put into an error (it may hold personal data).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bson import Regex

from migronaut._values import is_int
from migronaut.errors import ConfigInvalidError, RevisionConflictError
from migronaut.versioning.fields import (
    DEFAULT_FIELD,
    DEFAULT_REVISION_FIELD,
    INVALID,
    MAX_SAFE,
    as_count,
    check_field_names,
    exact_filter,
    read_count,
)
from migronaut.versioning.updates import (
    WHOLE_DOCUMENT_STAGES,
    refuse,
    stamp_update,
    update_kind,
    writes_field,
)

__all__ = ["GuardedWrite", "RevisionResult", "prepare_replace", "prepare_update"]

#: Driver options the verifying re-read reuses, so it sees what the write saw.
READ_OPTIONS = ("session", "collation", "hint", "let")


@dataclass(frozen=True)
class RevisionResult:
    """What a guarded ``update``/``replace`` returns: the driver's result and the revision the
    document now has (expected + 1)."""

    revision: int
    matched_count: int
    modified_count: int
    raw: Any = field(repr=False, compare=False)


@dataclass(frozen=True)
class GuardedWrite:
    """One prepared guarded write (see the module docstring)."""

    collection: Any
    caller_filter: Mapping[str, Any]
    filter: dict[str, Any]
    document: Any
    expected: int
    revision_field: str
    verify: bool
    options: dict[str, Any]

    @property
    def revision(self) -> int:
        return self.expected + 1

    @property
    def read_options(self) -> dict[str, Any]:
        return {key: self.options[key] for key in READ_OPTIONS if key in self.options}

    def result(self, raw: Any) -> RevisionResult | None:
        """The result of an acknowledged ``update_one``/``replace_one``; ``None`` on a miss."""
        matched = getattr(raw, "matched_count", None) \
            if getattr(raw, "acknowledged", True) else None
        if not isinstance(matched, int):
            raise ConfigInvalidError(
                "The guarded write was not acknowledged (w: 0?): it may or may not have "
                "happened; guarded writes need an acknowledged write concern",
                {"collection": _name(self.collection)})
        if matched == 0:
            return None
        return RevisionResult(self.revision, matched, int(raw.modified_count), raw)

    def conflict(self, found: Mapping[str, Any] | None, *, read: bool) -> RevisionConflictError:
        """The error of a miss: ``read`` says whether the re-read ran, ``found`` what it saw."""
        context: dict[str, Any] = {"expected": self.expected}
        if read and found is None:
            context["reason"] = "not-found"
            detail = "no document matches the filter"
        else:
            actual = read_count(found, self.revision_field) if found is not None else None
            if isinstance(actual, int) and actual != self.expected:
                context.update(reason="conflict", actual=actual)
                detail = f"the document is at revision {actual}"
            elif found is not None and actual is INVALID:
                kind = type(found.get(self.revision_field)).__name__
                context.update(reason="invalid", field=self.revision_field, type=kind)
                detail = (f"the document's {self.revision_field!r} holds a {kind}, not a "
                          "non-negative integer revision (no guarded write can match it)")
            else:
                context["reason"] = "unknown"
                detail = "the write matched nothing and the cause could not be established"
        name = _name(self.collection)
        if name is not None:
            context["collection"] = name
        where = f" on {name}" if name else ""
        return RevisionConflictError(
            f"Revision conflict{where}: expected revision {self.expected}, {detail}",
            {"reason": context.pop("reason"), **context})


def _name(collection: Any) -> str | None:
    name = getattr(collection, "name", None)
    return name if isinstance(name, str) else None


@dataclass(frozen=True)
class _Own:
    """The writers' own options, split from those that go to the driver."""

    field: str
    revision_field: str
    version: Any
    verify: Any
    driver: dict[str, Any]


def _own(options: Mapping[str, Any]) -> _Own:
    driver = dict(options)
    return _Own(driver.pop("field", DEFAULT_FIELD),
                driver.pop("revision_field", DEFAULT_REVISION_FIELD),
                driver.pop("version", None), driver.pop("verify", True), driver)


def _common(collection: Any, filter: Any, expected: Any, own: _Own) -> int:
    """The refusals every writer shares; returns the expected revision as an int."""
    check_field_names(own.field, own.revision_field)
    if own.driver.get("upsert"):
        raise refuse("upsert is not allowed: a guarded write updates an existing document "
                     "(stamp new documents with shapes.stamp_upsert instead)", "upsert")
    write_concern = getattr(collection, "write_concern", None)
    if getattr(write_concern, "acknowledged", True) is False:
        raise refuse("The collection's write concern is w: 0: a guarded write must know "
                     "whether it matched", "write_concern")
    if not is_int(expected) \
            or not 0 <= expected <= MAX_SAFE:
        raise refuse(f"expected_revision must be a non-negative integer (got {expected!r})",
                     "expected_revision")
    version = own.version
    if version is not None and (isinstance(version, float) or as_count(version) is None):
        raise refuse(f"version must be a non-negative integer (got {version!r})", "version")
    if not isinstance(own.verify, bool):
        raise refuse("verify must be a boolean", "verify")
    _check_filter(filter, own.revision_field)
    return int(expected)


def _check_filter(filter: Any, revision_field: str) -> None:
    if not isinstance(filter, Mapping):
        raise refuse(f"The filter must be a mapping (got {type(filter).__name__})", "filter")
    if "_id" in filter:
        _check_id(filter["_id"])
    if _constrains(filter, revision_field):
        raise refuse(f"The filter must not constrain the revision field {revision_field!r}: "
                     "the writer adds the guard itself", "filter")


def _check_id(value: Any) -> None:
    """An ``_id`` must name one document: an operator other than a single ``$eq`` (or a
    pattern) could match any legacy document at revision 0."""
    if isinstance(value, Mapping) and any(str(key).startswith("$") for key in value):
        if list(value) != ["$eq"] or isinstance(value["$eq"], (Mapping, re.Pattern, Regex)):
            raise refuse("The filter's _id must be a plain value (or a single $eq of one), "
                         "not an operator: a guarded write targets one document", "filter._id")
    elif isinstance(value, (re.Pattern, Regex)):
        raise refuse("The filter's _id must be a plain value, not a pattern", "filter._id")


def _constrains(filter: Mapping[str, Any], revision_field: str) -> bool:
    for key, value in filter.items():
        key = str(key)
        if key == revision_field or key.startswith(revision_field + "."):
            return True
        if key in ("$and", "$or", "$nor") and isinstance(value, (list, tuple)) and any(
                isinstance(part, Mapping) and _constrains(part, revision_field)
                for part in value):
            return True
        if key == "$expr" and _references(value, revision_field):
            return True
    return False


def _references(expression: Any, revision_field: str) -> bool:
    """Whether an aggregation expression reads ``$<revision_field>`` (or a path inside it)."""
    if isinstance(expression, str):
        return expression == f"${revision_field}" or expression.startswith(
            f"${revision_field}.")
    if isinstance(expression, Mapping):
        return any(_references(value, revision_field) for value in expression.values())
    if isinstance(expression, (list, tuple)):
        return any(_references(value, revision_field) for value in expression)
    return False


def prepare_update(
    collection: Any, filter: Any, expected: Any, update: Any, options: Mapping[str, Any]
) -> GuardedWrite:
    """The guarded form of an ``update_one`` / ``find_one_and_update``; ``options`` are the
    writer's keyword arguments (its own and the driver's)."""
    own = _own(options)
    expected = _common(collection, filter, expected, own)
    kind = update_kind(update)
    if kind == "replacement":
        raise refuse("The update is a replacement document: use replace_with_revision",
                     "update")
    if kind == "pipeline":
        for stage in update:
            if next(iter(stage)) in WHOLE_DOCUMENT_STAGES:
                raise refuse(f"A pipeline with {next(iter(stage))} replaces the whole "
                             "document: use replace_with_revision", "update")
    if writes_field(update, kind, own.revision_field):
        raise refuse(f"The update writes the revision field {own.revision_field!r}: the "
                     "writer sets it", "update")
    if own.version is not None and writes_field(update, kind, own.field):
        raise refuse(f"The update writes the version field {own.field!r} and version is "
                     "given: give one of them", "update")
    stamped = stamp_update(update, kind, revision_field=own.revision_field, field=own.field,
                           version=own.version)
    return _guarded(collection, filter, expected, stamped, own)


def prepare_replace(
    collection: Any, filter: Any, expected: Any, replacement: Any, options: Mapping[str, Any]
) -> GuardedWrite:
    """The guarded form of a ``replace_one``: the replacement's revision becomes expected + 1
    and, when ``version`` is given, its version that (0: no version field)."""
    own = _own(options)
    expected = _common(collection, filter, expected, own)
    if not isinstance(replacement, Mapping) or any(str(key).startswith("$")
                                                   for key in replacement):
        raise refuse("The replacement must be a plain document without $-prefixed keys",
                     "replacement")
    document = dict(replacement)
    document[own.revision_field] = expected + 1
    if own.version == 0:
        document.pop(own.field, None)
    elif own.version is not None:
        document[own.field] = own.version
    return _guarded(collection, filter, expected, document, own)


def _guarded(
    collection: Any, filter: Mapping[str, Any], expected: int, document: Any, own: _Own
) -> GuardedWrite:
    return GuardedWrite(collection, filter,
                        {**filter, **exact_filter(own.revision_field, expected)}, document,
                        expected, own.revision_field, own.verify, own.driver)
