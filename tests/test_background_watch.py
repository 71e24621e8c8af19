"""The live drift watcher: options, the standalone refusal, leadership through the
``watch:<collection>`` lock, edges, the per-document upgrade, and — on a replica set — streams.

The dev server has no change streams, so everything that needs one is marked ``replica_set`` (it
runs with ``MIGRONAUT_TEST_URI`` pointing at a replica set). Leadership, fencing, handover, the
follower loop up to the stream, and the upgrade of one drifted document (what the stream does per
event) are driven here without a stream.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from bson import ObjectId, Timestamp
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from helpers.engine import captured_logger, wait_until
from migronaut.background.engine import BackgroundEngine
from migronaut.background.planning.job import load_job
from migronaut.background.planning.spec import resolve_background
from migronaut.background.state.store import BackgroundStore
from migronaut.background.tools.watch import (
    Follower,
    Watcher,
    backoff_s,
    change_pipeline,
    classify_stream_error,
    event_lag_ms,
    load_edges,
    upgrade_document,
    watch_options,
)
from migronaut.core.context import Cancellation
from migronaut.errors import ConfigInvalidError, ConnectionFailedError, RunAbortedError

if TYPE_CHECKING:
    from pymongo.database import Database

V1_TO_V2 = "20250101000000_v1_to_v2.py"
V2_TO_V3 = "20250102000000_v2_to_v3.py"
LOCKS = "_migronaut_locks"
WATCH = "_migronaut_background_watch"


def migration_source(start: int, end: int, *, transform: str = "", extra: str = "") -> str:
    """A declarative background migration on ``items`` that upper-cases ``name``; ``HOOK`` (set
    by a test through the function's globals) runs first on every call."""
    body = transform or "doc['name'] = str(doc.get('name', '')).upper()"
    return (
        "HOOK = None\n\n\n"
        "def migrate(doc, ctx):\n"
        "    if HOOK is not None:\n"
        "        HOOK(doc, ctx)\n"
        f"    {body}\n"
        "    return doc\n\n\n"
        f"background = {{'collection': 'items', 'from': {start}, 'to': {end}, "
        f"'migrate': migrate{extra}}}\n"
    )


@dataclass
class Harness:
    engine: BackgroundEngine
    db: Database[dict[str, Any]]
    directory: Path
    logs: Any
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, event: str, payload: dict[str, Any]) -> None:
        with self._lock:
            self.events.append((event, dict(payload)))

    def of(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [payload for event, payload in self.events if event == name]

    def engine_twin(self) -> BackgroundEngine:
        """A second engine on the same database (another process, as far as locks go)."""
        return BackgroundEngine(
            db=self.db, store=BackgroundStore(self.db), directory=self.directory,
            lock_collection=self.db[LOCKS], lock_ttl_ms=30_000, logger=self.engine.logger,
            emit=self.record,
        )

    def write(self, name: str, source: str) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / name
        path.write_text(source, encoding="utf-8")
        return path

    def complete(self, name: str, start: int = 1, end: int = 2, **kwargs: Any) -> None:
        """Write the file, register it pinned to that file, and complete it (no lanes)."""
        self.write(name, migration_source(start, end, **kwargs))
        job = load_job(self.directory, name)
        self.engine.store.register(name, status="pending", direction="forward",
                                   mode="declarative", collection="items",
                                   spec=dict(job.resolved.spec), checksum=job.checksum)
        assert self.engine.store.move(name, "plan") is not None
        assert self.engine.store.move(name, "complete") is not None

    def register_only(self, name: str, start: int, end: int, *, direction: str = "forward",
                      collection: str = "items") -> None:
        spec = resolve_background(name, {"collection": collection, "from": start, "to": end,
                                         "migrate": _identity, "revert": _identity}).spec
        self.engine.store.register(name, status="pending", direction=direction,
                                   mode="declarative", collection=collection, spec=spec,
                                   checksum="c" * 64)

    def status_of(self, name: str) -> str:
        state = self.engine.store.get(name)
        assert state is not None
        return str(state["status"])


def _identity(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return doc


@pytest.fixture
def harness(db: Database[dict[str, Any]], tmp_path: Path) -> Iterator[Harness]:
    with captured_logger() as (logger, handler):
        box: list[Harness] = []
        engine = BackgroundEngine(
            db=db, store=BackgroundStore(db), directory=tmp_path / "migrations",
            lock_collection=db[LOCKS], lock_ttl_ms=30_000, logger=logger,
            emit=lambda event, payload: box[0].record(event, payload),
        )
        box.append(Harness(engine, db, tmp_path / "migrations", handler))
        yield box[0]


def watch_locks(db: Database[dict[str, Any]]) -> list[dict[str, Any]]:
    return list(db[LOCKS].find({"_id": {"$regex": "^watch:"}}))


def no_ids_anywhere(harness: Harness, *ids: Any) -> None:
    texts = [json.dumps(p, default=str) for _, p in harness.events] + harness.logs.messages
    for text in texts:
        for doc_id in ids:
            assert str(doc_id) not in text


# ------------------------------------------------------------------------------------ options


def test_default_options() -> None:
    options = watch_options()
    assert (options.collections, options.upgrade, options.refresh_ms, options.checkpoint_ms,
            options.leader_retry_ms, options.max_collections, options.max_lag_ms,
            options.on_drift) == (None, True, 30_000, 5000, 10_000, 16, 60_000, "reopen")


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"refreshMs": 1000}, "Unknown watch option 'refreshMs' (did you mean 'refresh_ms'?)"),
        ({"signal": object()}, "Unknown watch option 'signal' (pass a Cancellation as "
                               "'cancellation')"),
        ({"uprade": True}, "Unknown watch option 'uprade' (did you mean 'upgrade'?)"),
        ({"refresh_ms": 99}, "refresh_ms must be an integer from 100 to 3600000, got 99"),
        ({"refresh_ms": 3_600_001}, "refresh_ms must be an integer from 100 to 3600000"),
        ({"refresh_ms": 1000.0}, "refresh_ms must be an integer"),
        ({"checkpoint_ms": 9}, "checkpoint_ms must be an integer from 10 to 3600000"),
        ({"leader_retry_ms": True}, "leader_retry_ms must be an integer from 10 to 3600000"),
        ({"max_collections": 0}, "max_collections must be an integer from 1 to 1000"),
        ({"max_collections": 1001}, "max_collections must be an integer from 1 to 1000"),
        ({"max_lag_ms": 0}, "max_lag_ms must be an integer from 1 to 86400000"),
        ({"max_lag_ms": 86_400_001}, "max_lag_ms must be an integer from 1 to 86400000"),
        ({"collections": []}, "collections must not be empty"),
        ({"collections": "items"}, "collections must be a list of collection names"),
        ({"collections": ["items", ""]}, "collections must hold non-empty strings"),
        ({"upgrade": "no"}, "upgrade must be True or False"),
        ({"on_drift": "upgrade"}, "on_drift must be 'reopen' or 'report'"),
        ({"on_error": "log"}, "on_error must be callable"),
        ({"cancellation": threading.Event()}, "cancellation must be a migronaut Cancellation"),
    ],
)
def test_bad_options_are_refused(options: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigInvalidError) as caught:
        watch_options(**options)
    assert fragment in caught.value.message
    assert caught.value.exit_code == 6


