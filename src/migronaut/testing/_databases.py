"""Test databases: unique names, and copies of a migrated template database.

MongoDB has no database clone (no ``CREATE DATABASE … TEMPLATE``, and ``$out`` copies neither
indexes nor options), so a copy is made collection by collection: ``create`` with the source's
options (validators, collation, views…), ``createIndexes`` with its index specs, then the
documents in batches. The copy holds migronaut's own collections too, so a ``Migrator`` on it
sees every migration applied.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from pymongo import MongoClient

__all__ = ["copy_database", "unique_name"]

_BATCH: Final = 1000


def unique_name(prefix: str) -> str:
    """A database name no other test, worker or session uses (``prefix`` + 12 hex digits)."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


def copy_database(client: MongoClient[dict[str, Any]], source: str, target: str) -> None:
    """Copy every collection of ``source`` (options, indexes, documents) into ``target``."""
    from migronaut.testing.snapshots import collection_kind, index_specs

    src, dst = client[source], client[target]
    views = []
    for info in src.list_collections():
        name = info["name"]
        if name.startswith("system."):
            continue
        kind, options = collection_kind(info)
        if kind == "view":
            views.append((name, options))
            continue
        dst.command({"create": name, **options})
        batch: list[dict[str, Any]] = []
        for document in src[name].find():
            batch.append(document)
            if len(batch) == _BATCH:
                dst[name].insert_many(batch, bypass_document_validation=True)
                batch = []
        if batch:  # documents that predate a validator are copied as they are
            dst[name].insert_many(batch, bypass_document_validation=True)
        indexes = [spec for index, spec in index_specs(src[name]).items() if index != "_id_"]
        if indexes:  # after the documents: building an index once is cheaper than maintaining it
            dst.command({"createIndexes": name, "indexes": indexes})
    for name, options in views:  # after the collections they read
        dst.command({"create": name, **options})
