"""Fault injection with real processes: workers killed with SIGKILL and restarted until done.

About 2,000 documents, ``max_parallel`` 4, three ``migronaut background work`` processes; every
couple of seconds one worker is ``kill -9``ed and a new one started. Throughout, a sampler counts
live leases. At the end every document is at the target version with its revision raised exactly
once, live leases never exceeded ``max_parallel``, no checkpoint of a fenced lane landed, and the
state's totals equal the documents migrated.

Totals stay exact without transactions because a lane checkpoints the previous batch together
with the ids of the batch it is about to write: a batch written just before its worker was
killed is counted by the partition's next holder (a replay skips it: it no longer matches). The
first test kills a lane at exactly that point. The transactional variant commits data and
checkpoint together; it runs against a replica set only: the dev server detects transaction
conflicts per database, so every lease renewal of another lane aborts a transaction and the run,
though it completes, takes minutes.
"""


from __future__ import annotations

import random
import signal
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest

pytestmark = pytest.mark.slow

DOCS = 2000
MAX_PARALLEL = 4
NAME = "0001_orders_v1.py"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

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


#: Runs ``background run`` and dies (``os._exit``, like ``kill -9``) right after the second write
#: to the target collection succeeded — after the write, before its checkpoint.
CRASH_AFTER_WRITE = """
import os, sys
from pymongo import monitoring

class CrashAfterSecondWrite(monitoring.CommandListener):
    def __init__(self):
        self.targets, self.writes = {}, 0
    def started(self, event):
        self.targets[event.request_id] = (event.command_name, event.command.get(event.command_name))
    def succeeded(self, event):
        if self.targets.pop(event.request_id, None) == ("update", "orders"):
            self.writes += 1
            if self.writes == 2:
                os._exit(9)
    def failed(self, event):
        self.targets.pop(event.request_id, None)

monitoring.register(CrashAfterSecondWrite())
from migronaut.cli import main
sys.exit(main(["background", "run", "--all"]))
"""


def test_a_batch_written_just_before_a_crash_is_counted_once_by_the_next_holder(
    project: Any, db: Any, cli: Any
) -> None:
    import subprocess
    import sys

    db.orders.insert_many([{"_id": i, "total": i / 7} for i in range(120)])
    project.write_migration("0001_orders_v1", MIGRATION.format(max_parallel=1, transaction=False)
                            .replace('"min_partition_docs": 100', '"min_partition_docs": 1000'))
    assert cli("up").exit_code == 0
    crashed = subprocess.run([sys.executable, "-c", CRASH_AFTER_WRITE], cwd=project.path,
                             env=project.env(), capture_output=True, text=True, timeout=120)
    assert crashed.returncode == 9, crashed.stderr

    partitions = db["_migronaut_background_partitions"]
    part = partitions.find_one({"background": NAME})
    assert part is not None
    # the first batch was checkpointed; the second was written and only named by its intent
    assert part["counters"]["migrated"] == 40 and part["cursor"] == {"lastId": 39}
    intent = part["inflight"]["ids"]
    assert intent == list(range(40, 80))
    assert db.orders.count_documents({"_id": {"$in": intent}, "__v": 1}) == 40

    partitions.update_one({"_id": part["_id"]}, {"$set": {"lease.renewedAt": EPOCH}})
    finished = cli("background", "run", "--all")
    assert finished.exit_code == 0, finished.stderr

    state = db["_migronaut_background"].find_one({"_id": NAME})
    assert state is not None and state["status"] == "completed"
    assert db.orders.count_documents({"__v": 1, "__rev": 1}) == 120
    assert state["totals"]["migrated"] == 120  # the crashed batch counted once, by recovery
    assert state["totals"]["scanned"] == 120
    assert "inflight" not in (partitions.find_one({"background": NAME}) or {})


def _live_leases(db: Any) -> int:
    """Leases renewed within their own TTL (server time), as the store judges them."""
    return db["_migronaut_background_partitions"].count_documents(
        {
            "background": NAME,
            "lease": {"$exists": True},
            "$expr": {"$gte": ["$lease.renewedAt", {"$subtract": ["$$NOW", "$lease.ttlMs"]}]},
        }
    )