def test_options_are_validated_before_connecting(tmp_path: Path) -> None:
    unreachable: MongoClient[dict[str, Any]] = MongoClient(
        "mongodb://127.0.0.1:9/", serverSelectionTimeoutMS=300, connect=False)
    try:
        db = unreachable["nowhere"]
        engine = BackgroundEngine(
            db=db, store=BackgroundStore(db), directory=tmp_path, lock_collection=db[LOCKS],
            lock_ttl_ms=30_000, logger=logging.getLogger("test.watch.nowhere"),
            emit=lambda event, payload: None,
        )
        with pytest.raises(ConfigInvalidError, match="max_lag_ms"):
            engine.watch(max_lag_ms=0)
        with pytest.raises(ConnectionFailedError):
            engine.watch(max_lag_ms=1000)  # valid options: now it asks the server
    finally:
        unreachable.close()


# ------------------------------------------------------------------------------------ standalone


@pytest.mark.standalone
def test_a_standalone_is_refused_before_anything_happens(harness: Harness) -> None:
    harness.complete(V1_TO_V2)

    with pytest.raises(ConfigInvalidError) as caught:
        harness.engine.watch()

    error = caught.value
    assert error.code == "CONFIG_INVALID" and error.exit_code == 6
    assert error.context == {"backgroundDrift": "stream"}
    assert "needs change streams" in error.message and "standalone" in error.message
    assert watch_locks(harness.db) == []
    assert harness.db[WATCH].count_documents({}) == 0
    assert harness.of("background:watch") == []
    assert not any(t.name.startswith("migronaut-watch") for t in threading.enumerate())


