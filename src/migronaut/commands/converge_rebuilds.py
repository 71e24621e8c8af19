"""The rebuilds converge has begun and not seen through: ``<converge_log_collection>_rebuilds``
(default ``_migronaut_converge_rebuilds``).

A rebuild drops an index before it creates its replacement; a process killed or a connection
cut in between would lose the old index for good (converge would then plan only the declared
one, which may never build). So:

Invariants: before its first drop a rebuild writes one entry — the full spec of every index it
is about to drop, the names it will create, the run — acknowledged by a majority; the entry is
deleted only once every index it created is live, or every index it dropped is back. A real
converge reads the entries first, under its lock, and for each one either deletes it (every
created name is listed: the rebuild finished) or creates every dropped index whose name is not
listed, then deletes it — before it reads anything else. An entry it cannot read stops the
converge (``STATE_INVALID`` naming it); a restore that fails stops it (``CONVERGE_FAILED``,
``phase: "restore"``) and keeps the entry. Specs are stored as canonical Extended JSON text, so
no ``$``-prefixed field name reaches our own collections and every BSON type comes back as it
was listed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bson import ObjectId, json_util
from bson.json_util import CANONICAL_JSON_OPTIONS
from pymongo import WriteConcern
from pymongo.errors import OperationFailure, PyMongoError

from migronaut.commands.converge_apply import create_index_specs, explain
from migronaut.declared.inline import REBUILDS_SUFFIX
from migronaut.errors import ConvergeFailedError, StateInvalidError

if TYPE_CHECKING:
    from pymongo.collection import Collection
    from pymongo.database import Database

    from migronaut.declared.plan import Rebuild

__all__ = ["Interrupted", "RebuildJournal", "journal_name", "restore_interrupted"]

_NAMESPACE_NOT_FOUND = 26


def journal_name(converge_log_collection: str) -> str:
    return converge_log_collection + REBUILDS_SUFFIX


@dataclass(frozen=True)
class Interrupted:
    """One entry as read back: the collection, the specs dropped, the names to create."""

    id: Any
    collection: str
    dropped: tuple[dict[str, Any], ...]
    created: tuple[str, ...]


class RebuildJournal:
    """Writes, reads and settles the entries of one database's journal (primary reads)."""

    def __init__(self, collection: Collection[dict[str, Any]], run_id: str) -> None:
        self._collection = collection.with_options(
            write_concern=WriteConcern(w="majority"))
        self._run_id = run_id

    @property
    def name(self) -> str:
        return self._collection.name

    def begin(self, collection: str, step: Rebuild, drops: Sequence[Mapping[str, Any]]) -> Any:
        """Record what ``step`` is about to drop (``drops``: the specs as they will be
        restored); the entry's id. A failure raises: the rebuild must not drop then."""
        entry_id = ObjectId()
        self._collection.insert_one({
            "_id": entry_id, "collection": collection, "runId": self._run_id,
            "startedAt": dt.datetime.now(dt.UTC),
            "dropped": [json_util.dumps(spec, json_options=CANONICAL_JSON_OPTIONS)
                        for spec in drops],
            "created": [str(spec["name"]) for spec in step.creates]})
        return entry_id

    def settle(self, entry_id: Any) -> bool:
        """Delete a settled entry; ``False`` when that failed (the next converge finds every
        name it would restore listed, and deletes it then)."""
        try:
            self._collection.delete_one({"_id": entry_id})
        except PyMongoError:
            return False
        return True

    def pending(self) -> list[Interrupted]:
        """Every entry, oldest first — ``STATE_INVALID`` naming the first we cannot read."""
        return [self._read(entry) for entry in self._collection.find({}).sort("_id", 1)]

    def _read(self, entry: Mapping[str, Any]) -> Interrupted:
        def invalid(field: str, why: str) -> StateInvalidError:
            return StateInvalidError(
                f"Rebuild entry {entry.get('_id')!r} in {self.name} is unreadable: {field} "
                f"{why} — it records an index converge dropped; restore that index by hand, "
                "then delete the entry",
                {"collection": self.name, "id": str(entry.get("_id")), "field": field})

        collection = entry.get("collection")
        if not isinstance(collection, str) or not collection:
            raise invalid("collection", "is not a collection name")
        created = entry.get("created")
        if not isinstance(created, list) or not all(isinstance(n, str) for n in created):
            raise invalid("created", "is not a list of index names")
        dropped = entry.get("dropped")
        if not isinstance(dropped, list) or not dropped:
            raise invalid("dropped", "is not a non-empty list")
        specs = []
        for position, text in enumerate(dropped):
            try:
                spec = json_util.loads(text) if isinstance(text, str) else None
            except ValueError:
                spec = None
            if not (isinstance(spec, dict) and isinstance(spec.get("name"), str)
                    and isinstance(spec.get("key"), Mapping) and spec["key"]):
                raise invalid(f"dropped[{position}]", "is not an index spec as Extended JSON")
            specs.append(spec)
        return Interrupted(entry["_id"], collection, tuple(specs), tuple(created))


def restore_interrupted(db: Database[Any], journal: RebuildJournal) -> list[tuple[str, str]]:
    """Settle every entry of ``journal`` (module invariants); the ``(collection, index)``
    pairs restored. A restore that fails is ``CONVERGE_FAILED`` (``phase: "restore"``)."""
    restored: list[tuple[str, str]] = []
    for entry in journal.pending():
        try:
            listed = {index["name"] for index in db[entry.collection].list_indexes()}
        except OperationFailure as error:
            if error.code != _NAMESPACE_NOT_FOUND:
                raise
            listed = None  # the collection is gone, and its indexes with it
        if listed is not None and not all(name in listed for name in entry.created):
            for spec in entry.dropped:
                if spec["name"] in listed:
                    continue
                try:
                    create_index_specs(db, entry.collection, [spec])
                except PyMongoError as error:
                    raise _restore_failed(entry, spec, error) from error
                restored.append((entry.collection, str(spec["name"])))
        journal.settle(entry.id)
    return restored


def _restore_failed(entry: Interrupted, spec: Mapping[str, Any],
                    error: PyMongoError) -> ConvergeFailedError:
    cause, code, hint = explain(error)
    name = spec["name"]
    message = (f'Could not restore index "{name}" on {entry.collection}, dropped by an '
               f"interrupted rebuild: {cause}" + (f" — {hint}" if hint else "")
               + f" — {entry.collection} has no index \"{name}\" now; fix the cause and "
               "converge again, or create it by hand and converge again")
    context: dict[str, Any] = {"phase": "restore", "collection": entry.collection,
                               "target": "index", "name": name, "action": "restore",
                               "cause": cause, "spec": json_util.dumps(spec)}
    if code is not None:
        context["mongoCode"] = code
    if hint:
        context["hint"] = hint
    return ConvergeFailedError(message, context)
