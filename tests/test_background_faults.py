"""Fault injection with real processes: workers killed with SIGKILL and restarted until done.

About 2,000 documents, ``max_parallel`` 4, three ``migronaut background work`` processes; every
couple of seconds one worker is ``kill -9``ed and a new one started. Throughout, a sampler counts
live leases. At the end every document is at the target version with its revision raised exactly
once, live leases never exceeded ``max_parallel``, and no checkpoint of a fenced lane landed (the
state's totals never count a document twice).

Without ``transaction`` a batch whose writes landed just before its worker was killed is not
re-read (it no longer matches the version filter), so its documents are not counted again: the
totals may fall short of the documents migrated, never over. Transactional batches commit data
and checkpoint together, so there the totals are exact; that variant runs against a real replica
set only — on the dev server it did not finish within the bound after SIGKILLs mid-transaction
(not yet investigated).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from typing import Any

import pytest

pytestmark = pytest.mark.slow

DOCS = 2000
MAX_PARALLEL = 4
NAME = "0001_orders_v1.py"

MIGRATION = '''
import time

def migrate(doc, ctx):
    time.sleep(0.003)  # slow enough that kills land mid-batch
    doc["total_cents"] = int(round(doc["total"] * 100))
    return doc

background = {{
    "collection": "orders",
    "from": 0,
    "to": 1,
    "migrate": migrate,
    "batch_size": 40,
    "pause_ms": 0,
    "slice_ms": 2000,
    "max_parallel": {max_parallel},
    "adaptive": False,
    "transaction": {transaction},
    "partitions": {{"min_partition_docs": 100}},
}}
'''


def _live_leases(db: Any) -> int:
    return db["_migronaut_background_partitions"].count_documents(
        {
            "background": NAME,
            "lease": {"$exists": True},
            "$expr": {"$gte": ["$lease.renewedAt", {"$subtract": ["$$NOW", 2000]}]},
        }
    )


@pytest.mark.parametrize(
    "transaction",
    [False, pytest.param(True, marks=pytest.mark.replica_set)],
    ids=["plain", "transactional"],
)
def test_killed_and_restarted_workers_migrate_every_document_exactly_once(
    project: Any, db: Any, cli: Any, cli_process: Any, transaction: bool
) -> None:
    for start in range(0, DOCS, 200):  # the dev server's inserts slow down with size: chunk them
        db.orders.insert_many([{"_id": i, "total": i / 7} for i in range(start, start + 200)])
    project.write_migration(
        "0001_orders_v1", MIGRATION.format(max_parallel=MAX_PARALLEL, transaction=transaction)
    )
    registered = cli("up", "--json")
    assert registered.exit_code == 0, registered.stderr

    env = {"MIGRONAUT_LOCK_TTL": "2"}
    workers = [cli_process.start("background", "work", "--lanes", "2", env=env)
               for _ in range(3)]

    peak = 0
    stop_sampling = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop_sampling.is_set():
            peak = max(peak, _live_leases(db))
            stop_sampling.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    kills = 0
    rng = random.Random(7)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            state = db["_migronaut_background"].find_one({"_id": NAME}) or {}
            if state.get("status") in ("completed", "failed"):
                break
            time.sleep(2.5)
            victim = rng.randrange(len(workers))
            workers[victim].send_signal(signal.SIGKILL)
            workers[victim].wait(10)
            kills += 1
            workers[victim] = cli_process.start("background", "work", "--lanes", "2", env=env)
    finally:
        stop_sampling.set()
        sampler.join(5)
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(30)
            except Exception:
                worker.kill()

    state = db["_migronaut_background"].find_one({"_id": NAME})
    assert state is not None
    assert state["status"] == "completed", (state.get("status"), state.get("lastError"))
    assert kills >= 2, "the run finished before the fault injection did anything"

    # every document migrated, its revision raised exactly once (no double write on replay)
    assert db.orders.count_documents({"__v": 1, "__rev": 1}) == DOCS
    assert db.orders.count_documents({"total_cents": {"$exists": True}}) == DOCS
    # live leases sampled throughout never exceeded max_parallel
    assert 0 < peak <= MAX_PARALLEL
    # no fenced checkpoint landed: no document is counted twice — and with transactions, data
    # and checkpoint commit together, so every document is counted exactly once
    totals = state.get("totals") or {}
    if transaction:
        assert totals.get("migrated") == DOCS
    else:
        assert 0 < totals.get("migrated", 0) <= DOCS
    assert state.get("badIds") == []
    # clean shutdown released every lease
    assert db["_migronaut_background_partitions"].count_documents(
        {"background": NAME, "lease": {"$exists": True}}
    ) == 0
