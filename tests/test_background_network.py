"""Network faults with real worker processes: connections cut at random under two workers.

Two ``migronaut background work`` processes reach the server through a TCP proxy
(``tests/helpers/proxy.py``) that cuts every live connection every 0.5–1.5 s while they migrate
2,000 documents; meanwhile the application writes other fields of the same documents through a
direct connection. A cut connection is what a flaky network, a restarted load balancer or a
replica-set election looks like to a lane: an outage, ridden out (not a failed slice), and a
write whose reply was lost is counted once — so the migration completes, every document is
migrated exactly once, the totals are exact and no application write is lost.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from typing import Any

import pytest
from pymongo import MongoClient

from helpers.engine import wait_until
from helpers.proxy import TcpProxy, cutting_connections

pytestmark = pytest.mark.slow

DOCS = 2000
NAME = "0001_orders_v1.py"

MIGRATION = '''
import time


def migrate(doc, ctx):
    time.sleep(0.015)  # slow enough that the run spans many cuts
    doc["total_cents"] = int(round(doc["total"] * 100))
    return doc


background = {
    "collection": "orders",
    "from": 0,
    "to": 1,
    "migrate": migrate,
    "batch_size": 40,
    "pause_ms": 0,
    "slice_ms": 3000,
    "max_parallel": 4,
    "max_slice_failures": 1,
    "adaptive": False,
    "partitions": {"min_partition_docs": 100},
}
'''


class _ApplicationWrites:
    """The application: sets a field of its own on random documents (never the version or the
    revision), through its own connection, until stopped; remembers what it wrote."""

    def __init__(self, uri: str, db_name: str) -> None:
        self.client: MongoClient[dict[str, Any]] = MongoClient(uri)
        self.orders = self.client[db_name].orders
        self.written: dict[int, set[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rng = random.Random(3)
        for n in range(100_000):  # bounded; stopped long before
            if self._stop.wait(0.01):
                return
            doc_id = rng.randrange(DOCS)
            field = f"app_{n}"
            self.orders.update_one({"_id": doc_id}, {"$set": {field: n}})
            self.written.setdefault(doc_id, set()).add(field)

    def __enter__(self) -> _ApplicationWrites:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.client.close()


def test_workers_behind_a_connection_cutting_proxy_complete_with_exact_totals(
    project: Any, db: Any, cli: Any, cli_process: Any, mongo_uri: str
) -> None:
    for start in range(0, DOCS, 200):  # the dev server's inserts slow down with size: chunk them
        db.orders.insert_many([{"_id": i, "total": i / 7} for i in range(start, start + 200)])
    db.orders.create_index([("__v", 1), ("_id", 1)])
    project.write_migration("0001_orders_v1", MIGRATION)
    assert cli("up").exit_code == 0
    states = db["_migronaut_background"]

    def status() -> str | None:
        found = states.find_one({"_id": NAME}, {"status": 1})
        return None if found is None else str(found["status"])

    with TcpProxy.in_front_of(mongo_uri) as proxy, _ApplicationWrites(mongo_uri, db.name) as app:
        env = {"MIGRONAUT_URI": proxy.uri, "MIGRONAUT_LOCK_TTL": "5"}
        workers = [cli_process.start("background", "work", "--lanes", "2", "--poll", "0.2",
                                     env=env) for _ in range(2)]
        cuts_while_running = 0
        with cutting_connections(proxy, 0.5, 1.5, 40.0):
            deadline = time.monotonic() + 90
            while status() not in ("completed", "failed") and time.monotonic() < deadline:
                cuts_while_running = proxy.cuts
                time.sleep(0.2)
        final = status()
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        results = [cli_process.wait(worker, timeout=60) for worker in workers]

    state = states.find_one({"_id": NAME})
    assert state is not None
    assert final == "completed", (final, state.get("lastError"),
                                  [r.stderr[-2000:] for r in results])
    assert cuts_while_running >= 3, "the run ended before the faults did anything"
    assert all(r.exit_code == 0 for r in results), [r.stderr[-2000:] for r in results]

    # every document migrated, its revision raised exactly once
    assert db.orders.count_documents({"__v": 1, "__rev": 1}) == DOCS
    assert db.orders.count_documents({"total_cents": {"$exists": True}}) == DOCS
    # the totals are exact: no lost reply went uncounted, none counted twice
    totals = state.get("totals") or {}
    assert totals.get("migrated") == DOCS, totals
    assert totals.get("scanned") == DOCS, totals
    assert state.get("badIds") == [] and not state.get("failedPartitions")
    # no application write was lost
    assert app.written
    for doc_id, fields in app.written.items():
        doc = db.orders.find_one({"_id": doc_id}) or {}
        assert fields <= set(doc), (doc_id, sorted(fields - set(doc)))
    # clean shutdown released every lease
    wait_until(lambda: db["_migronaut_background_partitions"].count_documents(
        {"background": NAME, "lease": {"$exists": True}}) == 0, timeout=10,
        what="leases released")


def _command_on(command: str, collection: str) -> bytes:
    """The bytes of a command's first element naming ``collection`` (a BSON string)."""
    name = collection.encode() + b"\x00"
    return b"\x02" + command.encode() + b"\x00" + len(name).to_bytes(4, "little") + name


LATE_WRITE = '''
def migrate(doc, ctx):
    doc["total_cents"] = int(round(doc["total"] * 100))
    return doc


background = {
    "collection": "orders",
    "from": 1,
    "to": 2,
    "migrate": migrate,
    "batch_size": 40,
    "pause_ms": 0,
    "max_parallel": 1,
    "max_slice_failures": 1,
    "adaptive": False,
    "partitions": {"min_partition_docs": 100},
}
'''


def test_a_write_that_lands_after_its_lane_moved_on_is_counted_once(
    project: Any, db: Any, cli: Any, cli_process: Any, mongo_uri: str
) -> None:
    """The lane's first guarded write (and its one retry) never get a reply: their connections
    are cut while the requests are still on their way, and the server applies them only later —
    after the lane rode the outage out and started again from its partition, just before it
    reads on. Whatever of its last batch the lane finds not yet written it writes itself,
    guarded, so each document is counted exactly once, whoever's write landed."""
    docs = 400
    db.orders.insert_many([{"_id": i, "__v": 1, "total": i / 7} for i in range(docs)])
    db.orders.create_index([("__v", 1), ("_id", 1)])
    project.write_migration("0001_orders_v1", LATE_WRITE)
    assert cli("up").exit_code == 0

    with TcpProxy.in_front_of(mongo_uri) as proxy:
        # the write and its retry; delivered just before the lane reads on from its cursor
        # (not before its reads by ``_id $in`` as it starts again)
        proxy.hold_requests(_command_on("update", "orders"), times=2,
                            release_on=(_command_on("find", "orders"),), release_unless=(b"$in",))
        result = cli_process("background", "run", NAME, env={"MIGRONAUT_URI": proxy.uri})
        assert proxy.held == 2 and proxy.released.is_set(), "the faults did not happen"

    assert result.exit_code == 0, result.stderr[-2000:]
    state = db["_migronaut_background"].find_one({"_id": NAME})
    assert state is not None and state["status"] == "completed", state
    assert db.orders.count_documents({"__v": 2, "__rev": 1}) == docs
    totals = state.get("totals") or {}
    assert totals.get("migrated") == docs, totals
    assert totals.get("scanned") == docs, totals
    assert state.get("badIds") == [] and not state.get("failedPartitions")
