"""Shard metadata for tests on the simulated mongos (``dev-server --sharded``).

The simulated mongos keeps every document on one node; what makes a collection "sharded" is the
metadata these helpers write into its ``config`` database, in the shapes a real cluster uses:
``config.collections`` (``_id: "<db>.<coll>"``, ``key``, ``uuid`` as a subtype-4 ``Binary``,
``timestamp``) and ``config.chunks`` (``uuid``, ``min``, ``max``, ``shard``; no ``ns``).
"""

from __future__ import annotations

import uuid as uuid_module
from collections.abc import Mapping, Sequence
from typing import Any

from bson import Binary, Int64, MaxKey, MinKey, Timestamp

__all__ = [
    "HASH_MAX",
    "HASH_MIN",
    "clear_shard_metadata",
    "hashed_chunks",
    "ranged_chunks",
    "reshard",
    "seed_shard_metadata",
]

HASH_MIN = -(2**63)
HASH_MAX = 2**63 - 1

Chunk = tuple[dict[str, Any], dict[str, Any], str]


def _bound(key: Mapping[str, Any], first: Any) -> dict[str, Any]:
    """A chunk bound: ``first`` for the first key field, MinKey for the others."""
    fields = list(key)
    return {fields[0]: first, **{name: MinKey() for name in fields[1:]}}


def _runs(key: Mapping[str, Any], points: Sequence[Any], shards: Sequence[str],
          run: int) -> list[Chunk]:
    edges: list[Any] = [MinKey(), *points, MaxKey()]
    chunks = []
    for index in range(len(edges) - 1):
        low = _bound(key, edges[index])
        high = _bound(key, edges[index + 1])
        if index == len(edges) - 2:  # the last chunk ends at MaxKey in every field
            high = {name: MaxKey() for name in key}
        chunks.append((low, high, shards[(index // run) % len(shards)]))
    return chunks


def ranged_chunks(key: Mapping[str, Any], points: Sequence[Any],
                  shards: Sequence[str] = ("shard-a", "shard-b"), *, run: int = 1) -> list[Chunk]:
    """Chunks MinKey..p0..p1..MaxKey on the first key field, ``run`` adjacent chunks per shard
    in turn (``run=2``: a, a, b, b, a, a, …)."""
    return _runs(key, points, shards, run)


def hashed_chunks(key: Mapping[str, Any], count: int,
                  shards: Sequence[str] = ("shard-a", "shard-b"), *, run: int = 1) -> list[Chunk]:
    """``count`` chunks splitting the 64-bit hash range evenly (bounds are ``Int64``, as on a
    real cluster)."""
    span = 2**64
    points = [Int64(HASH_MIN + span * i // count) for i in range(1, count)]
    return _runs(key, points, shards, run)


def seed_shard_metadata(
    client: Any,
    namespace: str,
    key: Mapping[str, Any],
    chunks: Sequence[Chunk] | None,
    *,
    collection_uuid: Binary | None = None,
    by_ns: bool = False,
    extra: Mapping[str, Any] | None = None,
) -> Binary:
    """Describe ``namespace`` as sharded on ``key`` with ``chunks``; returns the uuid.

    ``by_ns`` writes the chunks with ``ns`` instead of ``uuid`` (clusters before 5.0);
    ``chunks=None`` writes none. Replaces earlier metadata of the namespace.
    """
    clear_shard_metadata(client, namespace)
    value = collection_uuid or Binary.from_uuid(uuid_module.uuid4())
    doc: dict[str, Any] = {"_id": namespace, "key": dict(key), "uuid": value,
                           "timestamp": Timestamp(1, 1), "lastmodEpoch": None}
    doc.update(extra or {})
    client.config.collections.insert_one(doc)
    rows = []
    for low, high, shard in chunks or ():
        row: dict[str, Any] = {"min": low, "max": high, "shard": shard}
        row.update({"ns": namespace} if by_ns else {"uuid": value})
        rows.append(row)
    if rows:
        client.config.chunks.insert_many(rows)
    return value


def reshard(client: Any, namespace: str, *, key: Mapping[str, Any] | None = None) -> Binary:
    """What resharding does to the metadata: a new uuid, the chunks under it (and optionally
    a new key)."""
    value = Binary.from_uuid(uuid_module.uuid4())
    fields: dict[str, Any] = {"uuid": value}
    if key is not None:
        fields["key"] = dict(key)
    before = client.config.collections.find_one_and_update({"_id": namespace}, {"$set": fields})
    client.config.chunks.update_many({"uuid": before["uuid"]}, {"$set": {"uuid": value}})
    return value


def clear_shard_metadata(client: Any, namespace: str) -> None:
    found = client.config.collections.find_one({"_id": namespace})
    if found is not None:
        client.config.chunks.delete_many({"uuid": found.get("uuid")})
    client.config.chunks.delete_many({"ns": namespace})
    client.config.collections.delete_one({"_id": namespace})
