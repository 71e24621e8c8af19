"""What converge reads before planning (collections.md §2.3 step 4): live collections, their
indexes, the server's version, shard keys, search-index lists and version floors.

Invariants: one ``listCollections`` for every declared name, then one ``listIndexes`` per
existing regular collection with at most :data:`MAX_IN_FLIGHT` in flight; a collection dropped
between the two reads is missing; every read goes to the primary with plain codec options, so
an injected client with unusual settings cannot make everything look changed. A read the server
refuses is ``CONVERGE_FAILED`` in the phase it happened, with its ``mongoCode``. Server facts
(version, mongos) are best effort: a refusal means "unknown", which only narrows what can be
changed in place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from bson.codec_options import CodecOptions
from pymongo import ReadPreference
from pymongo.database import Database
from pymongo.errors import OperationFailure, PyMongoError

from migronaut.commands.converge_apply import connection_trouble, explain
from migronaut.commands.converge_search import list_search_indexes
from migronaut.declared.definition import CollectionDefinition
from migronaut.declared.live import (
    LiveCollection,
    ServerCapabilities,
    VersionFloor,
    live_collection,
)
from migronaut.declared.planner import floor_to_probe
from migronaut.errors import ConvergeFailedError

__all__ = ["MAX_IN_FLIGHT", "ServerFacts", "primary", "read_live", "read_one", "server_facts"]

#: ``listIndexes`` commands in flight at once.
MAX_IN_FLIGHT = 8
_NAMESPACE_NOT_FOUND = 26
_READ_HINTS = {13: "not authorized; converge needs listCollections and listIndexes on the "
                   "database (the read role)"}


def primary(db: Database[Any]) -> Database[Any]:
    """``db`` with primary reads and plain codec options (the forced read options)."""
    return db.client.get_database(db.name, codec_options=CodecOptions(tz_aware=True),
                                  read_preference=ReadPreference.PRIMARY)


@dataclass(frozen=True)
class ServerFacts:
    """The server as converge sees it: its capabilities and whether it is a mongos."""

    capabilities: ServerCapabilities
    mongos: bool = False


def server_facts(db: Database[Any]) -> ServerFacts:
    """``hello`` and ``buildInfo``, once, best effort (a refusal reads as unknown)."""
    admin = db.client.admin
    mongos = False
    version: tuple[int, int, int] | None = None
    try:
        mongos = admin.command("hello").get("msg") == "isdbgrid"
    except PyMongoError:
        pass
    try:
        parts = admin.command("buildInfo").get("versionArray") or []
        if len(parts) >= 3:
            version = (int(parts[0]), int(parts[1]), int(parts[2]))
    except (PyMongoError, TypeError, ValueError):
        pass
    return ServerFacts(ServerCapabilities(version), mongos)


def _shard_key(db: Database[Any], name: str) -> Mapping[str, Any] | None:
    """The shard key of ``db.name`` from ``config.collections`` (``None``: unsharded or
    unreadable; an 8.0 ``unsplittable`` collection is unsharded)."""
    try:
        entry = db.client["config"]["collections"].find_one({"_id": f"{db.name}.{name}"})
    except PyMongoError:
        return None
    if not entry or entry.get("unsplittable") or entry.get("dropped"):
        return None
    key = entry.get("key")
    return dict(key) if isinstance(key, Mapping) else None


def _list_indexes(db: Database[Any], name: str, phase: str) -> list[Mapping[str, Any]] | None:
    """The collection's index documents; ``None`` when it vanished meanwhile."""
    try:
        return list(db[name].list_indexes())
    except OperationFailure as error:
        if error.code == _NAMESPACE_NOT_FOUND:
            return None
        if connection_trouble(error):
            raise
        raise _read_failed(error, phase, f"the indexes of {name}", name) from error


def _read_failed(error: OperationFailure, phase: str, what: str,
                 collection: str | None = None) -> ConvergeFailedError:
    """A read the server refused: ``CONVERGE_FAILED`` in ``phase`` with its code (a lost
    connection stays the driver's error, which the run reports as ``CONNECTION_FAILED``)."""
    cause, code, _ = explain(error)
    hint = _READ_HINTS.get(code) if code is not None else None
    context: dict[str, Any] = {"phase": phase, "cause": cause}
    if collection is not None:
        context["collection"] = collection
    if code is not None:
        context["mongoCode"] = code
    if hint:
        context["hint"] = hint
    return ConvergeFailedError(f"Could not read {what}: {cause}"
                               + (f" — {hint}" if hint else ""), context)


def _version_floor(db: Database[Any], definition: CollectionDefinition, live: LiveCollection
                   ) -> VersionFloor | None:
    """Are documents below the new ``min`` left (§3.3.4)? Missing or lower versions count."""
    minimum = floor_to_probe(definition, live)
    spec = definition.versioning
    if minimum is None or spec is None:
        return None
    try:
        below = db[definition.name].find_one(
            {"$or": [{spec.field: {"$lt": minimum}}, {spec.field: {"$exists": False}}]},
            {"_id": 1})
    except PyMongoError as error:
        return VersionFloor(minimum, "unknown", str(error))
    return VersionFloor(minimum, below is not None)


def read_live(db: Database[Any], definitions: Sequence[CollectionDefinition], *,
              mongos: bool = False, search: bool = False, phase: str = "plan"
              ) -> dict[str, LiveCollection]:
    """Every declared collection's live state, by name (§2.3 step 4)."""
    db = primary(db)
    names = [definition.name for definition in definitions]
    try:
        infos = {info["name"]: info
                 for info in db.list_collections(filter={"name": {"$in": names}})}
    except OperationFailure as error:
        if connection_trouble(error):
            raise
        raise _read_failed(error, phase, "the declared collections") from error
    regular = [name for name in names
               if name in infos and (infos[name].get("type") or "collection") == "collection"]
    with ThreadPoolExecutor(max_workers=MAX_IN_FLIGHT) as pool:
        listed = dict(zip(regular, pool.map(lambda n: _list_indexes(db, n, phase), regular),
                          strict=True))
    found: dict[str, LiveCollection] = {}
    for definition in definitions:
        name = definition.name
        info = infos.get(name)
        indexes = listed.get(name, [])
        if name in listed and indexes is None:
            info = None  # dropped between the two reads: missing
        found[name] = _complete(db, definition, live_collection(name, info, indexes or ()),
                                mongos=mongos, search=search, phase=phase)
    return found


def read_one(db: Database[Any], definition: CollectionDefinition, *, mongos: bool = False,
             search: bool = False, phase: str = "replan") -> LiveCollection:
    """One collection re-read (re-plan, and the fixed-point check in phase ``apply``)."""
    return read_live(db, [definition], mongos=mongos, search=search,
                     phase=phase)[definition.name]


def _complete(db: Database[Any], definition: CollectionDefinition, live: LiveCollection, *,
              mongos: bool, search: bool, phase: str) -> LiveCollection:
    """Add the shard key, the search list and the version floor where they matter."""
    if not live.exists or live.type != "collection":
        return live
    shard_key = _shard_key(db, live.name) if mongos else None
    listed = None
    if search and definition.search_indexes is not None:
        listed = list_search_indexes(db, live.name, phase=phase)
    live = replace(live, shard_key=shard_key,
                   search_indexes=None if listed is None else tuple(listed))
    return replace(live, version_floor=_version_floor(db, definition, live))
