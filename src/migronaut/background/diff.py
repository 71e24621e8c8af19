"""The stamped diff: turn (stored document → transform result) into a minimal, guarded update.

Reference background §1.5–§1.6. This runs once per document in the lanes' hot path, so it makes no
copies, no ``deepcopy`` and dispatches on ``type()`` before anything slower.

Rules (and the decisions taken where the reference is silent):

* A top-level key whose value changed, or that is new, is ``$set`` with the result's value; a
  changed nested value rewrites its whole top-level field. Unchanged keys are never written, so
  their stored BSON types survive (Int64, Decimal128 scale, Double ``1.0``, Binary subtypes).
* "Changed" is BSON-aware: values differ when they would encode to different BSON. ``5`` (int32),
  ``Int64(5)``, ``5.0`` and ``Decimal128('5')`` all differ; ``True`` differs from ``1``;
  ``Decimal128('9.99')`` differs from ``Decimal128('9.990')``; ``-0.0`` differs from ``0.0``; NaN
  equals NaN. A Python ``int`` outside the int32 range and an ``Int64`` of the same value are
  equal (both encode as int64). Lists and tuples are both BSON arrays; any ``dict``/``Mapping``
  is a BSON document.
* **Key order of nested documents counts.** BSON documents are ordered, and MongoDB compares
  embedded documents field by field in order (an exact-match query ``{a: {x: 1, y: 2}}`` does not
  match ``{a: {y: 2, x: 1}}``), so a reordered sub-document is a real change and is written.
  Comparing pairwise in order is also the cheapest comparison. The *top-level* order is not
  diffed: ``$set``/``$unset`` cannot reorder existing fields (only a full replacement could).
* A key absent from the result is ``$unset``. A key whose result value is ``None`` is ``$unset``
  too (Python has one ``None`` for JS ``undefined`` and ``null``), except when the stored value
  is already null: an untouched null is left alone rather than removed.
* The version and revision fields in the result are ignored; the version is ``$set`` to the
  target (``$unset`` when the target is 0) and the revision ``$inc``-ed by 1 when revisions are on.
* Shape problems (result not a document; ``_id`` missing or changed; a top-level key that is not a
  string, empty, starts with ``$``, contains ``.`` or NUL) are returned as a
  :class:`DocumentProblem` with reason ``'shape'``. A missing ``_id`` counts as a shape problem:
  it is what returning a sub-document by mistake looks like, and applying it would unset every
  other field. Messages never quote document values, ids, or the offending key (keys can be data,
  e.g. e-mail addresses used as map keys).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from bson.int64 import Int64

__all__ = [
    "DocumentProblem",
    "Update",
    "apply_update_locally",
    "bson_equal",
    "guard_filter",
    "stamped_diff",
]

#: An operator update document (``{'$set': ..., '$unset': ..., '$inc': ...}``), ready for pymongo.
Update: TypeAlias = dict[str, Any]

_MISSING: Final = object()
_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1


@dataclass(frozen=True, slots=True)
class DocumentProblem:
    """Why one document cannot be written; ``message`` never contains document data."""

    reason: str
    message: str


def _shape(message: str) -> DocumentProblem:
    return DocumentProblem("shape", message)


# ------------------------------------------------------------------------------------ equality


def bson_equal(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` encode to the same BSON value (type-aware, order-aware, deep)."""
    if a is b:
        return True
    ta = type(a)
    if ta is not type(b):
        return _cross_type_equal(a, b)
    if ta is str or ta is int:
        return bool(a == b)
    if ta is dict:
        return _documents_equal(a, b)
    if ta is list or ta is tuple:
        return _arrays_equal(a, b)
    if ta is float:
        if a == b:
            return bool(a != 0.0 or math.copysign(1.0, a) == math.copysign(1.0, b))
        return bool(a != a and b != b)  # NaN
    if isinstance(a, Mapping):
        return _documents_equal(a, b)
    return bool(a == b)


def _documents_equal(a: Mapping[Any, Any], b: Mapping[Any, Any]) -> bool:
    if len(a) != len(b):
        return False
    for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=False):
        if ka != kb or (va is not vb and not bson_equal(va, vb)):
            return False
    return True


def _arrays_equal(a: Any, b: Any) -> bool:
    if len(a) != len(b):
        return False
    for va, vb in zip(a, b, strict=False):  # noqa: SIM110 - a plain loop is faster than all()
        if va is not vb and not bson_equal(va, vb):
            return False
    return True


