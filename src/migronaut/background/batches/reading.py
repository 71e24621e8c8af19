"""Reading a batch: the partition's next documents, and moving its cursor past them.

One round trip a batch: ``find`` sorted by ``_id`` with ``limit`` = batch size and a matching
cursor batch size (no ``getMore``), through :mod:`migronaut.background.lanes.wire`. A partition of
an ``_id`` range reads through the version index ``{field: 1, _id: 1}`` when the collection has one
(looked up once per process; a hint the server refuses drops it); a shard-key range reads
through the sharded version index with exact bounds (reference §5, :mod:`..key_ranges`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from bson.raw_bson import RawBSONDocument

from migronaut.background.batches.documents import Documents
from migronaut.background.batches.unit import Part
from migronaut.background.lanes.wire import read_batch
from migronaut.background.planning.id_ranges import scope_filter
from migronaut.background.planning.version_index import forget, hint_refused, version_index

if TYPE_CHECKING:
    from pymongo.client_session import ClientSession
    from pymongo.collection import Collection

    from migronaut.background.lanes.turn import LaneState

__all__ = ["BatchReader"]

_D = TypeVar("_D", dict[str, Any], RawBSONDocument)

_warned_indexes: set[tuple[Any, ...]] = set()
_index_lock = threading.Lock()


class BatchReader:
    """Reads a held partition's batches and advances its cursor."""

    def __init__(self, lane: LaneState, documents: Documents) -> None:
        self.lane = lane
        self.documents = documents
        # key ranges read through the sharded version index; only _id ranges need this one
        self.hint = self._version_index() if documents.key_ranges is None else None

    def _version_index(self) -> str | None:
        """The version index's name when the collection has one (looked up once per process,
        :mod:`~migronaut.background.planning.version_index`); warned once when missing."""
        lane, coll, field_ = self.lane, self.documents.coll, self.documents.field
        try:
            found = version_index(coll, field_)
        except Exception as error:  # namespace not found, or no listIndexes: scan unhinted
            lane.logger.debug("cannot list indexes: %s", type(error).__name__)
            found = None
        if found is not None:
            return found
        key = (id(lane.db.client), lane.db.name, coll.name, field_)
        with _index_lock:
            warn = key not in _warned_indexes
            _warned_indexes.add(key)
        if warn:
            lane.logger.warning(
                "Background migration %s: collection %s has no version index {%s: 1, _id: 1} "
                "— batches are read without it (create it, e.g. by declaring the collection's "
                "versioning)", lane.name, coll.name, field_,
                extra={"migration": lane.name, "collection": coll.name},
            )
        return found

    def _batch_query(self, part: Part) -> dict[str, Any]:
        match = self.documents.match
        condition: dict[str, Any] = (
            dict(scope_filter(part.scope)["_id"]) if part.scope.get("kind") == "id-range" else {}
        )
        if "lastId" in part.cursor:
            condition.pop("$gte", None)
            condition["$gt"] = part.cursor["lastId"]
        if not condition:
            return match
        if "_id" in match:
            return {"$and": [match, {"_id": condition}]}
        return {**match, "_id": condition}

    def read(
        self, coll: Collection[_D], part: Part, limit: int,
        session: ClientSession | None = None, max_time_ms: int | None = None,
    ) -> list[_D]:
        """The partition's next batch: by ``_id`` range, or through the sharded version index
        with exact index bounds for a key range (reference §5)."""
        key_ranges = self.documents.key_ranges
        if key_ranges is None or part.scope.get("kind") != "key-range":
            return self._find(coll, self._batch_query(part), limit, session, max_time_ms)
        read = key_ranges.read(part.scope, part.cursor)
        return read_batch(coll, read.filter, limit, hint=read.hint, sort=read.sort,
                          bounds=(read.min, read.max), session=session, max_time_ms=max_time_ms)

    def reread(self, ids: list[Any]) -> list[dict[str, Any]]:
        """The documents of ``ids`` that still match (one round trip, no ``getMore``)."""
        query = {"$and": [self.documents.match, {"_id": {"$in": ids}}]}
        return self._find(self.documents.coll, query, len(ids), None, None)

    def _find(
        self, coll: Collection[_D], query: Mapping[str, Any], limit: int,
        session: ClientSession | None, max_time_ms: int | None,
    ) -> list[_D]:
        from pymongo.errors import OperationFailure

        if self.hint is None:
            return read_batch(coll, query, limit, session=session, max_time_ms=max_time_ms)
        try:
            return read_batch(coll, query, limit, hint=self.hint, session=session,
                              max_time_ms=max_time_ms)
        except OperationFailure as error:
            if not hint_refused(error):
                raise
            # the index went away: forget it and read without a hint
            forget(self.documents.coll, self.documents.field)
            self.hint = None
            return read_batch(coll, query, limit, session=session, max_time_ms=max_time_ms)

    def advance(self, part: Part, docs: Sequence[Mapping[str, Any]], full: bool,
                stuck: Sequence[Any] = ()) -> bool:
        """Move the partition's cursor past a batch; ``True`` when the partition is done."""
        key_ranges = self.documents.key_ranges
        if key_ranges is not None and part.scope.get("kind") == "key-range":
            moved = key_ranges.advance(part.cursor, last=docs[-1] if docs else None,
                                       full=full, stuck=stuck)
            if moved is not None:
                part.cursor = moved
            return moved is None
        if docs:
            part.cursor = {"lastId": docs[-1]["_id"]}
        return not full

    def step_past(self, part: Part, doc_id: Any) -> None:
        """Move the cursor past one document left to the next pass (it keeps conflicting)."""
        if self.documents.key_range(part.scope):
            part.cursor = {**part.cursor, "stuck": [*(part.cursor.get("stuck") or ()), doc_id]}
        else:
            part.cursor = {"lastId": doc_id}