@pytest.mark.standalone
def test_a_standalone_is_refused_by_start_and_the_context_manager(harness: Harness) -> None:
    watcher = Watcher(harness.engine, refresh_ms=100)
    with pytest.raises(ConfigInvalidError):
        watcher.start()
    assert not watcher.running
    with pytest.raises(ConfigInvalidError), Watcher(harness.engine):
        pytest.fail("the body must not run")


# ------------------------------------------------------------------------------------ leadership


def test_one_leader_per_collection_the_second_follows(harness: Harness) -> None:
    first = Watcher(harness.engine).follower("items")
    second = Watcher(harness.engine_twin()).follower("items")

    assert first.try_lead() is True
    assert second.try_lead() is False

    assert (first.leading, second.leading, second.state) == (True, False, "following")
    assert {"collection": "items", "state": "following"} in harness.of("background:watch")
    locks = watch_locks(harness.db)
    assert [(lock["_id"], lock["owner"]) for lock in locks] == [("watch:items", first.owner)]
    row = harness.db[WATCH].find_one({"_id": "items"})
    assert row is not None
    assert row["leader"]["owner"] == first.owner
    assert set(row["leader"]) == {"owner", "host", "pid", "at"}
    assert row["counters"] == {"events": 0, "upgraded": 0, "failed": 0, "skipped": 0}
    assert second.save(force=True) is False  # a follower never writes the watch document
    first.release()


def test_leadership_is_per_collection(harness: Harness) -> None:
    watcher = Watcher(harness.engine)
    other = Watcher(harness.engine_twin())
    assert watcher.follower("items").try_lead()
    assert other.follower("orders").try_lead()
    assert sorted(lock["_id"] for lock in watch_locks(harness.db)) == [
        "watch:items", "watch:orders"]
    watcher.stop()
    other.stop()
    assert watch_locks(harness.db) == []


def test_a_deposed_leader_is_fenced_out_and_stands_down(harness: Harness) -> None:
    leader = Watcher(harness.engine).follower("items")
    assert leader.try_lead()
    leader.counters["upgraded"] += 3
    harness.db[WATCH].update_one({"_id": "items"}, {"$set": {"leader.owner": "someone-else"}})

    assert leader.save(force=True) is False

    assert leader.leading is False
    assert watch_locks(harness.db) == []  # it gave the lock up
    row = harness.db[WATCH].find_one({"_id": "items"})
    assert row is not None and row["counters"]["upgraded"] == 0  # its save did not land
    assert harness.logs.has("another watcher leads this collection now")


def test_handover_keeps_position_and_counters(harness: Harness) -> None:
    token = {"_data": "8263A1B2C3000000012B022C0100296E5A1004"}
    harness.db[WATCH].insert_one({"_id": "items", "resumeToken": token, "state": "stopped",
                                  "counters": {"events": 5, "upgraded": 2, "failed": 0,
                                               "skipped": 1}})
    first = Watcher(harness.engine).follower("items")
    second = Watcher(harness.engine_twin()).follower("items")
    assert first.try_lead()
    assert first.resume_token == token
    assert not second.try_lead()
    first.counters["events"] += 2
    first.counters["upgraded"] += 1

    first.release()

    row = harness.db[WATCH].find_one({"_id": "items"})
    assert row is not None
    assert row["state"] == "stopped"
    assert row["resumeToken"] == token  # the position is saved on stop
    assert row["counters"] == {"events": 7, "upgraded": 3, "failed": 0, "skipped": 1}
    assert watch_locks(harness.db) == []
    assert second.try_lead()
    assert second.resume_token == token
    row = harness.db[WATCH].find_one({"_id": "items"})
    assert row is not None and row["leader"]["owner"] == second.owner
    assert row["counters"]["upgraded"] == 3
    second.release()


