"""Background migrations worked through Celery: real worker processes on this run's own Redis
database, checked against MongoDB's invariants — every document migrated exactly once (each
migration bumps a per-document counter: a second migration of a document would leave 2), exact
totals, no lease left, the status the scenario leads to.

Waiting is polling MongoDB for the state a scenario leads to, never a sleep standing in for it.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from helpers.background import PARTITIONS, STATES
from helpers.celery_worker import redis_client
from helpers.engine import make_migrator
from migronaut.executors.celery.background_producer import coordinator_id, lane_id
from migronaut.executors.celery.background_tasks import lane_backoff_s

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


# ------------------------------------------------------------------ rounds (no worker needed)


def test_celery_chains_get_rounds_and_a_stale_round_is_superseded(
        project: Any, cli: Any, db: Any) -> None:
    configure(project)
    register(project, cli, db, docs=60, max_parallel=2)
    with make_migrator(project) as migrator:
        engine = migrator.background
        first = engine.coordinate(NAME, driver="celery", ref="task-a")
        assert (first.next, first.round) == ("process", 1)
        assert state(db)["round"] == 1
        assert state(db)["coordinator"]["ref"] == "task-a"
        again = engine.coordinate(NAME, driver="celery", ref="task-a", round=1)
        assert (again.next, again.round) == ("process", 1)
        newer = engine.coordinate(NAME, driver="celery", ref="task-b")  # a heal's new chain
        assert newer.round == 2 and state(db)["round"] == 2
        before = state(db)
        stale = engine.coordinate(NAME, driver="celery", ref="task-a", round=1)
        assert stale.to_dict() == {"next": "superseded", "lanes": 0, "round": 1}
        after = state(db)
        # nothing else done: the driver record and the round stay the newer chain's
        assert after["coordinator"] == before["coordinator"]
        assert after["round"] == 2 and after["generation"] == before["generation"]
        # other drivers are unchanged: no round, none handed out
        local = engine.coordinate(NAME, driver="runner", round=7)
        assert local.round is None and local.next == "process"
        assert state(db)["round"] == 2 and state(db)["coordinator"]["kind"] == "runner"


def test_lane_backoff_doubles_to_five_minutes() -> None:
    assert [lane_backoff_s(n) for n in (1, 2, 3, 9, 10, 30)] == [1, 2, 4, 256, 300, 300]


def test_task_ids_are_deterministic_per_slot() -> None:
    assert coordinator_id("0001 x.py") == "bg-0001~20x.py"
    assert lane_id("a.py", "reg", 3, 2, 1) == "bgl-a.py-reg-g3-r2-l1"
    assert lane_id("a.py", "reg", 3, 2, 1) != lane_id("a.py", "reg", 3, 3, 1)


# ----------------------------------------------------------------- CLI: background enqueue


def queued(celery_project: Any, redis_db: int) -> int:
    return int(redis_client(redis_db).llen(celery_project.background_queue))


def test_enqueue_heals_once_and_a_live_chain_absorbs_the_next(
        celery_project: Any, project: Any, cli: Any, db: Any, redis_db: int) -> None:
    configure(project)
    register(project, cli, db, docs=60)

    first = cli("background", "enqueue", "--json", "--reason", "deploy 42")
    assert first.exit_code == 0, first.stderr
    assert first.json == {"jobs": [{"migration": NAME, "id": coordinator_id(NAME)}]}
    assert queued(celery_project, redis_db) == 1
    message = json.loads(redis_client(redis_db).lindex(celery_project.background_queue, 0))
    body = json.loads(base64.b64decode(message["body"]))
    assert body[0][0]["reason"] == "deploy 42" and body[0][0]["requestedBy"]

    second = cli("background", "enqueue", "--json")  # the queued chain absorbs the heal
    assert second.exit_code == 0 and second.json == {"jobs": []}
    named = cli("background", "enqueue", NAME)
    assert named.exit_code == 0 and "Nothing enqueued" in named.stderr + named.stdout
    assert queued(celery_project, redis_db) == 1


def test_enqueue_of_an_unregistered_migration_is_not_applied(
        celery_project: Any, project: Any, cli: Any, db: Any, redis_db: int) -> None:
    configure(project)
    result = cli("background", "enqueue", "0099_nope.py", "--json")
    assert result.exit_code == 9
    assert result.json["error"]["code"] == "NOT_APPLIED"
    assert "0099_nope.py is not registered — run up first" in result.json["error"]["message"]
    assert queued(celery_project, redis_db) == 0


def test_enqueue_without_the_celery_extra_is_config_invalid(
        celery_project: Any, project: Any, cli: Any, db: Any, redis_db: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    configure(project)
    register(project, cli, db, docs=10)
    monkeypatch.setitem(sys.modules, "celery", None)  # import celery → ImportError
    result = cli("background", "enqueue")
    assert result.exit_code == 6
    assert "CONFIG_INVALID" in result.stderr
    assert "needs the celery extra: pip install 'migronaut[celery]'" in result.stderr
    assert queued(celery_project, redis_db) == 0


def test_a_bad_payload_is_refused_before_any_work(
        celery_project: Any, project: Any, db: Any) -> None:
    configure(project)
    celery_project.worker(concurrency=1)
    app, _ = celery_project.app()
    sent = [app.send_task(f"migronaut.{kind}", args=[payload],
                          queue=celery_project.background_queue)
            for kind, payload in (
                ("background", {"v": 9, "kind": "background", "migration": NAME}),
                ("background-lane", {"v": 1, "kind": "background-lane", "migration": NAME,
                                     "registration": "r", "generation": 1, "lane": 99}),
                ("background", {"v": 1, "kind": "background", "migration": "../x.py"}))]
    wait_until(lambda: all(result.state == "FAILURE" for result in sent), timeout=60,
               why="the tasks to fail")
    messages = [str(result.result) for result in sent]
    assert "newer than this worker understands" in messages[0]
    assert "'lane' must be an integer from 0 to 63" in messages[1]
    assert "bare migration file name" in messages[2]
    assert all(type(result.result).__name__ == "QueueJobInvalidError" for result in sent)
    # refused before any work: nothing was written
    assert db[STATES].count_documents({}) == 0
    assert db["_migronaut_locks"].count_documents({}) == 0
