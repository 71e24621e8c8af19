"""Sharded collections: the shard facts, which partitioner a plan uses, and the plan's epoch.

A background migration on a sharded collection is planned along the shard key when it can be
(reference background §5): the collection's key, uuid and chunks come from ``config.collections``
and ``config.chunks`` (role ``clusterMonitor``), and batches read through the *sharded version
index* ``{<versionField>: 1, …shardKey, _id: 1}``. When a fact is missing it degrades, never
fails: unreadable metadata or a missing index mean ``_id`` ranges, "untargeted".

Invariants:

* chunk bounds are kept as stored (hashed bounds are ``Int64``: pymongo decodes 64-bit integers
  as ``Int64``, never as plain ``int``), and sorting happens on the server;
* a plan with a known shard key records its *epoch* ``{uuid, key}``; a collection resharded or
  with a refined key no longer matches it, and the plan is stale (lanes stop, the coordinator
  replans the same pass);
* each degradation warns once per process.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from migronaut.background.planning.shard_facts import ShardFacts, Sharding, key_values

if TYPE_CHECKING:
    from pymongo.collection import Collection
    from pymongo.database import Database

    from migronaut.background.planning.id_ranges import Plan

__all__ = [
    "ShardFacts",
    "Sharding",
    "epoch_is_stale",
    "key_values",
    "plan_collection",
    "read_shard_facts",
    "select_partitioner",
    "sharded_version_index",
]

#: The server refused the metadata read (the user lacks ``clusterMonitor``).
_UNAUTHORIZED = 13
_warned: set[tuple[Any, ...]] = set()
_warned_lock = threading.Lock()


def sharded_version_index(version_field: str, key: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``{<versionField>: 1, …shardKey, _id: 1}`` (``_id`` once when it is part of the key)."""
    fields: list[tuple[str, Any]] = [(version_field, 1)]
    fields += [(name, value if isinstance(value, str) else int(value))
               for name, value in key.items()]
    if "_id" not in key:
        fields.append(("_id", 1))
    return fields


def read_shard_facts(
    db: Database[dict[str, Any]], collection: str
) -> ShardFacts | Literal["unauthorized"] | None:
    """The collection's shard key, uuid and chunks; ``None`` when it is not sharded.

    Unsharded includes MongoDB 8.0's ``unsplittable`` collections (tracked, keyed ``{_id: 1}``,
    never split). Chunks are read by ``uuid`` (5.0+) and, when none are found, by ``ns``.
    """
    from pymongo.errors import OperationFailure, PyMongoError

    config = db.client.get_database("config", read_preference=db.read_preference)
    namespace = f"{db.name}.{collection}"
    try:
        found = config["collections"].find_one({"_id": namespace})
    except OperationFailure as error:
        if error.code == _UNAUTHORIZED:
            return "unauthorized"
        raise
    if not found or found.get("dropped") or found.get("unsplittable"):
        return None
    key = found.get("key")
    if not isinstance(key, Mapping) or not key:
        return None
    chunks: list[dict[str, Any]] | None
    try:
        chunks = list(config["chunks"].find({"uuid": found.get("uuid")}).sort("min", 1))
        if not chunks:
            chunks = list(config["chunks"].find({"ns": namespace}).sort("min", 1))
    except PyMongoError:
        chunks = None
    return ShardFacts(dict(key), found.get("uuid"), chunks or None)


def _has_index(collection: Collection[dict[str, Any]], wanted: list[tuple[str, Any]]) -> bool:
    from pymongo.errors import PyMongoError

    from migronaut.background.planning.id_ranges import index_named

    try:
        return index_named(collection.index_information(), wanted) is not None
    except PyMongoError:
        return False


def _warn_once(logger: logging.Logger, key: tuple[Any, ...], message: str, *args: Any) -> None:
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(message, *args)


def select_partitioner(
    db: Database[dict[str, Any]],
    spec: Mapping[str, Any],
    *,
    shard_aware: str,
    logger: logging.Logger,
    name: str,
) -> Sharding:
    """The selection table of reference §5 (``partitionerFor``)."""
    from migronaut.core.topology import is_mongos

    if spec.get("mode") == "step" or shard_aware == "off" or not is_mongos(db.client):
        return Sharding("off")
    collection = str(spec["collection"])
    facts = read_shard_facts(db, collection)
    if facts == "unauthorized":
        _warn_once(
            logger, ("unauthorized",),
            "⚠ %s: cannot read the shard metadata (config.collections, config.chunks) — "
            "background migrations need the clusterMonitor role to plan by shard; running "
            "untargeted on _id ranges", name,
        )
        return Sharding("untargeted")
    if facts is None:
        return Sharding("off")
    index = sharded_version_index(str(spec.get("field", "__v")), facts.key)
    if not _has_index(db[collection], index):
        shown = ", ".join(f"{field}: {value!r}" if isinstance(value, str) else
                          f"{field}: {value}" for field, value in index)
        _warn_once(
            logger, ("index", id(db.client), db.name, collection, tuple(index)),
            "⚠ %s: %s is sharded but has no sharded version index {%s} — running untargeted "
            "on _id ranges (create the index to plan by shard)", name, collection, shown,
        )
        return Sharding("untargeted", facts)
    return Sharding("shard", facts, index)


def plan_collection(
    db: Database[dict[str, Any]],
    match: Mapping[str, Any],
    spec: Mapping[str, Any],
    *,
    hint: Any,
    shard_aware: str,
    logger: logging.Logger,
    name: str,
) -> Plan:
    """Plan a declarative pass with the partitioner the collection calls for."""
    from migronaut.background.planning.id_ranges import plan_id_ranges
    from migronaut.background.planning.shard_ranges import plan_shard_ranges

    sharding = select_partitioner(db, spec, shard_aware=shard_aware, logger=logger, name=name)
    collection = db[str(spec["collection"])]
    if sharding.mode == "shard":
        return plan_shard_ranges(collection, match, spec, sharding)
    plan = plan_id_ranges(collection, match, spec, hint=hint)
    if sharding.mode == "untargeted":
        plan.sharding = sharding.record("untargeted")
        plan.epoch = sharding.facts.epoch if sharding.facts is not None else None
    return plan


def epoch_is_stale(db: Database[dict[str, Any]], collection: str,
                   epoch: Mapping[str, Any] | None) -> bool:
    """Whether the collection was resharded (new uuid) or its key changed since ``epoch``.

    Metadata that cannot be read says nothing (not stale); a collection no longer sharded is.
    """
    if not epoch:
        return False
    from pymongo.errors import PyMongoError

    try:
        config = db.client.get_database("config", read_preference=db.read_preference)
        found = config["collections"].find_one(
            {"_id": f"{db.name}.{collection}"}, {"uuid": 1, "key": 1})
    except PyMongoError:
        return False
    if found is None:
        return True
    key = found.get("key") or {}
    return bool(found.get("uuid") != epoch.get("uuid")
                or list(key.items()) != list((epoch.get("key") or {}).items()))