def test_watch_status_never_returns_the_token(harness: Harness) -> None:
    harness.db[WATCH].insert_one({"_id": "items", "resumeToken": {"_data": "x"},
                                  "state": "streaming", "counters": {"upgraded": 1}})
    rows = harness.engine.watch_status()
    assert rows == [{"collection": "items", "state": "streaming", "counters": {"upgraded": 1}}]
    assert harness.engine.watch_status("orders") == []


def test_stop_releases_every_follower(harness: Harness) -> None:
    watcher = Watcher(harness.engine)
    assert watcher.follower("items").try_lead()
    assert watcher.follower("orders").try_lead()

    watcher.stop()

    assert watch_locks(harness.db) == []
    assert [(row["collection"], row["state"], row["leading"]) for row in watcher.status()] == [
        ("items", "stopped", False), ("orders", "stopped", False)]
    assert {row["_id"]: row["state"] for row in harness.db[WATCH].find()} == {
        "items": "stopped", "orders": "stopped"}


def test_a_follower_thread_follows_then_takes_over_when_the_leader_stops(
    harness: Harness
) -> None:
    harness.complete(V1_TO_V2)
    leader = Watcher(harness.engine).follower("items")
    assert leader.try_lead()
    watcher = Watcher(harness.engine_twin(), leader_retry_ms=20, refresh_ms=100)
    follower = watcher.follower("items")
    follower.start()
    try:
        wait_until(lambda: follower.state == "following", what="the follower to follow")
        assert not follower.leading
        leader.release()
        wait_until(lambda: follower.leading, what="the follower to take over")
        row = harness.db[WATCH].find_one({"_id": "items"})
        assert row is not None and row["leader"]["owner"] == follower.owner
    finally:
        watcher.stop()
    assert follower.ended == "stopped"
    assert follower.state == "stopped"
    assert watch_locks(harness.db) == []