class _LeaseSampler:
    """Samples live leases every 50 ms in a thread; ``peak`` is the most seen at once."""

    def __init__(self, db: Any) -> None:
        self.db, self.peak = db, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _live_leases(self.db))
            self._stop.wait(0.05)

    def __enter__(self) -> _LeaseSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


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

    sampler = _LeaseSampler(db).__enter__()
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
        sampler.__exit__()
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
    assert 0 < sampler.peak <= MAX_PARALLEL
    # no fenced checkpoint landed and no written batch went uncounted: the totals are exact
    totals = state.get("totals") or {}
    assert totals.get("migrated") == DOCS
    assert totals.get("scanned") == DOCS
    assert state.get("badIds") == []
    # clean shutdown released every lease
    assert db["_migronaut_background_partitions"].count_documents(
        {"background": NAME, "lease": {"$exists": True}}
    ) == 0


#: Every document whose ``_id`` ends in 50 takes longer than the short worker's lease TTL.
SLOW_EVERY_HUNDRED = """
import time

def migrate(doc, ctx):
    if doc["_id"] % 100 == 50:
        time.sleep(3.5)  # longer than a 2 s lease, far shorter than a 600 s one
    doc["total_cents"] = int(round(doc["total"] * 100))
    return doc

background = {
    "collection": "orders",
    "from": 0,
    "to": 1,
    "migrate": migrate,
    "batch_size": 25,
    "pause_ms": 0,
    "slice_ms": 60000,
    "max_parallel": 2,
    "adaptive": False,
    "partitions": {"min_partition_docs": 100},
}
"""


def test_workers_with_different_lease_ttls_never_take_each_others_live_slots(
    project: Any, db: Any, cli: Any, cli_process: Any
) -> None:
    """A worker with ``MIGRONAUT_LOCK_TTL=600`` holds both slots and stalls 3.5 s inside a batch
    (its heartbeat renews every 300 s); a worker with a 2 s TTL polls for a slot meanwhile. Judged
    by the looking process's TTL, the short worker would reap the long worker's live leases and
    more lanes than ``max_parallel`` would be working; judged by each lease's own ``ttlMs``, no
    lease is ever reclaimed while its holder lives, and the totals are exact."""
    docs = 400
    db.orders.insert_many([{"_id": i, "total": i / 7} for i in range(docs)])
    project.write_migration("0001_orders_v1", SLOW_EVERY_HUNDRED)
    assert cli("up").exit_code == 0
    partitions = db["_migronaut_background_partitions"]

    with _LeaseSampler(db) as sampler:
        long_worker = cli_process.start("background", "work", "--lanes", "2",
                                        env={"MIGRONAUT_LOCK_TTL": "600"})
        deadline = time.monotonic() + 60
        while partitions.count_documents({"background": NAME, "lease.ttlMs": 600_000}) < 2:
            assert time.monotonic() < deadline, "the long-TTL worker never held both slots"
            time.sleep(0.05)
        short_worker = cli_process.start("background", "work", "--lanes", "2",
                                         env={"MIGRONAUT_LOCK_TTL": "2"})
        try:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                state = db["_migronaut_background"].find_one({"_id": NAME}) or {}
                if state.get("status") in ("completed", "failed"):
                    break
                time.sleep(0.25)
        finally:
            for worker in (long_worker, short_worker):
                worker.send_signal(signal.SIGTERM)
            for worker in (long_worker, short_worker):
                worker.wait(60)

    state = db["_migronaut_background"].find_one({"_id": NAME})
    assert state is not None and state["status"] == "completed", state
    assert sampler.peak == 2  # both slots were held, never more
    # nothing was reclaimed: no process died, so no lease may have been taken from its holder
    assert (state.get("totals") or {}).get("reclaims", 0) == 0
    assert db.orders.count_documents({"__v": 1, "__rev": 1}) == docs
    assert state["totals"]["migrated"] == docs and state["totals"]["scanned"] == docs
