"""The dev server's ``--search`` mode: Atlas's search-index commands, answered as Atlas does.

``createSearchIndexes``, ``updateSearchIndex``, ``dropSearchIndex`` and the
``$listSearchIndexes`` aggregation stage (reference collections §7.6) over an in-memory registry
of search indexes per collection, so converge's Search path is tested over the wire without
Atlas. Builds run on a clock, not for real: a new index is ``PENDING`` for ``delay`` seconds,
then ``BUILDING`` for ``delay`` more, then ``READY`` (queryable) — or ``FAILED`` with a message
when Atlas could not build its definition (:mod:`migronaut.devserver.search_definition`). An
update moves the index back through the same states while the previous definition stays
queryable (``statusDetail[].mainIndex``, the new one being ``stagedIndex``); a drop leaves it
``DELETING`` for ``delay`` seconds, its name not free yet. Re-sending the definition an index
already has changes nothing (Atlas does not retry an unchanged definition). With a ``lag``,
``$listSearchIndexes`` is eventually consistent as Atlas's is: a created index is listed, and an
updated one lists its new definition, only ``lag`` seconds after the command.

Without ``--search`` the server answers these like a ``mongod`` without Search:
:func:`not_enabled` (31082 ``SearchNotEnabled``). Indexes live as long as the server process —
also with ``--path`` — and go with their collection (``drop``, ``dropDatabase``).
``$search``/``$vectorSearch`` queries are not served.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final

from migronaut.devserver.catalog import (
    Refused,
    missing_field,
    unknown_field,
    wrong_type,
)
from migronaut.devserver.mongoeco_internals import apply_pipeline
from migronaut.devserver.search_definition import definition_problem

__all__ = ["SEARCH_COMMANDS", "SearchIndexes", "is_search_request", "not_enabled"]

SEARCH_COMMANDS: Final = frozenset({"createSearchIndexes", "updateSearchIndex",
                                    "dropSearchIndex"})
LIST_STAGE: Final = "$listSearchIndexes"
#: mongod 7.0's refusal when it has no search index management host (31082).
NOT_ENABLED_MESSAGE: Final = (
    "Using Atlas Search Database Commands and the $listSearchIndexes aggregation stage requires "
    "additional configuration. Please connect to Atlas or an AtlasCLI local deployment to "
    "enable. For more information on how to connect, see "
    "https://dochub.mongodb.org/core/atlas-cli-deploy-local-reqs."
)
#: Generic command arguments mongod accepts on every command (and these ignore).
_GENERIC: Final = frozenset({"$db", "comment", "maxTimeMS", "writeConcern", "readConcern",
                             "apiVersion", "apiStrict", "apiDeprecationErrors"})
_HOSTNAME: Final = "migronaut-dev-server"

Run = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
Clock = Callable[[], float]


def is_search_request(name: Any, command: Mapping[str, Any]) -> bool:
    """A search-index command, or an aggregate listing search indexes: served by this module."""
    return name in SEARCH_COMMANDS or (name == "aggregate" and lists_search_indexes(command))


def lists_search_indexes(command: Mapping[str, Any]) -> bool:
    """An ``aggregate`` whose pipeline has a ``$listSearchIndexes`` stage (anywhere)."""
    pipeline = command.get("pipeline")
    return "aggregate" in command and isinstance(pipeline, list) and any(
        isinstance(stage, Mapping) and LIST_STAGE in stage for stage in pipeline)


def not_enabled() -> Refused:
    """What a ``mongod`` 7.0 without Atlas Search answers to every search-index request."""
    return Refused(31082, "SearchNotEnabled", NOT_ENABLED_MESSAGE)


@dataclass
class _Version:
    """One definition of an index as submitted: its build runs from ``since`` (the clock)."""

    number: int
    definition: dict[str, Any]
    since: float
    problem: str | None
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass
class _Index:
    id: str
    name: str
    type: str
    latest: _Version
    serving: _Version | None = None  # the last definition built READY
    dropped_since: float | None = None
    previous: _Version | None = None  # what the list shows while ``latest`` lags


class SearchIndexes:
    """The search indexes of every collection, and the commands that read and change them.

    ``delay`` is the time (seconds) a build spends in each of ``PENDING`` and ``BUILDING``, and a
    dropped index in ``DELETING``; 0 makes every change take effect at once. ``lag`` is the time
    before the list shows a create or an update.
    """

    def __init__(self, delay: float = 1.0, clock: Clock = time.monotonic, *,
                 lag: float = 0.0) -> None:
        self.delay, self._clock, self.lag = delay, clock, lag
        self._by_collection: dict[tuple[str, str], list[_Index]] = {}

    # -- commands ------------------------------------------------------------------------------

    async def serve(self, name: Any, command: dict[str, Any], db: str, run: Run) -> dict[str, Any]:
        """Answer one search-index command or ``$listSearchIndexes`` aggregate on ``db``."""
        if name == "aggregate":
            return await self._aggregate(command, db, run)
        coll = command.get(name)
        if not isinstance(coll, str) or not coll:
            raise wrong_type(name, coll, "string")
        if name == "createSearchIndexes":
            specs = self._create_specs(command)
            await self._collection(db, coll, run)
            return self._create(db, coll, specs)
        allowed = {"name", "id", "definition"} if name == "updateSearchIndex" else {"name", "id"}
        _check_fields(command, name, allowed)
        if name == "updateSearchIndex":
            definition = command.get("definition")
            if "definition" not in command:
                raise missing_field("updateSearchIndex.definition")
            if not isinstance(definition, Mapping):
                raise wrong_type("updateSearchIndex.definition", definition, "object")
        await self._collection(db, coll, run)
        index = self._find(db, coll, command, name)
        now = self._clock()
        if name == "dropSearchIndex":
            if index is not None and index.dropped_since is None:
                index.dropped_since = now
            self._settle(db, coll)
        elif index is None or index.dropped_since is not None:
            raise _not_found(command)
        elif dict(command["definition"]) != index.latest.definition:
            self._settle(db, coll)
            definition = copy.deepcopy(dict(command["definition"]))
            index.previous = index.latest
            index.latest = _Version(index.latest.number + 1, definition, now,
                                    definition_problem(index.type, definition))
        return {"ok": 1.0}

    def _create_specs(self, command: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        _check_fields(command, "createSearchIndexes", {"indexes"})
        specs = command.get("indexes")
        if "indexes" not in command:
            raise missing_field("createSearchIndexes.indexes")
        if not isinstance(specs, list):
            raise wrong_type("createSearchIndexes.indexes", specs, "array")
        for spec in specs:
            where = "createSearchIndexes.indexes"
            if not isinstance(spec, Mapping):
                raise wrong_type(where, spec, "object")
            _check_fields(spec, where, {"name", "type", "definition"}, generic=False)
            for key, expected in (("name", "string"), ("type", "string")):
                if key in spec and not isinstance(spec[key], str):
                    raise wrong_type(f"{where}.{key}", spec[key], expected)
            if "definition" not in spec:
                raise missing_field(f"{where}.definition")
            if not isinstance(spec["definition"], Mapping):
                raise wrong_type(f"{where}.definition", spec["definition"], "object")
        return specs

    def _create(self, db: str, coll: str, specs: list[Mapping[str, Any]]) -> dict[str, Any]:
        from bson import ObjectId

        indexes = self._settle(db, coll)
        taken = {index.name for index in indexes}
        names = [str(spec.get("name", "default")) for spec in specs]
        if len(set(names)) < len(names) or taken & set(names):
            raise Refused(68, "IndexAlreadyExists", "Duplicate Index")
        created = []
        now = self._clock()
        for spec, name in zip(specs, names, strict=True):
            kind = str(spec.get("type", "search"))
            definition = copy.deepcopy(dict(spec["definition"]))
            version = _Version(0, definition, now, definition_problem(kind, definition))
            index = _Index(str(ObjectId()), name, kind, version)
            indexes.append(index)
            created.append({"id": index.id, "name": name})
        self._by_collection[(db, coll)] = indexes
        return {"indexesCreated": created, "ok": 1.0}

    async def _aggregate(self, command: dict[str, Any], db: str, run: Run) -> dict[str, Any]:
        from bson.int64 import Int64

        coll, pipeline = command.get("aggregate"), command["pipeline"]
        if not isinstance(coll, str):
            raise Refused(73, "InvalidNamespace", f"{{aggregate: {coll}}} is not valid for "
                          f"'{LIST_STAGE}'; a collection is required.")
        first, *rest = pipeline
        if not (isinstance(first, Mapping) and LIST_STAGE in first) or \
                lists_search_indexes({"aggregate": coll, "pipeline": rest}):
            raise Refused(40602, "Location40602",
                          f"{LIST_STAGE} is only valid as the first stage in a pipeline.")
        spec = first[LIST_STAGE]
        if not isinstance(spec, Mapping):
            raise wrong_type(LIST_STAGE, spec, "object")
        _check_fields(spec, LIST_STAGE, {"name", "id"}, generic=False)
        if "name" in spec and "id" in spec:
            raise Refused(72, "InvalidOptions",
                          f"Cannot set both 'name' and 'id' for {LIST_STAGE}.")
        listed = []
        if await self._exists(db, coll, run):
            now = self._clock()
            listed = [self._document(index, now) for index in self._listed(db, coll, now)
                      if spec.get("name", index.name) == index.name
                      and spec.get("id", index.id) == index.id]
        documents = apply_pipeline(listed, rest) if rest else listed
        return {"cursor": {"firstBatch": documents, "id": Int64(0), "ns": f"{db}.{coll}"},
                "ok": 1.0}

    # -- the catalog follows collections -------------------------------------------------------

    def follow(self, name: str | None, command: Mapping[str, Any], db: str) -> None:
        """After a command succeeded: search indexes go with their collection — dropped or
        with its database."""
        if name == "drop" and isinstance(command.get("drop"), str):
            self.collection_dropped(db, command["drop"])
        elif name == "dropDatabase":
            self.database_dropped(db)

    def collection_dropped(self, db: str, coll: str) -> None:
        """Forget the indexes of a dropped collection (Atlas drops them with it)."""
        self._by_collection.pop((db, coll), None)

    def database_dropped(self, db: str) -> None:
        for key in [key for key in self._by_collection if key[0] == db]:
            del self._by_collection[key]

    # -- state ---------------------------------------------------------------------------------

    def _phase(self, version: _Version, now: float) -> str:
        age = now - version.since
        if age < self.delay:
            return "PENDING"
        if age < 2 * self.delay:
            return "BUILDING"
        return "FAILED" if version.problem else "READY"

    def _settle(self, db: str, coll: str) -> list[_Index]:
        """The collection's indexes, with finished builds serving and finished drops gone."""
        now = self._clock()
        kept = []
        for index in self._by_collection.get((db, coll), []):
            if index.dropped_since is not None and now - index.dropped_since >= self.delay:
                continue
            if index.latest is not index.serving and self._phase(index.latest, now) == "READY":
                index.serving = index.latest
            kept.append(index)
        self._by_collection[(db, coll)] = kept
        return kept

    def _listed(self, db: str, coll: str, now: float) -> list[_Index]:
        """The indexes as the (eventually consistent) list shows them: a change younger than
        ``lag`` is not visible yet — a new index is missing, an updated one shows its previous
        definition."""
        shown = []
        for index in self._settle(db, coll):
            if now - index.latest.since >= self.lag:
                shown.append(index)
            elif index.previous is not None:
                shown.append(replace(index, latest=index.previous))
        return shown

    def _document(self, index: _Index, now: float) -> dict[str, Any]:
        """The index as Atlas's ``$listSearchIndexes`` lists it."""
        latest, serving = index.latest, index.serving
        queryable = serving is not None and index.dropped_since is None
        if index.dropped_since is not None:
            status = "DELETING"
        else:
            status = "READY" if latest is serving else self._phase(latest, now)
        building = None if latest is serving else self._phase(latest, now)
        message = latest.problem if building == "FAILED" else None
        detail: dict[str, Any] = {"hostname": _HOSTNAME, "status": status,
                                  "queryable": queryable}
        if message:
            detail["message"] = message
        if serving is not None:
            detail["mainIndex"] = _build(serving, "READY", message=None)
            if building is not None:
                detail["stagedIndex"] = _build(latest, building, message=message)
        else:
            detail["mainIndex"] = _build(latest, building or status, message=message)
        document: dict[str, Any] = {"id": index.id, "name": index.name, "type": index.type,
                                    "status": status, "queryable": queryable}
        if message:
            document["message"] = message
        document.update({
            "latestDefinitionVersion": _version(latest),
            "latestDefinition": copy.deepcopy(latest.definition),
            "statusDetail": [detail],
        })
        return document

    # -- lookups -------------------------------------------------------------------------------

    async def _exists(self, db: str, coll: str, run: Run) -> bool:
        found = await run({"listCollections": 1, "filter": {"name": coll}, "nameOnly": True})
        return bool(found["cursor"]["firstBatch"])

    async def _collection(self, db: str, coll: str, run: Run) -> None:
        if not await self._exists(db, coll, run):
            self.collection_dropped(db, coll)
            raise Refused(26, "NamespaceNotFound", f"Collection '{db}.{coll}' does not exist.")

    def _find(self, db: str, coll: str, command: Mapping[str, Any], name: str) -> _Index | None:
        has_name, has_id = "name" in command, "id" in command
        if has_name and has_id:
            raise Refused(72, "InvalidOptions", "Cannot set both 'name' and 'id'.")
        if not has_name and not has_id:
            raise Refused(72, "InvalidOptions", "Either 'name' or 'id' must be set.")
        key = "name" if has_name else "id"
        if not isinstance(command[key], str):
            raise wrong_type(f"{name}.{key}", command[key], "string")
        for index in self._settle(db, coll):
            if getattr(index, key) == command[key]:
                return index
        if name == "dropSearchIndex":
            raise _not_found(command)
        return None


def _check_fields(command: Mapping[str, Any], where: str, allowed: set[str], *,
                  generic: bool = True) -> None:
    for key in command:
        if key != where and key not in allowed and not (generic and key in _GENERIC):
            raise unknown_field(f"{where}.{key}")


def _not_found(command: Mapping[str, Any]) -> Refused:
    shown = f"'{command['name']}'" if "name" in command else f"with id '{command.get('id')}'"
    return Refused(27, "IndexNotFound", f"Search index {shown} not found")


def _version(version: _Version) -> dict[str, Any]:
    return {"version": version.number, "createdAt": version.created_at}


def _build(version: _Version, status: str, *, message: str | None) -> dict[str, Any]:
    """A ``mainIndex``/``stagedIndex`` entry of ``statusDetail``."""
    entry: dict[str, Any] = {"status": status, "queryable": status == "READY"}
    if message:
        entry["message"] = message
    entry.update({"definitionVersion": _version(version),
                  "definition": copy.deepcopy(version.definition)})
    return entry