def test_an_unsettled_revert_suspends_the_follower(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    harness.register_only(V2_TO_V3, 2, 3, direction="revert")
    watcher = Watcher(harness.engine, refresh_ms=100)
    follower = watcher.follower("items")
    follower.start()
    try:
        wait_until(lambda: follower.state == "suspended", what="suspended")
        assert not follower.leading and watch_locks(harness.db) == []
    finally:
        watcher.stop()


def test_a_collection_without_edges_ends_its_follower(harness: Harness) -> None:
    watcher = Watcher(harness.engine, refresh_ms=100)
    follower = watcher.follower("items")
    follower.start()
    assert follower.thread is not None
    follower.thread.join(10)
    assert follower.ended == "gone"
    assert watch_locks(harness.db) == []
    watcher.stop()


def test_followed_collections_are_filtered_sorted_and_capped(harness: Harness) -> None:
    for index, collection in enumerate(("zebras", "apples", "mangos", "kiwis")):
        name = f"2025010100000{index}_c.py"
        harness.register_only(name, 1, 2, collection=collection)
        harness.engine.store.move(name, "plan")
        harness.engine.store.move(name, "complete")
    harness.register_only("20250102000000_open.py", 1, 2, collection="pears")

    assert Watcher(harness.engine).followed_collections() == [
        "apples", "kiwis", "mangos", "zebras"]
    assert Watcher(harness.engine, collections=["kiwis", "pears", "zebras"]) \
        .followed_collections() == ["kiwis", "zebras"]
    capped = Watcher(harness.engine, max_collections=2)
    assert capped.followed_collections() == ["apples", "kiwis"]
    assert capped.followed_collections() == ["apples", "kiwis"]
    assert len([m for m in harness.logs.messages if "follows 2 of 4 collections" in m]) == 1


# ------------------------------------------------------------------------------------ edges


def test_edges_are_keyed_by_from_first_registered_wins(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    harness.complete(V2_TO_V3, 2, 3)
    harness.complete("20250103000000_other_v1.py", 1, 3)
    harness.register_only("20250104000000_v3_to_v4.py", 3, 4)

    edges = load_edges(harness.engine, "items")

    assert edges is not None
    assert edges.field == "__v"
    assert edges.target == 3
    assert {k: v["_id"] for k, v in edges.by_from.items()} == {1: V1_TO_V2, 2: V2_TO_V3}
    assert edges.names == [V1_TO_V2, V2_TO_V3]
    assert edges.open_froms == frozenset({3})
    assert edges.suspended is False
    assert load_edges(harness.engine, "orders") is None


# ------------------------------------------------------------------------------------ upgrading


def _job(harness: Harness, name: str) -> Any:
    state = harness.engine.store.get(name)
    assert state is not None
    return harness.engine.job(state), state


def test_upgrade_document_rewrites_one_document_with_the_guarded_write(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    harness.db["items"].insert_many([
        {"_id": 1, "__v": 1, "name": "ada", "n": 5},
        {"_id": 2, "__v": 1, "name": "bob"},
    ])
    job, state = _job(harness, V1_TO_V2)

    outcome = upgrade_document(harness.db, job, state, {"_id": 1})

    assert outcome.kind == "migrated"
    assert harness.db["items"].find_one({"_id": 1}) == {
        "_id": 1, "__v": 2, "name": "ADA", "n": 5, "__rev": 1}
    assert harness.db["items"].find_one({"_id": 2}) == {"_id": 2, "__v": 1, "name": "bob"}
    assert upgrade_document(harness.db, job, state, {"_id": 1}).kind == "gone"  # at target
    assert upgrade_document(harness.db, job, state, {"_id": 99}).kind == "gone"


def test_upgrade_document_respects_failed_ids_and_the_filter(harness: Harness) -> None:
    harness.complete(V1_TO_V2, extra=", 'filter': {'kind': 'order'}")
    harness.db["items"].insert_many([{"_id": 1, "__v": 1, "kind": "invoice"},
                                     {"_id": 2, "__v": 1, "kind": "order"}])
    job, state = _job(harness, V1_TO_V2)

    assert upgrade_document(harness.db, job, state, {"_id": 1}).kind == "gone"
    assert upgrade_document(harness.db, job, {**state, "badIds": [2]}, {"_id": 2}).kind == "gone"
    assert upgrade_document(harness.db, job, state, {"_id": 2}).kind == "migrated"


def test_upgrade_document_loses_to_application_writes_then_gives_up(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    harness.db["items"].insert_one({"_id": 1, "__v": 1, "__rev": 4, "name": "ada"})
    job, state = _job(harness, V1_TO_V2)
    calls: list[int] = []

    def application_write(doc: dict[str, Any], ctx: Any) -> None:
        calls.append(1)  # an application write lands between our read and our write
        harness.db["items"].update_one({"_id": doc["_id"]},
                                       {"$inc": {"__rev": 1}, "$set": {"status": "paid"}})

    job.functions.migrate.__globals__["HOOK"] = application_write

    outcome = upgrade_document(harness.db, job, state, {"_id": 1})

    assert outcome.kind == "conflict"
    assert len(calls) == 4  # maxConflictRetries (3) + 1, each from a fresh read
    doc = harness.db["items"].find_one({"_id": 1})
    assert doc == {"_id": 1, "__v": 1, "__rev": 8, "name": "ada", "status": "paid"}


def test_upgrade_document_reports_document_errors_without_the_id(harness: Harness) -> None:
    harness.complete(V1_TO_V2, transform="raise ValueError(f'bad document {doc[\"_id\"]}')")
    doc_id = ObjectId()
    harness.db["items"].insert_one({"_id": doc_id, "__v": 1})
    job, state = _job(harness, V1_TO_V2)

    outcome = upgrade_document(harness.db, job, state, {"_id": doc_id})

    assert (outcome.kind, outcome.reason) == ("failed", "transform")
    assert outcome.error is not None and "ValueError: bad document" in outcome.error
    assert str(doc_id) not in outcome.error


def test_upgrade_document_refuses_a_result_without_id(harness: Harness) -> None:
    harness.complete(V1_TO_V2, transform="doc = {'name': 'x'}")
    harness.db["items"].insert_one({"_id": 1, "__v": 1})
    job, state = _job(harness, V1_TO_V2)

    outcome = upgrade_document(harness.db, job, state, {"_id": 1})

    assert (outcome.kind, outcome.reason) == ("failed", "shape")
    assert harness.db["items"].find_one({"_id": 1}) == {"_id": 1, "__v": 1}


def _follower(harness: Harness, **options: Any) -> tuple[Follower, Any]:
    follower = Watcher(harness.engine, **options).follower("items")
    edges = load_edges(harness.engine, "items")
    assert edges is not None
    return follower, edges


def test_a_chain_is_followed_edge_by_edge(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    harness.complete(V2_TO_V3, 2, 3, transform="doc['tag'] = 'v3'")
    harness.db["items"].insert_one({"_id": "u-1", "__v": 1, "name": "ada"})
    follower, edges = _follower(harness)

    follower.upgrade({"_id": "u-1"}, edges)

    assert harness.db["items"].find_one({"_id": "u-1"}) == {
        "_id": "u-1", "__v": 3, "name": "ADA", "__rev": 2, "tag": "v3"}
    assert follower.counters == {"events": 0, "upgraded": 2, "failed": 0, "skipped": 0}
    assert harness.of("background:drift") == [
        {"migration": V1_TO_V2, "collection": "items", "source": "stream", "action": "upgraded"},
        {"migration": V2_TO_V3, "collection": "items", "source": "stream", "action": "upgraded"},
    ]
    assert harness.logs.has(f"✔ items: upgraded ({V2_TO_V3})")
    no_ids_anywhere(harness, "u-1")


def test_a_document_already_upgraded_is_skipped(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    harness.db["items"].insert_one({"_id": 1, "__v": 2})
    follower, edges = _follower(harness)

    follower.upgrade({"_id": 1}, edges)
    follower.upgrade({"_id": 404}, edges)

    assert follower.counters["skipped"] == 2
    assert harness.of("background:drift") == []


def test_report_only_never_writes(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    harness.db["items"].insert_one({"_id": 1, "__v": 1, "name": "ada"})
    follower, edges = _follower(harness, upgrade=False)

    follower.upgrade({"_id": 1}, edges)

    assert harness.db["items"].find_one({"_id": 1}) == {"_id": 1, "__v": 1, "name": "ada"}
    assert harness.of("background:drift") == [
        {"migration": V1_TO_V2, "collection": "items", "source": "stream", "action": "reported"}]
    assert harness.status_of(V1_TO_V2) == "completed"
    assert harness.logs.has(f"⚠ items: reported ({V1_TO_V2})")


def test_a_version_without_an_edge_is_reported(harness: Harness) -> None:
    harness.complete(V2_TO_V3, 2, 3)
    harness.db["items"].insert_one({"_id": 1, "name": "no version at all"})
    follower, edges = _follower(harness)

    follower.upgrade({"_id": 1}, edges)

    assert harness.of("background:drift") == [
        {"migration": V2_TO_V3, "collection": "items", "source": "stream", "action": "reported"}]
    assert harness.db["items"].find_one({"_id": 1}) == {"_id": 1, "name": "no version at all"}


def test_a_version_an_open_migration_owns_is_left_to_it(harness: Harness) -> None:
    harness.complete(V2_TO_V3, 2, 3)
    harness.register_only(V1_TO_V2, 1, 2)  # running again (e.g. reopened by the poll)
    harness.db["items"].insert_one({"_id": 1, "__v": 1})
    follower, edges = _follower(harness)

    follower.upgrade({"_id": 1}, edges)

    assert follower.counters["skipped"] == 1
    assert harness.of("background:drift") == []


def test_a_changed_file_hands_the_document_back(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    harness.write(V1_TO_V2, migration_source(1, 2) + "# edited after registration\n")
    harness.db["items"].insert_one({"_id": 1, "__v": 1})
    follower, edges = _follower(harness)

    follower.upgrade({"_id": 1}, edges)

    assert harness.db["items"].find_one({"_id": 1}) == {"_id": 1, "__v": 1}  # never other code
    assert harness.status_of(V1_TO_V2) == "running"  # handed back: reopened
    assert harness.of("background:drift") == [
        {"migration": V1_TO_V2, "collection": "items", "source": "stream", "action": "reopened"}]


def test_a_document_error_counts_failed_and_reopens(harness: Harness) -> None:
    harness.complete(V1_TO_V2, transform="raise RuntimeError('no')")
    harness.db["items"].insert_one({"_id": 1, "__v": 1})
    follower, edges = _follower(harness)

    follower.upgrade({"_id": 1}, edges)

    assert follower.counters["failed"] == 1
    assert harness.of("background:drift") == [
        {"migration": V1_TO_V2, "collection": "items", "source": "stream", "action": "failed"}]
    assert harness.status_of(V1_TO_V2) == "running"
    assert follower.last_error == "transform: RuntimeError: no"


def test_a_document_error_in_report_mode_changes_no_state(harness: Harness) -> None:
    harness.complete(V1_TO_V2, transform="raise RuntimeError('no')")
    harness.db["items"].insert_one({"_id": 1, "__v": 1})
    follower, edges = _follower(harness, on_drift="report")

    follower.upgrade({"_id": 1}, edges)

    assert harness.status_of(V1_TO_V2) == "completed"
    assert [e["action"] for e in harness.of("background:drift")] == ["failed"]


# ------------------------------------------------------------------------------------ pure parts


def test_the_change_pipeline_keeps_only_old_shape_writes(db: Database[dict[str, Any]]) -> None:
    """The ``$match``/``$project`` stages judged by the server on change-event-shaped documents."""
    events: list[tuple[int, dict[str, Any], bool]] = [
        (1, {"operationType": "insert", "fullDocument": {"__v": 1}}, True),
        (2, {"operationType": "insert", "fullDocument": {"__v": 3}}, False),
        (3, {"operationType": "insert", "fullDocument": {"name": "x"}}, True),
        (4, {"operationType": "replace", "fullDocument": {"__v": None}}, True),
        (5, {"operationType": "insert", "fullDocument": {"__v": "1"}}, False),
        (6, {"operationType": "update", "updateDescription": {
            "updatedFields": {"__v": 2}, "removedFields": []}}, True),
        (7, {"operationType": "update", "updateDescription": {
            "updatedFields": {"name": "y"}, "removedFields": []}}, False),
        (8, {"operationType": "update", "updateDescription": {
            "updatedFields": {"__v": None}, "removedFields": []}}, True),
        (9, {"operationType": "update", "updateDescription": {
            "updatedFields": {}, "removedFields": ["__v"]}}, True),
        (10, {"operationType": "update", "updateDescription": {
            "updatedFields": {"__v": 3}, "removedFields": []}}, False),
        (11, {"operationType": "delete"}, False),
        (12, {"operationType": "drop"}, True),
        (13, {"operationType": "invalidate"}, True),
        (14, {"operationType": "rename"}, True),
        (15, {"operationType": "dropDatabase"}, True),
    ]
    db["events"].insert_many([
        {"_id": i, **event, "documentKey": {"_id": i}, "clusterTime": Timestamp(1, i),
         "ns": {"db": "app", "coll": "items"}}
        for i, event, _ in events
    ])

    out = list(db["events"].aggregate(change_pipeline("__v", 3)))

    assert sorted(doc["_id"] for doc in out) == [i for i, _, kept in events if kept]
    for doc in out:  # no document data travels with an event
        assert set(doc) <= {"_id", "operationType", "documentKey", "clusterTime"}


def test_backoff_doubles_up_to_thirty_seconds() -> None:
    assert [backoff_s(n) for n in (0, 1, 2, 3)] == [0.25, 0.5, 1.0, 2.0]
    assert backoff_s(7) == 30.0 and backoff_s(1000) == 30.0


@pytest.mark.parametrize(
    ("code", "labels", "kind"),
    [
        (286, [], "history-lost"),
        (280, [], "history-lost"),
        (136, [], "history-lost"),
        (1, ["NonResumableChangeStreamError"], "history-lost"),
        (13, [], "unauthorized"),
        (40573, [], "standalone"),
        (6, [], "retry"),
        (None, [], "retry"),
    ],
)
def test_stream_errors_are_classified(code: int | None, labels: list[str], kind: str) -> None:
    details = {"ok": 0, "errmsg": "x", "code": code, "errorLabels": labels}
    assert classify_stream_error(OperationFailure("x", code, details)) == kind
    assert classify_stream_error(RuntimeError("not a server error")) == "retry"


def test_event_lag_uses_the_server_clock() -> None:
    now_ms = 1_700_000_100_000.0
    assert event_lag_ms(Timestamp(1_700_000_000, 1), 0.0, now_ms) == 100_000.0
    assert event_lag_ms(Timestamp(1_700_000_000, 1), 40_000.0, now_ms) == 60_000.0
    assert event_lag_ms(None, 0.0, now_ms) is None


def test_the_callers_cancellation_stops_every_follower(harness: Harness) -> None:
    cancel = Cancellation()
    watcher = Watcher(harness.engine, cancellation=cancel)
    follower = watcher.follower("items")
    assert not follower.stop_event.cancelled
    cancel.cancel(RunAbortedError("bye"))
    assert follower.stop_event.cancelled


# ------------------------------------------------------------------------------------ streams


@pytest.mark.replica_set
def test_the_stream_upgrades_an_old_shape_insert(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    harness.db["items"].create_index([("__v", 1), ("_id", 1)])
    with harness.engine.watch(checkpoint_ms=50) as watcher:
        wait_until(lambda: [r["state"] for r in watcher.status()] == ["streaming"],
                   what="streaming")
        harness.db["items"].insert_one({"_id": "late-1", "__v": 1, "name": "ada"})
        wait_until(lambda: (harness.db["items"].find_one({"_id": "late-1"}) or {}).get("__v")
                   == 2, what="the upgrade")
    assert harness.db["items"].find_one({"_id": "late-1"}) == {
        "_id": "late-1", "__v": 2, "name": "ADA", "__rev": 1}
    assert watcher.counters["upgraded"] == 1
    assert [r["state"] for r in watcher.status()] == ["stopped"]
    states = [e["state"] for e in harness.of("background:watch")]
    assert states[:2] == ["catching-up", "streaming"] and states[-1] == "stopped"
    assert harness.of("background:drift") == [
        {"migration": V1_TO_V2, "collection": "items", "source": "stream", "action": "upgraded"}]
    row = harness.db[WATCH].find_one({"_id": "items"})
    assert row is not None and row["state"] == "stopped" and "resumeToken" in row
    assert row["counters"]["upgraded"] == 1
    assert "resumeToken" not in harness.engine.watch_status("items")[0]
    assert watch_locks(harness.db) == []
    no_ids_anywhere(harness, "late-1")


@pytest.mark.replica_set
def test_report_only_stream_reports_and_leaves_the_document(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    harness.db["items"].create_index([("__v", 1), ("_id", 1)])
    with harness.engine.watch(upgrade=False, on_drift="report") as watcher:
        wait_until(lambda: [r["state"] for r in watcher.status()] == ["streaming"])
        harness.db["items"].insert_one({"_id": 1, "__v": 1, "name": "ada"})
        wait_until(lambda: harness.of("background:drift"), what="the report")
    assert harness.of("background:drift")[0]["action"] == "reported"
    assert harness.db["items"].find_one({"_id": 1}) == {"_id": 1, "__v": 1, "name": "ada"}
    assert harness.status_of(V1_TO_V2) == "completed"


@pytest.mark.replica_set
def test_two_watchers_one_leader_and_handover_on_stop(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    harness.db["items"].create_index([("__v", 1), ("_id", 1)])
    first = harness.engine.watch(leader_retry_ms=50)
    wait_until(lambda: [r["state"] for r in first.status()] == ["streaming"])
    second = harness.engine_twin().watch(leader_retry_ms=50)
    try:
        wait_until(lambda: [r["state"] for r in second.status()] == ["following"])
        first.stop()
        wait_until(lambda: [(r["state"], r["leading"]) for r in second.status()] == [
            ("streaming", True)], what="the handover")
        harness.db["items"].insert_one({"_id": 1, "__v": 1, "name": "ada"})
        wait_until(lambda: second.counters["upgraded"] == 1, what="the new leader's upgrade")
    finally:
        first.stop()
        second.stop()
    assert watch_locks(harness.db) == []


@pytest.mark.replica_set
def test_a_restarted_watcher_resumes_where_it_stopped(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    harness.db["items"].create_index([("__v", 1), ("_id", 1)])
    with harness.engine.watch() as watcher:
        wait_until(lambda: [r["state"] for r in watcher.status()] == ["streaming"])
    harness.db["items"].insert_one({"_id": 1, "__v": 1, "name": "written while stopped"})
    harness.events.clear()
    with harness.engine.watch() as watcher:
        wait_until(lambda: watcher.counters["upgraded"] == 1, what="the replayed upgrade")
    assert "catching-up" not in [e["state"] for e in harness.of("background:watch")]
    assert harness.status_of(V1_TO_V2) == "completed"  # upgraded, not reopened
