"""Update documents as the contract writes them: what an update touches, and the revision bump.

Invariant: every update this library builds is one mongod accepts — never a path and its
sub-path in one update, never the same path in two operators, version values in pipelines as
``$literal`` — because a field the caller already writes is refused instead of merged.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

from migronaut.errors import ConfigInvalidError
from migronaut.versioning.fields import DEFAULT_REVISION_FIELD, check_field_names

__all__ = [
    "UpdateKind",
    "bump_revision",
    "refuse",
    "stamp_update",
    "update_kind",
    "writes_field",
]

UpdateKind = Literal["operator", "pipeline", "replacement"]
#: Pipeline stages that replace the whole document: the guard could not keep its fields.
WHOLE_DOCUMENT_STAGES = frozenset({"$project", "$replaceRoot", "$replaceWith"})


def refuse(message: str, path: str = "options") -> ConfigInvalidError:
    """The ``CONFIG_INVALID`` error of a write refused before anything was sent."""
    return ConfigInvalidError(message, {"issues": [{"path": path, "message": message}]})


def update_kind(update: Any) -> UpdateKind:
    """Operator update (every key ``$``-prefixed), pipeline (a list) or replacement (no key
    ``$``-prefixed); a mapping mixing both, or anything else, is refused."""
    if isinstance(update, Sequence) and not isinstance(update, (str, bytes)):
        for stage in update:
            if not isinstance(stage, Mapping) or len(stage) != 1:
                raise refuse("Each pipeline stage must be a mapping with one stage name",
                             "update")
        return "pipeline"
    if not isinstance(update, Mapping):
        raise refuse(f"The update must be a mapping or a pipeline (got "
                     f"{type(update).__name__})", "update")
    operators = [str(key).startswith("$") for key in update]
    if all(operators):
        return "operator"
    if not any(operators):
        return "replacement"
    raise refuse("The update mixes operators and plain fields", "update")


def _paths(update: Any, kind: UpdateKind) -> Iterator[str]:
    """Every field path ``update`` writes (operator keys, ``$rename`` targets, pipeline
    ``$set``/``$addFields``/``$unset`` fields, replacement keys)."""
    if kind == "replacement":
        yield from (str(key) for key in update)
        return
    if kind == "operator":
        for operator, spec in update.items():
            if isinstance(spec, Mapping):
                yield from (str(key) for key in spec)
                if operator == "$rename":
                    yield from (str(value) for value in spec.values())
        return
    for stage in update:
        [(name, spec)] = stage.items()
        if name in ("$set", "$addFields") and isinstance(spec, Mapping):
            yield from (str(key) for key in spec)
        elif name == "$unset":
            yield from ([spec] if isinstance(spec, str) else [str(key) for key in spec])


def writes_field(update: Any, kind: UpdateKind, field: str) -> bool:
    """Whether ``update`` writes ``field`` or a path inside it."""
    return any(path == field or path.startswith(field + ".") for path in _paths(update, kind))


def _increment(revision_field: str) -> dict[str, Any]:
    """The pipeline expression of "revision + 1" (a missing revision counts as 0)."""
    return {"$add": [{"$ifNull": [f"${revision_field}", 0]}, 1]}


def stamp_update(
    update: Any, kind: UpdateKind, *, revision_field: str | None, field: str,
    version: int | None,
) -> Any:
    """A copy of ``update`` that bumps the revision (when ``revision_field``) and sets the
    version (when ``version`` is given; 0 removes the field: version 0 is "no version")."""
    if kind == "operator":
        out = {operator: dict(spec) if isinstance(spec, Mapping) else spec
               for operator, spec in update.items()}
        if revision_field is not None:
            out.setdefault("$inc", {})[revision_field] = 1
        if version == 0:
            out.setdefault("$unset", {})[field] = ""
        elif version is not None:
            out.setdefault("$set", {})[field] = version
        return out
    stages = [dict(stage) for stage in update]
    added: dict[str, Any] = {}
    if version:
        added[field] = {"$literal": version}
    if revision_field is not None:
        added[revision_field] = _increment(revision_field)
    if added:
        stages.append({"$set": added})
    if version == 0:
        stages.append({"$unset": field})
    return stages


def bump_revision(update: Any, *, revision_field: str = DEFAULT_REVISION_FIELD) -> Any:
    """``update`` (operator update or pipeline) with the revision increment added, for the
    unguarded writes (``update_many``, bulk writes): every write bumps the revision."""
    check_field_names(None, revision_field)
    kind = update_kind(update)
    if kind == "replacement":
        raise refuse("bump_revision takes an operator update or a pipeline, not a replacement "
                     "(set the revision in the replacement itself)", "update")
    if writes_field(update, kind, revision_field):
        raise refuse(f"The update already writes the revision field {revision_field!r}",
                     "update")
    return stamp_update(update, kind, revision_field=revision_field, field="", version=None)