def _cross_type_equal(a: Any, b: Any) -> bool:
    ta, tb = type(a), type(b)
    if (ta is int and tb is Int64) or (ta is Int64 and tb is int):
        # a Python int outside int32 encodes as int64, exactly like Int64
        return bool(a == b) and not (_INT32_MIN <= a <= _INT32_MAX)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return _documents_equal(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return _arrays_equal(a, b)
    return False


# ------------------------------------------------------------------------------------ diff


def stamped_diff(
    stored: Mapping[str, Any],
    result: Any,
    *,
    version_field: str,
    revision_field: str | None,
    target_version: int,
) -> Update | DocumentProblem:
    """The update that turns ``stored`` into ``result`` and stamps version and revision.

    ``stored`` is the document as read; ``result`` what the transform returned. Returns the update
    document, or a :class:`DocumentProblem` when the result cannot be written.
    """
    if type(result) is not dict and not isinstance(result, Mapping):
        return _shape(f"the transform returned a {type(result).__name__}, not a document (dict)")
    sets: dict[str, Any] = {}
    unsets: dict[str, Any] = {}
    get = stored.get
    present = 0  # result keys (other than _id/version/revision) that also exist in stored
    saw_id = False
    for key, value in result.items():
        if key == "_id":
            saw_id = True
            old_id = get("_id", _MISSING)
            if old_id is not _MISSING and not bson_equal(old_id, value):
                return _shape("the transform changed _id (a document keeps its _id)")
            continue
        if key == version_field or key == revision_field:  # noqa: SIM109 - no tuple per key
            continue
        if type(key) is not str:
            return _shape(f"a top-level key is a {type(key).__name__}, not a string")
        if not key:
            return _shape("a top-level key is empty")
        if key[0] == "$":
            return _shape("a top-level key starts with '$'")
        if "." in key:
            return _shape("a top-level key contains '.' (nest documents instead)")
        if "\x00" in key:
            return _shape("a top-level key contains NUL")
        old = get(key, _MISSING)
        if old is _MISSING:
            if value is not None:
                sets[key] = value
            continue
        present += 1
        if value is None:
            if old is not None:
                unsets[key] = ""
        elif old is not value and not bson_equal(old, value):
            sets[key] = value
    if not saw_id and "_id" in stored:
        return _shape("the transform's result has no _id — return the whole document")

    # keys the result dropped; skipped when every stored key was seen in the result
    specials = ("_id" in stored) + (version_field in stored) + (
        revision_field is not None and revision_field in stored
    )
    if present != len(stored) - specials:
        for key in stored:
            if key not in result and key != "_id" and key != version_field and (
                key != revision_field
            ):
                unsets[key] = ""

    if target_version == 0:
        unsets[version_field] = ""
    else:
        sets[version_field] = target_version
    update: Update = {}
    if sets:
        update["$set"] = sets
    if unsets:
        update["$unset"] = unsets
    if revision_field is not None:
        update["$inc"] = {revision_field: 1}
    return update


def _counter(value: Any) -> Any:
    """A version/revision as read, or the ``$in: [null, 0]`` match for missing/null/0."""
    if value is None or (type(value) is not bool and value == 0):
        return {"$in": [None, 0]}
    return value


def guard_filter(
    doc: Mapping[str, Any], version_field: str, revision_field: str | None, occ: str
) -> dict[str, Any]:
    """The optimistic-concurrency filter of the guarded write (reference §1.6).

    ``{_id, <version>: as read, <revision>: as read}``; a missing, null or 0 counter is matched
    with ``{$in: [None, 0]}``. Under ``occ='version-only'`` (or without a revision field) only
    the version is guarded. Shard-key fields are the caller's to add.
    """
    query: dict[str, Any] = {
        "_id": doc["_id"],
        version_field: _counter(doc.get(version_field)),
    }
    if revision_field is not None and occ == "revision":
        query[revision_field] = _counter(doc.get(revision_field))
    return query


def apply_update_locally(doc: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """What ``update`` (``$set``/``$unset``/``$inc`` on top-level fields) makes of ``doc``.

    For dry-run previews; ``doc`` is not modified and values are shared, not copied. Like MongoDB
    (5.0+), existing fields keep their position and new fields are appended in field-name order.
    Raises ``ValueError`` for any other operator, a dotted field, or ``$inc`` of a non-number.
    """
    out = dict(doc)
    new: dict[str, Any] = {}
    for operator, fields in update.items():
        if operator not in ("$set", "$unset", "$inc"):
            raise ValueError(f"apply_update_locally supports $set/$unset/$inc, not {operator}")
        for key, value in fields.items():
            if "." in key:
                raise ValueError("apply_update_locally applies top-level fields only")
            target = out if key in out else new
            if operator == "$set":
                target[key] = value
            elif operator == "$unset":
                out.pop(key, None)
                new.pop(key, None)
            else:
                old = target.get(key, 0)
                if old is None:
                    old = 0
                if isinstance(old, bool) or not isinstance(old, (int, float)):
                    raise ValueError("cannot $inc a field that is not a number")
                total = old + value
                target[key] = Int64(total) if type(old) is Int64 else total
    for key in sorted(new):
        out[key] = new[key]
    return out
