"""Background lanes against a server: slices, batches, guarded writes, leases, budgets, pacing.

Each test registers a background migration straight through the store (state, plan, partitions),
runs slices with :func:`migronaut.background.lanes.slices.run_slice` and asserts on the stored
documents, the partition, the state and the events — reference background §4, invariants I1, I3–I6,
I10, I11, I13.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from bson import Decimal128, Int64
from pymongo import MongoClient
from pymongo.monitoring import CommandListener, CommandStartedEvent

from helpers.proxy import TcpProxy
from migronaut.background.lanes.slices import SliceResult, run_slice
from migronaut.background.planning.job import BackgroundJob, load_job
from migronaut.background.planning.spec import resolve_background
from migronaut.background.state.store import BackgroundStore
from migronaut.core.context import Cancellation
from migronaut.errors import (
    BackgroundFailedError,
    MigrationExecutionFailedError,
    MigronautError,
    RunAbortedError,
)

if TYPE_CHECKING:
    from pymongo.database import Database
    from tests.conftest import Project

NAME = "20260101000000_rewrite.py"
NUMBERS = {"kind": "id-range", "bracket": "number", "types": ["int", "long", "double", "decimal"]}
STRINGS = {"kind": "id-range", "bracket": "string", "types": ["string", "symbol"]}
EPOCH = datetime(1970, 1, 1)
log = logging.getLogger("migronaut.test")


class Events:
    """Collects emitted events in order."""

    def __init__(self) -> None:
        self.items: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, payload: dict[str, Any]) -> None:
        self.items.append((event, payload))

    def named(self, event: str) -> list[dict[str, Any]]:
        return [payload for name, payload in self.items if name == event]


def plan(
    store: BackgroundStore,
    job: BackgroundJob,
    partitions: list[dict[str, Any]] | None = None,
) -> None:
    """Register ``job`` and commit a plan of ``partitions`` (one over all numbers by default)."""
    spec = dict(job.spec)
    store.register(
        job.name, status="pending", direction=job.direction, mode=str(spec["mode"]),
        collection=spec.get("collection"), spec=spec, checksum=job.checksum,
    )
    token = uuid.uuid4().hex
    parts = partitions or [{"scope": NUMBERS, "estimate": 0}]
    store.insert_plan(job.name, 1, token, parts)
    store.update_state(job.name, {}, {
        "generation": 1, "phase": "process",
        "plan": {"token": token, "generation": 1, "partitions": len(parts)},
    })
    assert store.move(job.name, "plan") is not None


def declare(
    db: Database[dict[str, Any]],
    declared: Mapping[str, Any],
    *,
    partitions: list[dict[str, Any]] | None = None,
) -> tuple[BackgroundStore, BackgroundJob]:
    """A job built in memory from ``declared`` (functions defined by the test), registered."""
    resolved = resolve_background(NAME, dict(declared))
    job = BackgroundJob(name=NAME, path=Path(NAME), checksum="0" * 64, resolved=resolved,
                        spec=resolved.spec, direction="forward")
    store = BackgroundStore(db)
    plan(store, job, partitions)
    return store, job


def run(
    store: BackgroundStore,
    job: BackgroundJob,
    db: Database[dict[str, Any]],
    events: Events | None = None,
    *,
    cancellation: Cancellation | None = None,
    ttl_ms: int = 60_000,
    slice_ms: int | None = None,
    owner: str = "lane-1",
) -> SliceResult:
    return run_slice(
        store=store, job=job, db=db, owner=owner, ttl_ms=ttl_ms,
        cancellation=cancellation or Cancellation(), slice_ms=slice_ms,
        emit=events if events is not None else Events(), logger=log,
    )


def drain(store: BackgroundStore, job: BackgroundJob, db: Database[dict[str, Any]],
          events: Events | None = None) -> dict[str, int]:
    """Run slices until the plan is exhausted; the summed counters."""
    total: dict[str, int] = {}
    for _ in range(50):
        result = run(store, job, db, events)
        for key, value in result.counters.items():
            total[key] = total.get(key, 0) + value
        if result.outcome == "exhausted":
            return total
        assert result.outcome == "yielded", result
    raise AssertionError("the plan never ran out")


def partition(store: BackgroundStore) -> dict[str, Any]:
    doc = store.partitions.find_one({"background": NAME})
    assert doc is not None
    return doc


def seed(db: Database[dict[str, Any]], count: int, **extra: Any) -> None:
    db.items.insert_many([{"_id": i, "n": i, **extra} for i in range(count)])


def label(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
    doc["label"] = f"n{doc['n']}"
    return doc


BASE: dict[str, Any] = {
    "collection": "items", "from": 0, "to": 1, "migrate": label, "pause_ms": 0,
    "batch_size": 50, "adaptive": False,
}


# ----------------------------------------------------------------------------- happy path


def test_a_slice_migrates_every_document_once_and_keeps_untouched_bson_types(
    db: Database[dict[str, Any]], project: Project
) -> None:
    project.write_migration(NAME, """
        background = {
            "collection": "items", "from": 0, "to": 1, "batch_size": 100, "pause_ms": 0,
            "migrate": lambda doc, ctx: {**doc, "label": "n" + str(doc["n"])},
        }
    """)
    db.items.insert_many([
        {"_id": i, "n": i, "long": Int64(i), "price": Decimal128("9.990"), "ratio": 1.0}
        for i in range(600)
    ])
    db.items.create_index([("__v", 1), ("_id", 1)])
    job = load_job(project.migrations, NAME)
    store = BackgroundStore(db)
    plan(store, job)
    events = Events()

    counters = drain(store, job, db, events)

    assert counters["migrated"] == 600 and counters["scanned"] == 600
    assert db.items.count_documents({"__v": 1, "__rev": 1}) == 600
    assert db.items.count_documents({"__rev": {"$ne": 1}}) == 0
    assert db.items.find_one({"_id": 42}, {"label": 1}) == {"_id": 42, "label": "n42"}
    # fields the transform did not change were not written: their stored types survive
    assert db.items.count_documents({"long": {"$type": "long"}}) == 600
    assert db.items.count_documents({"ratio": {"$type": "double"}}) == 600
    assert db.items.count_documents({"price": Decimal128("9.990")}) == 600
    assert str(db.items.find_one({"_id": 1})["price"]) == "9.990"  # type: ignore[index]
    done = partition(store)
    assert done["status"] == "done" and "lease" not in done
    assert store.require(NAME).get("lastProgressAt") is not None
    assert done["counters"]["migrated"] == 600
    names = [name for name, _ in events.items]
    assert names[0] == "background:slice:start" and names[-1] == "background:slice:end"
    assert events.named("background:slice:end")[-1]["outcome"] == "exhausted"
    batch = events.named("background:batch")[0]
    assert batch["migration"] == NAME and batch["batchSize"] == 100 and batch["latencyMs"] >= 0

    # a crash after the writes replays the batch: the version filter makes it a no-op
    store.partitions.update_one({"_id": done["_id"]},
                                {"$set": {"status": "running", "cursor": {}}})
    again = run(store, job, db)
    assert again.outcome == "exhausted" and again.counters.get("migrated", 0) == 0
    assert db.items.count_documents({"__rev": 1}) == 600


def test_the_version_index_missing_is_warned_once_and_batches_still_run(
    db: Database[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    seed(db, 120)
    store, job = declare(db, BASE)
    with caplog.at_level(logging.WARNING, logger="migronaut"):
        drain(store, job, db)
        store.partitions.update_many({}, {"$set": {"status": "running", "cursor": {}}})
        drain(store, job, db)
    warnings = [r for r in caplog.records if "no version index" in r.getMessage()]
    assert len(warnings) == 1
    # the dev server has no replSetGetStatus: lag pacing turns itself off without a word
    assert not [r for r in caplog.records if "lag" in r.getMessage()]
    assert db.items.count_documents({"__v": 1}) == 120


def test_a_transform_mutating_nested_values_in_place_has_them_written(
    db: Database[dict[str, Any]]
) -> None:
    db.items.insert_many([
        {"_id": i, "n": i, "address": {"city": "X", "geo": [1.5, 2.5]}, "tags": ["a"],
         "price": Decimal128("1.50")}
        for i in range(5)
    ])

    def migrate(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
        doc["address"]["geo"].append(3.5)  # the copy is the transform's own, nested included
        doc["address"]["country"] = "FR"
        doc["tags"][0] = "b"
        del doc["n"]
        return doc

    store, job = declare(db, {**BASE, "migrate": migrate})
    drain(store, job, db)
    assert db.items.find_one({"_id": 3}) == {
        "_id": 3, "address": {"city": "X", "geo": [1.5, 2.5, 3.5], "country": "FR"},
        "tags": ["b"], "price": Decimal128("1.50"), "__v": 1, "__rev": 1,
    }


def test_a_revert_rewrites_documents_back_and_unsets_version_zero(
    db: Database[dict[str, Any]]
) -> None:
    db.items.insert_many([{"_id": i, "n": i, "label": "x", "__v": 1, "__rev": 1}
                          for i in range(30)])

    def revert(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
        assert ctx.direction == "revert"
        doc.pop("label")
        return doc

    resolved = resolve_background(NAME, {**BASE, "revert": revert})
    job = BackgroundJob(name=NAME, path=Path(NAME), checksum="0" * 64, resolved=resolved,
                        spec=resolved.spec, direction="revert")
    store = BackgroundStore(db)
    plan(store, job)
    counters = drain(store, job, db)

    assert counters["migrated"] == 30
    assert db.items.find_one({"_id": 4}) == {"_id": 4, "n": 4, "__rev": 2}


def test_a_transactional_spec_on_a_standalone_server_is_refused_without_a_failure(
    project: Project,
) -> None:
    from migronaut.devserver import start_subprocess

    with start_subprocess(standalone=True) as server:
        client: MongoClient[dict[str, Any]] = MongoClient(server.uri)
        try:
            sdb = client["standalone"]
            seed(sdb, 5)
            store, job = declare(sdb, {**BASE, "transaction": True})
            with pytest.raises(MigronautError) as caught:
                run(store, job, sdb)
            assert caught.value.code == "TRANSACTIONS_UNSUPPORTED"
            part = partition(store)
            assert part["failures"] == 0 and "lease" not in part
        finally:
            client.close()


# ------------------------------------------------------------------- optimistic concurrency


def test_an_application_write_between_read_and_write_is_kept(
    db: Database[dict[str, Any]], mongo_uri: str
) -> None:
    seed(db, 60)
    app: MongoClient[dict[str, Any]] = MongoClient(mongo_uri)
    calls: list[int] = []

    def migrate(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if doc["_id"] == 7:
            calls.append(doc.get("__rev") or 0)
            if len(calls) == 1:  # the application updates it after the lane read it
                app[db.name].items.update_one(
                    {"_id": 7}, {"$set": {"status": "paid"}, "$inc": {"__rev": 1}})
        doc["label"] = "migrated"
        return doc

    try:
        store, job = declare(db, {**BASE, "migrate": migrate})
        counters = drain(store, job, db)
    finally:
        app.close()

    doc = db.items.find_one({"_id": 7})
    assert doc is not None
    assert doc["status"] == "paid" and doc["label"] == "migrated"  # both writes survive
    assert (doc["__v"], doc["__rev"]) == (1, 2)
    assert calls == [0, 1]  # re-read and transformed again from the application's version
    assert counters["retried"] == 1 and counters["migrated"] == 60
    assert db.items.count_documents({"__v": 1}) == 60


def test_a_document_the_application_keeps_changing_is_left_as_a_conflict(
    db: Database[dict[str, Any]]
) -> None:
    seed(db, 20)

    def migrate(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if doc["_id"] == 3:
            db.items.update_one({"_id": 3}, {"$inc": {"__rev": 1, "touched": 1}})
        return {**doc, "label": "x"}

    store, job = declare(db, {**BASE, "migrate": migrate, "max_conflict_retries": 2})
    counters = drain(store, job, db)

    assert counters["conflicts"] == 1 and counters["retried"] == 2
    assert counters["migrated"] == 19
    doc = db.items.find_one({"_id": 3})
    assert doc is not None and doc.get("__v") is None and doc["touched"] == 3
    assert "label" not in doc  # the application's document was never overwritten


# -------------------------------------------------------------------------- document errors


def _string_ids(db: Database[dict[str, Any]], count: int) -> None:
    db.items.insert_many([{"_id": f"user-{i:04d}", "n": i} for i in range(count)])


def test_document_errors_within_the_budget_are_recorded_by_reason_without_ids(
    db: Database[dict[str, Any]]
) -> None:
    _string_ids(db, 30)

    def migrate(doc: dict[str, Any], ctx: Any) -> Any:
        n = doc["n"]
        if n == 3:
            raise ValueError(f"cannot migrate {doc['_id']}")
        if n == 5:
            return ["not", "a", "document"]
        if n == 7:
            return {**doc, "_id": "someone-else"}
        if n == 9:
            return {**doc, "$set": 1}
        return {**doc, "label": "ok"}

    store, job = declare(db, {**BASE, "migrate": migrate, "max_document_errors": 4},
                         partitions=[{"scope": STRINGS, "estimate": 30}])
    events = Events()
    counters = drain(store, job, db, events)

    assert counters["failed"] == 4 and counters["migrated"] == 26
    part = partition(store)
    assert sorted(part["badIds"]) == ["user-0003", "user-0005", "user-0007", "user-0009"]
    reasons = [e["reason"] for e in part["lastDocErrors"]]
    assert reasons == ["transform", "shape", "shape", "shape"]
    stored_text = repr(part["lastDocErrors"]) + repr(events.items)
    assert "user-00" not in stored_text  # neither ids nor values leave the batch
    assert "ValueError" in part["lastDocErrors"][0]["error"]
    assert store.require(NAME)["status"] == "running"
    # failed documents stay as they were
    assert db.items.find_one({"_id": "user-0003"}) == {"_id": "user-0003", "n": 3}


def test_document_errors_past_the_budget_fail_the_partition_and_the_state(
    db: Database[dict[str, Any]]
) -> None:
    _string_ids(db, 30)

    def migrate(doc: dict[str, Any], ctx: Any) -> Any:
        if doc["n"] in (2, 4, 6):
            raise RuntimeError(f"bad document {doc['_id']}")
        return doc

    store, job = declare(db, {**BASE, "migrate": migrate, "max_document_errors": 1},
                         partitions=[{"scope": STRINGS, "estimate": 30}])
    events = Events()
    result = run(store, job, db, events)

    assert result.outcome == "failed"
    assert isinstance(result.error, BackgroundFailedError)
    assert result.error.code == "BACKGROUND_FAILED"
    assert "3 document(s) could not be migrated, more than maxDocumentErrors (1)" in (
        result.error.message)
    state = store.require(NAME)
    assert state["status"] == "failed" and state.get("failedAt") is not None
    assert "user-" not in state["lastError"]
    part = partition(store)
    assert part["status"] == "failed" and "lease" not in part
    assert [p["error"] for p in events.named("background:failed")] == [state["lastError"]]
    assert "user-" not in repr(events.items)


def test_a_write_refused_by_the_server_fails_only_that_document(
    db: Database[dict[str, Any]]
) -> None:
    seed(db, 10)
    db.items.create_index("email", unique=True, sparse=True)

    def migrate(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
        doc["email"] = "same@example.com" if doc["n"] in (4, 5) else f"{doc['n']}@example.com"
        return doc

    store, job = declare(db, {**BASE, "migrate": migrate, "max_document_errors": 5})
    counters = drain(store, job, db)

    assert counters["failed"] == 1 and counters["migrated"] == 9
    errors = partition(store)["lastDocErrors"]
    assert errors[0]["reason"] == "write" and "duplicate key" in errors[0]["error"]
    assert "same@example.com" not in errors[0]["error"]


def test_a_batch_of_long_ids_is_cut_so_its_write_intent_stays_small(
    db: Database[dict[str, Any]]
) -> None:
    # 240 ids of 16 KiB: 3.75 MiB of intent for one batch of 500, over INTENT_MAX_BYTES (2 MiB)
    db.items.insert_many([{"_id": f"{i:04d}" + "k" * 16_380, "n": i} for i in range(240)])
    _, job = declare(db, {**BASE, "batch_size": 500},
                       partitions=[{"scope": STRINGS, "estimate": 240}])
    events = Events()
    intents: list[int] = []

    class Intents(CommandListener):
        def started(self, event: CommandStartedEvent) -> None:
            if event.command_name == "update" and event.command.get("update", "").endswith(
                    "_partitions"):
                for statement in event.command["updates"]:
                    stage = statement["u"][0]["$set"] if isinstance(statement["u"], list) else {}
                    inflight = stage.get("inflight")
                    if isinstance(inflight, dict):
                        intents.append(len(inflight["$literal"]["ids"]))

        def succeeded(self, event: Any) -> None: ...
        def failed(self, event: Any) -> None: ...

    host, port = db.client.address or ("", 0)
    with MongoClient(f"mongodb://{host}:{port}/?directConnection=true",
                     event_listeners=[Intents()]) as watched:
        counters = drain(BackgroundStore(watched[db.name]), job, watched[db.name], events)

    assert counters["migrated"] == counters["scanned"] == 240
    assert db.items.count_documents({"__v": 1, "__rev": 1}) == 240
    scanned = [batch["counters"].get("scanned", 0) for batch in events.named("background:batch")]
    assert max(scanned) < 240 and sum(scanned) == 240  # one read of 240, written in two cuts
    assert intents and max(intents) * 16_400 <= 2 * 1024 * 1024 and sum(intents) == 240


# ------------------------------------------------------------------------- leases, fencing


def test_a_lane_whose_lease_was_reaped_cannot_checkpoint_and_nothing_counts_twice(
    db: Database[dict[str, Any]]
) -> None:
    seed(db, 120)
    reaped: list[int] = []
    store_ref: list[BackgroundStore] = []

    def migrate(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if not reaped:  # the lane stalls past its TTL: another process reaps the lease
            store = store_ref[0]
            store.partitions.update_one({"background": NAME},
                                        {"$set": {"lease.renewedAt": EPOCH}})
            reaped.append(store.reap_expired_leases(NAME))
        return {**doc, "label": "x"}

    store, job = declare(db, {**BASE, "migrate": migrate})
    store_ref.append(store)
    events = Events()
    lost = run(store, job, db, events, owner="stalled")

    assert reaped == [1]
    assert lost.outcome == "lost" and lost.counters == {}
    assert isinstance(lost.error, MigronautError) and lost.error.code == "LOCK_LOST"
    assert events.named("background:lease:lost") == [
        {"migration": NAME, "partition": str(partition(store)["_id"])}]
    part = partition(store)
    assert part.get("counters", {}) == {} and part["reclaims"] == 1 and part["cursor"] == {}
    assert part["failures"] == 0  # a lost lease is not a failure

    counters = drain(store, job, db)
    assert db.items.count_documents({"__v": 1, "__rev": 1}) == 120
    assert db.items.count_documents({"__rev": {"$gt": 1}}) == 0
    # the stalled lane's checkpoint before its write (naming the batch) was fenced, so its batch
    # was never written: the next holder migrated and counted every document, once
    assert counters["migrated"] == 120
    assert partition(store)["counters"]["migrated"] == 120


def test_the_heartbeat_keeps_a_short_lease_alive_through_a_long_slice(
    db: Database[dict[str, Any]]
) -> None:
    seed(db, 40)

    def migrate(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
        time.sleep(0.03)
        return doc

    store, job = declare(db, {**BASE, "migrate": migrate, "batch_size": 10})
    # ttl 1 s; the slice lasts longer; a racing claimer reaping expired leases finds none
    stop = threading.Event()
    reaped: list[int] = []

    def reaper() -> None:
        while not stop.wait(0.2):
            reaped.append(store.reap_expired_leases(NAME))

    thread = threading.Thread(target=reaper)
    thread.start()
    try:
        result = run(store, job, db, ttl_ms=1_000)
    finally:
        stop.set()
        thread.join()
    assert result.outcome == "exhausted"
    assert sum(reaped) == 0 and partition(store)["reclaims"] == 0


# ------------------------------------------------------------------ stops and slice failures


def test_a_slice_stopped_by_its_caller_is_never_a_failure(db: Database[dict[str, Any]]) -> None:
    seed(db, 30)
    current: list[Cancellation] = []

    def migrate(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if doc["n"] == 1:
            current[-1].cancel(RunAbortedError("deploy"))
            assert ctx.cancellation.cancelled
            raise RuntimeError("interrupted by the stop")  # what user code may do on a stop
        return doc

    store, job = declare(db, {**BASE, "migrate": migrate, "max_slice_failures": 1})
    for _ in range(3):
        current.append(Cancellation())
        result = run(store, job, db, cancellation=current[-1])
        assert result.outcome == "stopped"
    part = partition(store)
    assert part["status"] == "running" and part["failures"] == 0 and "lease" not in part
    assert part["badIds"] == [] and part.get("counters", {}) == {}
    assert store.require(NAME)["status"] == "running"
    assert db.items.count_documents({"__v": 1}) == 0  # the interrupted batch wrote nothing


def test_consecutive_slice_failures_fail_the_partition_and_progress_resets_the_count(
    db: Database[dict[str, Any]]
) -> None:
    seed(db, 200)
    mode = {"fail": True}

    def migrate_batch(docs: list[dict[str, Any]], ctx: Any) -> list[dict[str, Any]]:
        if mode["fail"]:
            raise ConnectionError("the enrichment service is down")
        return docs

    store, job = declare(db, {**{k: v for k, v in BASE.items() if k != "migrate"},
                              "migrate_batch": migrate_batch, "max_slice_failures": 2})

    def fail_once() -> MigrationExecutionFailedError:
        with pytest.raises(MigrationExecutionFailedError) as caught:
            run(store, job, db)
        return caught.value

    first = fail_once()
    assert first.context["partitionFailed"] is False
    assert "migrate_batch raised" in first.message
    assert partition(store)["failures"] == 1 and "lease" not in partition(store)
    mode["fail"] = False
    assert run(store, job, db, slice_ms=1).outcome == "yielded"  # one batch: progress
    assert partition(store)["failures"] == 0
    mode["fail"] = True
    assert fail_once().context["partitionFailed"] is False
    second = fail_once()
    assert second.context["partitionFailed"] is True
    part = partition(store)
    assert part["status"] == "failed" and part["failures"] == 2
    assert "enrichment service is down" in part["lastError"]


def test_a_batch_transform_returning_the_wrong_count_fails_the_slice(
    db: Database[dict[str, Any]]
) -> None:
    seed(db, 10)
    store, job = declare(db, {**{k: v for k, v in BASE.items() if k != "migrate"},
                              "migrate_batch": lambda docs, ctx: docs[:1]})
    with pytest.raises(MigrationExecutionFailedError, match="returned 1 results for 10"):
        run(store, job, db)
    assert db.items.count_documents({"__v": 1}) == 0


# ------------------------------------------------------------------------------------ step


def test_a_step_migration_resumes_from_its_checkpoint_after_a_crash(
    db: Database[dict[str, Any]]
) -> None:
    db.source.insert_many([{"_id": i} for i in range(25)])
    seen: list[Any] = []

    def step(ctx: Any) -> dict[str, Any]:
        seen.append(ctx.checkpoint)
        start = (ctx.checkpoint or {}).get("next", 0)
        ids = [d["_id"] for d in ctx.db.source.find({"_id": {"$gte": start}}).sort("_id", 1)
               .limit(5)]
        for i in ids:  # idempotent writes: a replay after a crash is harmless
            ctx.db.target.update_one({"_id": i}, {"$set": {"copied": True}}, upsert=True)
        return {"checkpoint": {"next": start + 5}, "done": len(ids) < 5,
                "processed": len(ids), "migrated": len(ids)}

    resolved = resolve_background(NAME, {"step": step, "pause_ms": 0})
    job = BackgroundJob(name=NAME, path=Path(NAME), checksum="0" * 64, resolved=resolved,
                        spec=resolved.spec, direction="forward")
    store = BackgroundStore(db)
    plan(store, job, [{"scope": {"kind": "step"}, "estimate": 0}])

    assert run(store, job, db, slice_ms=1).outcome == "yielded"  # one step call
    assert partition(store)["cursor"] == {"checkpoint": {"next": 5}}

    # a process claims it, runs a step whose checkpoint never lands, and dies holding the lease
    state = store.require(NAME)
    dead = store.claim(NAME, generation=1, plan=state["plan"]["token"], max_parallel=1,
                       ttl_ms=60_000, owner="dead")
    assert not isinstance(dead, str)
    ctx_db = db
    for i in range(5, 10):
        ctx_db.target.update_one({"_id": i}, {"$set": {"copied": True}}, upsert=True)
    store.partitions.update_one({"_id": dead.partition_id}, {"$set": {"lease.renewedAt": EPOCH}})

    result = run(store, job, db)
    assert result.outcome == "exhausted"
    assert seen[0] is None and seen[1] == {"next": 5}  # resumed from the last checkpoint
    part = partition(store)
    assert part["status"] == "done" and part["reclaims"] == 1
    assert part["counters"] == {"batches": 6, "processed": 25, "migrated": 25}
    assert db.target.count_documents({"copied": True}) == 25


@pytest.mark.parametrize(("returned", "message"), [
    ({"checkpoint": 1, "done": "yes"}, "done a boolean"),
    (None, "done a boolean"),
    ({"checkpoint": "x" * 70_000, "done": False}, "keep a cursor in it"),
])
def test_a_bad_step_result_fails_the_slice(
    db: Database[dict[str, Any]], returned: Any, message: str
) -> None:
    resolved = resolve_background(NAME, {"step": lambda ctx: returned, "pause_ms": 0})
    job = BackgroundJob(name=NAME, path=Path(NAME), checksum="0" * 64, resolved=resolved,
                        spec=resolved.spec, direction="forward")
    store = BackgroundStore(db)
    plan(store, job, [{"scope": {"kind": "step"}, "estimate": 0}])
    with pytest.raises(MigrationExecutionFailedError, match=message):
        run(store, job, db)
    assert partition(store)["failures"] == 1


# ---------------------------------------------------------------------------- transactions


def test_a_transactional_batch_commits_data_side_writes_and_checkpoint_together(
    db: Database[dict[str, Any]]
) -> None:
    seed(db, 90)
    attempts: list[int] = []

    def migrate(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
        assert ctx.session is not None and ctx.db is not None
        attempts.append(ctx.background.attempt)
        ctx.db.side.insert_one({"of": doc["_id"]}, session=ctx.session)
        if doc["n"] == 13:
            raise ValueError("refuses to migrate")  # its side write must never commit
        return {**doc, "label": "t"}

    store, job = declare(db, {**BASE, "migrate": migrate, "transaction": True,
                              "batch_size": 40, "max_document_errors": 1})
    counters = drain(store, job, db)

    assert counters["migrated"] == 89 and counters["failed"] == 1
    assert db.side.count_documents({}) == 89
    assert len(db.side.distinct("of")) == 89 and db.side.count_documents({"of": 13}) == 0
    assert db.items.count_documents({"__v": 1, "__rev": 1, "label": "t"}) == 89
    part = partition(store)
    assert part["badIds"] == [13] and part["counters"]["migrated"] == 89
    assert 2 in attempts  # the batch holding the failing document ran again without it


def test_a_transactional_lane_that_lost_its_lease_commits_nothing(
    db: Database[dict[str, Any]]
) -> None:
    seed(db, 30)
    removed: list[bool] = []
    store_ref: list[BackgroundStore] = []

    def migrate(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if not removed:  # an operator's unlock: the lease goes away mid-batch
            store_ref[0].release_all_leases(NAME)
            removed.append(True)
        ctx.db.side.insert_one({"of": doc["_id"]}, session=ctx.session)
        return {**doc, "label": "t"}

    store, job = declare(db, {**BASE, "migrate": migrate, "transaction": True})
    store_ref.append(store)
    result = run(store, job, db)

    assert result.outcome == "lost" and result.counters == {}
    assert db.side.count_documents({}) == 0
    assert db.items.count_documents({"__v": 1}) == 0
    assert partition(store).get("counters", {}) == {}


# ------------------------------------------------------------------------- adaptive pacing


@pytest.fixture
def proxy(mongo_uri: str) -> Iterator[TcpProxy]:
    with TcpProxy.in_front_of(mongo_uri) as in_front:
        yield in_front


def through(proxy: TcpProxy, db: Database[dict[str, Any]]) -> Iterator[Database[dict[str, Any]]]:
    client: MongoClient[dict[str, Any]] = MongoClient(proxy.uri, serverSelectionTimeoutMS=5000)
    try:
        yield client[db.name]
    finally:
        client.close()


#: The start of an ``update`` command on the ``items`` collection, as it travels on the wire.
ITEMS_UPDATE = b"update\x00\x06\x00\x00\x00items\x00"


def test_a_slow_server_shrinks_batches_under_the_adaptive_controller(
    db: Database[dict[str, Any]], proxy: TcpProxy
) -> None:
    seed(db, 400)
    proxy.delay_replies(ITEMS_UPDATE, 0.3)  # every batch write takes 300 ms on the server
    store, job = declare(db, {**BASE, "batch_size": 100, "adaptive": {
        "target_latency_ms": 200, "min_batch_size": 5, "max_pause_ms": 100}})
    events = Events()
    for slow in through(proxy, db):
        drain(store, job, slow, events)

    sizes = [e["batchSize"] for e in events.named("background:batch")]
    assert sizes[:2] == [100, 100]  # the first batch only warms the controller up
    assert sizes[2] == 50 and min(sizes) <= 50
    throttles = events.named("background:throttle")
    assert throttles and throttles[0]["reason"] == "slow"
    assert partition(store)["throttle"]["batchSize"] < 100
    assert db.items.count_documents({"__v": 1}) == 400


def test_a_slow_transform_is_not_a_slow_server_and_keeps_its_batches(
    db: Database[dict[str, Any]]
) -> None:
    """The controller judges the write's round trip: a ``migrate`` that takes 120 ms a document
    (600 ms a batch, well over the 400 ms target) neither shrinks batches nor adds pauses."""
    seed(db, 30)

    def migrate(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
        time.sleep(0.12)
        return {**doc, "label": "slow"}

    store, job = declare(db, {**BASE, "migrate": migrate, "batch_size": 5, "adaptive": {
        "target_latency_ms": 400, "min_batch_size": 1, "max_pause_ms": 30_000}})
    events = Events()
    drain(store, job, db, events)

    assert {e["batchSize"] for e in events.named("background:batch")} == {5}
    assert events.named("background:throttle") == []
    assert partition(store)["throttle"] == {"batchSize": 5, "pauseMs": 0}
    assert db.items.count_documents({"__v": 1, "label": "slow"}) == 30


def test_a_result_bson_cannot_store_fails_only_its_document(
    db: Database[dict[str, Any]]
) -> None:
    seed(db, 30)

    def migrate(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if doc["n"] == 7:
            return {**doc, "x": object()}  # BSON cannot encode it
        if doc["n"] == 8:
            return {**doc, "big": 2**70}  # nor an integer over 64 bits
        return {**doc, "label": "ok"}

    store, job = declare(db, {**BASE, "migrate": migrate, "max_document_errors": 2})
    events = Events()
    counters = drain(store, job, db, events)

    assert counters["failed"] == 2 and counters["migrated"] == 28
    part = partition(store)
    assert part["status"] == "done" and part["failures"] == 0
    assert sorted(part["badIds"]) == [7, 8]
    assert [e["reason"] for e in part["lastDocErrors"]] == ["shape", "shape"]
    assert "cannot be stored as BSON" in part["lastDocErrors"][0]["error"]
    assert "object at 0x" not in repr(part["lastDocErrors"])  # no value in the text
    assert db.items.count_documents({"__v": 1, "label": "ok"}) == 28
    assert db.items.find_one({"_id": 7}) == {"_id": 7, "n": 7}
    assert store.require(NAME)["status"] == "running"
    assert events.named("background:failed") == []


def test_a_result_bson_cannot_store_fails_only_its_document_in_a_transaction(
    db: Database[dict[str, Any]]
) -> None:
    seed(db, 30)

    def migrate(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {**doc, "x": object()} if doc["n"] == 4 else {**doc, "label": "t"}

    store, job = declare(db, {**BASE, "migrate": migrate, "transaction": True,
                              "max_document_errors": 1})
    counters = drain(store, job, db)

    assert counters["failed"] == 1 and counters["migrated"] == 29
    part = partition(store)
    assert part["badIds"] == [4] and part["lastDocErrors"][0]["reason"] == "shape"
    assert db.items.count_documents({"__v": 1, "__rev": 1, "label": "t"}) == 29


def test_a_write_whose_reply_is_lost_twice_is_counted_once_and_fails_nothing(
    db: Database[dict[str, Any]], proxy: TcpProxy
) -> None:
    """The write of a batch lands but its reply is lost, and so is the retry's: the lane rides
    the outage out, starts again from the partition as stored (its write intent names the
    batch) and counts the batch once — no failed slice, even with ``max_slice_failures`` 1."""
    seed(db, 120)
    store, job = declare(db, {**BASE, "batch_size": 40, "max_slice_failures": 1})
    events = Events()
    for cut in through(proxy, db):
        cut.command("ping")
        proxy.drop_reply_after(ITEMS_UPDATE, times=2)
        counters = drain(store, job, cut, events)

    assert proxy.dropped.is_set()
    assert db.items.count_documents({"__v": 1, "__rev": 1}) == 120  # each written once
    part = partition(store)
    assert part["status"] == "done" and part["failures"] == 0 and "inflight" not in part
    assert part["counters"]["migrated"] == 120 and part["counters"]["scanned"] == 120
    assert counters["migrated"] == 120
    assert [e for e in events.items if e[0] == "background:slice:end"
            and e[1]["outcome"] == "error"] == []


def test_an_outage_longer_than_max_outage_ms_is_a_failed_slice_and_still_counted_once(
    db: Database[dict[str, Any]], proxy: TcpProxy
) -> None:
    seed(db, 120)
    store, job = declare(db, {**BASE, "batch_size": 40, "max_outage_ms": 0})
    for cut in through(proxy, db):
        cut.command("ping")
        proxy.drop_reply_after(ITEMS_UPDATE, times=2)
        with pytest.raises(MigronautError) as failed:
            run(store, job, cut)
    assert failed.value.code == "CONNECTION_FAILED"
    assert "lost the connection" in failed.value.message
    part = partition(store)
    assert part["failures"] == 1 and part["inflight"]["ids"] == list(range(40))
    assert drain(store, job, db)["migrated"] == 120  # the next holder counts the lost batch
    part = partition(store)
    assert part["counters"]["migrated"] == 120 and part["failures"] == 0
    assert db.items.count_documents({"__v": 1, "__rev": 1}) == 120


def test_transaction_retries_of_a_slice_that_failed_are_still_counted(
    db: Database[dict[str, Any]]
) -> None:
    from pymongo.errors import OperationFailure

    def step(ctx: Any) -> dict[str, Any]:
        raise OperationFailure("write conflict", 112)  # retried, then the slice fails

    store, job = declare(db, {"step": step, "transaction": {"max_retries": 2},
                              "max_slice_failures": 1, "pause_ms": 0},
                         partitions=[{"scope": {"kind": "step"}, "estimate": 0}])
    with pytest.raises(MigrationExecutionFailedError, match="more than maxRetries"):
        run(store, job, db)
    part = partition(store)
    assert part["status"] == "failed"
    assert part["counters"]["txnRetries"] == 3  # every attempt after the first


# ---------------------------------------------------------------------- the hot path, I1


class Recorder(CommandListener):
    def __init__(self, log: list[tuple[str, ...]]) -> None:
        self.log = log

    def started(self, event: CommandStartedEvent) -> None:
        target = event.command.get(event.command_name)
        self.log.append(("command", threading.current_thread().name, event.command_name,
                         str(target)))

    def succeeded(self, event: Any) -> None:
        pass

    def failed(self, event: Any) -> None:
        pass


def test_a_steady_state_batch_costs_at_most_three_round_trips(
    mongo_uri: str, db_name: str, db: Database[dict[str, Any]]
) -> None:
    seed(db, 600)
    db.items.create_index([("__v", 1), ("_id", 1)])
    timeline: list[tuple[str, ...]] = []
    watched: MongoClient[dict[str, Any]] = MongoClient(mongo_uri,
                                                       event_listeners=[Recorder(timeline)])
    try:
        wdb = watched[db_name]
        store, job = declare(wdb, BASE)
        started = time.monotonic()
        run_slice(store=store, job=job, db=wdb, owner="lane", ttl_ms=60_000,
                  cancellation=Cancellation(), emit=lambda e, p: timeline.append(("event", e)),
                  logger=log)
        elapsed = time.monotonic() - started
    finally:
        watched.close()

    lane = threading.current_thread().name
    batches = [i for i, item in enumerate(timeline) if item == ("event", "background:batch")]
    assert len(batches) == 13  # 12 full batches, then the read that finds nothing left
    per_batch = []
    for before, after in itertools.pairwise(batches):
        per_batch.append([item[2] + ":" + item[3] for item in timeline[before:after]
                          if item[0] == "command" and item[1] == lane])
    # read, checkpoint (the previous batch's counters + this batch's intent), write
    for commands in per_batch[:-1]:
        assert commands == ["find:items", "update:_migronaut_background_partitions", "update:items"]
    # the final batch read nothing: no write, the checkpoint marks the partition done
    assert per_batch[-1] == ["find:items", "update:_migronaut_background_partitions"]
    control_reads = [item for item in timeline if item[0] == "command" and item[1] != lane
                     and item[2] == "find" and item[3] == "_migronaut_background"]
    assert len(control_reads) <= elapsed / 1.0 + 1


def test_lanes_of_one_store_share_one_control_read_a_second_and_all_stop_on_a_pause(
    mongo_uri: str, db_name: str, db: Database[dict[str, Any]]
) -> None:
    seed(db, 800)
    timeline: list[tuple[str, ...]] = []
    watched: MongoClient[dict[str, Any]] = MongoClient(mongo_uri,
                                                       event_listeners=[Recorder(timeline)])
    batches: dict[str, int] = {}
    guard = threading.Lock()
    results: list[str] = []

    def slow(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
        time.sleep(0.02)  # a partition of 200 lasts 4 s: the pause finds every lane at work
        return label(doc, ctx)

    def on_event(event: str, payload: dict[str, Any]) -> None:
        if event == "background:batch":
            with guard:
                name = threading.current_thread().name
                batches[name] = batches.get(name, 0) + 1

    try:
        wdb = watched[db_name]
        ranges = [{"scope": {**NUMBERS, "gte": i * 200, "lt": (i + 1) * 200}, "estimate": 200}
                  for i in range(4)]
        store, job = declare(wdb, {**BASE, "migrate": slow, "max_parallel": 4,
                                   "batch_size": 10}, partitions=ranges)

        def lane(owner: str) -> None:
            result = run_slice(store=store, job=job, db=wdb, owner=owner, ttl_ms=60_000,
                               cancellation=Cancellation(), emit=on_event, logger=log)
            with guard:
                results.append(result.outcome)

        threads = [threading.Thread(target=lane, args=(f"lane-{i}",), name=f"lane-{i}")
                   for i in range(4)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        while len(batches) < 4 and all(thread.is_alive() for thread in threads):
            time.sleep(0.05)
        time.sleep(2.5)  # a few control reads with every lane holding a lease
        running = [thread.name for thread in threading.enumerate()]
        db[store.name].update_one({"_id": NAME}, {"$set": {"status": "paused"}})
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
        left = [thread.name for thread in threading.enumerate()]
    finally:
        watched.close()

    assert results == ["paused"] * 4
    assert db.items.count_documents({"__v": 1}) < 800  # the pause stopped them mid-partition
    # four leases held, four heartbeats, one control reader for the whole store
    assert sum(name.startswith("migronaut-lease") for name in running) == 4
    assert running.count("migronaut-control") == 1
    # the last lane to leave stopped the reader
    assert "migronaut-control" not in left
    state_reads = [item for item in timeline if item[0] == "command"
                   and item[2] == "find" and item[3] == store.name]
    assert not [item for item in state_reads if item[1].startswith("migronaut-lease")]
    control_reads = [item for item in state_reads if item[1] == "migronaut-control"]
    # one read a second for the four lanes (one each would be about four a second)
    assert 1 <= len(control_reads) <= elapsed / 1.0 + 2


def test_a_claim_takes_the_slot_its_lane_just_gave_back_in_one_round_trip(
    mongo_uri: str, db_name: str, db: Database[dict[str, Any]]
) -> None:
    timeline: list[tuple[str, ...]] = []
    watched: MongoClient[dict[str, Any]] = MongoClient(mongo_uri,
                                                       event_listeners=[Recorder(timeline)])
    try:
        ranges = [{"scope": {**NUMBERS, "gte": i, "lt": i + 1}, "estimate": 1} for i in range(6)]
        store, _job = declare(watched[db_name], {**BASE, "max_parallel": 4}, partitions=ranges)
        token = store.get(NAME)["plan"]["token"]

        def claim(slot: int) -> Any:
            return store.claim(NAME, generation=1, plan=token, max_parallel=4, ttl_ms=60_000,
                               owner=f"lane-{slot}", slot=slot)

        held = [claim(slot) for slot in range(4)]
        assert [lease.slot for lease in held] == [0, 1, 2, 3]
        store.release(held[2])
        del timeline[:]
        again = claim(2)
        sent = [item[2] for item in timeline if item[0] == "command"]
    finally:
        watched.close()
    # the slot given back is free: one findAndModify, no reap, no listing of the held slots
    assert again.slot == 2
    assert sent == ["findAndModify"]


def test_lanes_never_hold_more_partitions_than_max_parallel(
    db: Database[dict[str, Any]]
) -> None:
    seed(db, 400)
    held: list[int] = []
    guard = threading.Lock()

    def on_event(event: str, payload: dict[str, Any]) -> None:
        # the leases held in MongoDB when a lane starts working its partition (the slice
        # events alone can overlap: a partition's last checkpoint frees its slot before its
        # lane says the slice ended, so another lane may start in between)
        if event == "background:slice:start":
            leases = store.partitions.count_documents({"lease": {"$exists": True}})
            with guard:
                held.append(leases)

    def migrate(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
        time.sleep(0.001)
        return doc

    ranges = [{"scope": {**NUMBERS, "gte": i * 50, "lt": (i + 1) * 50}, "estimate": 50}
              for i in range(8)]
    store, job = declare(db, {**BASE, "migrate": migrate, "max_parallel": 2},
                         partitions=ranges)

    def lane(owner: str) -> None:
        for _ in range(100):
            result = run_slice(store=store, job=job, db=db, owner=owner, ttl_ms=60_000,
                               cancellation=Cancellation(), slice_ms=200, emit=on_event,
                               logger=log)
            if result.outcome == "exhausted":
                return
            if result.outcome == "busy":
                time.sleep(0.05)

    threads = [threading.Thread(target=lane, args=(f"lane-{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(held) >= 8 and 1 <= max(held) <= 2
    assert db.items.count_documents({"__v": 1, "__rev": 1}) == 400


def test_userland_transform_lines_emit_background_migration_log(
    db: Database[dict[str, Any]]
) -> None:
    seed(db, 3)

    def chatty(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
        ctx.logger.info("doc %d via mongodb://u:Pw0rd@h", doc["n"],
                        extra={"userland": True, "n": doc["n"]})
        ctx.logger.info("plain line, no event")
        return label(doc, ctx)

    store, job = declare(db, {**BASE, "migrate": chatty})
    events = Events()
    run_slice(store=store, job=job, db=db, owner="lane-1", ttl_ms=60_000,
              cancellation=Cancellation(), emit=events, logger=log, run_id="run-7")
    lines = events.named("migration:log")
    assert [line["data"] for line in lines] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert [line["seq"] for line in lines] == [1, 2, 3]
    first = lines[0]
    assert (first["kind"], first["migration"], first["runId"], first["level"]) == (
        "background", NAME, "run-7", "info")
    assert first["msg"] == "doc 0 via mongodb://u:****@h"
