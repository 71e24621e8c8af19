"""Background migrations worked through Celery: real worker processes on this run's own Redis
database, checked against MongoDB's invariants — every document migrated exactly once (each
migration bumps a per-document counter: a second migration of a document would leave 2), exact
totals, no lease left, the status the scenario leads to.

Waiting is polling MongoDB for the state a scenario leads to, never a sleep standing in for it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from helpers.background import PARTITIONS, STATES
from helpers.celery_worker import redis_client

NAME = "0001_hits.py"
COLLECTION = "items"


def hits_migration(*, max_parallel: int = 4, batch_size: int = 25, sleep: float = 0.0,
                   fail: bool = False) -> str:
    """A declarative v0 → v1 migration that counts, in the document, how often it was
    migrated (``hits``): exactly once means every document ends with ``hits == 1``."""
    return f'''
import time


def migrate(doc, ctx):
    if {fail!r}:
        raise ValueError("cannot migrate this one")
    if {sleep!r}:
        time.sleep({sleep!r})
    doc["hits"] = doc.get("hits", 0) + 1
    return doc


background = {{
    "collection": {COLLECTION!r},
    "from": 0,
    "to": 1,
    "migrate": migrate,
    "batch_size": {batch_size},
    "pause_ms": 0,
    "slice_ms": 1000,
    "max_parallel": {max_parallel},
    "adaptive": False,
    "partitions": {{"min_partition_docs": 50}},
}}
'''


def configure(project: Any, *, lock_ttl: int = 5, **celery: Any) -> None:
    """``migronaut.toml`` with a short lock TTL (leases of killed workers expire quickly) and
    the ``celery`` table's options for this scenario."""
    options = {"poll_interval_ms": 300, "stall_ms": 3000, "slice_ms": 1000,
               "verify_interval_ms": False, **celery}
    table = "\n".join(f"{key} = {json.dumps(value)}" for key, value in options.items())
    project.write("migronaut.toml", f"lock_ttl_seconds = {lock_ttl}\n\n[celery]\n{table}\n")


def register(project: Any, cli: Any, db: Any, *, docs: int, **options: Any) -> None:
    for start in range(0, docs, 200):
        db[COLLECTION].insert_many([{"n": i} for i in range(start, min(docs, start + 200))])
    db[COLLECTION].create_index([("__v", 1), ("_id", 1)])
    project.write_migration(NAME, hits_migration(**options))
    result = cli("up")
    assert result.exit_code == 0, result.stderr


def state(db: Any) -> dict[str, Any]:
    found = db[STATES].find_one({"_id": NAME})
    assert found is not None
    return dict(found)


def live_leases(db: Any) -> int:
    return int(db[PARTITIONS].count_documents({"background": NAME, "lease": {"$exists": True}}))


def migrated(db: Any) -> int:
    return int(db[COLLECTION].count_documents({"__v": 1}))


def wait_until(check: Callable[[], bool], *, timeout: float = 240.0,
               every: Callable[[], Any] | None = None, why: str = "") -> None:
    """Poll ``check`` (MongoDB's state) until it holds; ``every`` runs between polls."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {why or check}")
        if every is not None:
            every()
        time.sleep(0.2)


def completed(db: Any) -> Callable[[], bool]:
    return lambda: state(db)["status"] == "completed"


def assert_exactly_once(db: Any, docs: int) -> None:
    """Every document migrated exactly once, the totals exact, no lease left."""
    final = state(db)
    assert final["status"] == "completed", final.get("lastError")
    assert db[COLLECTION].count_documents({}) == docs
    assert db[COLLECTION].count_documents({"__v": 1, "hits": 1}) == docs
    assert db[COLLECTION].count_documents({"hits": {"$ne": 1}}) == 0
    assert final["totals"]["migrated"] == docs
    assert final["totals"].get("failed", 0) == 0
    assert live_leases(db) == 0


def test_two_workers_migrate_2000_documents_exactly_once(
        celery_project: Any, project: Any, cli: Any, db: Any) -> None:
    configure(project)
    register(project, cli, db, docs=2000, max_parallel=4)

    first = celery_project.worker(concurrency=3)
    second = celery_project.worker(concurrency=3)
    wait_until(completed(db), why="the migration to complete")

    assert_exactly_once(db, 2000)
    final = state(db)
    assert final["coordinator"]["kind"] == "celery"
    assert final["round"] >= 1
    # both workers ran lanes: the work was shared through the queue
    assert "background-lane" in first.log() and "background-lane" in second.log()
