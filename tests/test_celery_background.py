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
               "chain_ttl_ms": 3000, "verify_interval_ms": False, **celery}
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


@pytest.mark.one_interpreter
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
    assert coordinator_id("q-background", "0001 x.py") == "q-background:bg-0001~20x.py"
    assert lane_id("q", "a.py", "reg", 3, 2, 1) == "q:bgl-a.py-reg-g3-r2-l1"
    assert lane_id("q", "a.py", "reg", 3, 2, 1) != lane_id("q", "a.py", "reg", 3, 3, 1)
    # deployments on queues of their own never share a ledger entry
    assert coordinator_id("a", "x.py") != coordinator_id("b", "x.py")



def test_a_task_run_keeps_its_own_ledger_entry(celery_project: Any, project: Any,
                                               redis_db: int) -> None:
    """A run that continues sends itself again under its id, marked QUEUED first — so an entry
    lost mid-chain (expired, flushed) is live again and heals stay absorbed; nothing else is
    written on the way (no STARTED, no RETRY); a run that ends writes its result."""
    from celery.states import PENDING

    from migronaut.executors.celery.background_tasks import Again, _run

    configure(project)
    app, installed = celery_project.app()
    task = installed.tasks["background-lane"]
    slot = lane_id(celery_project.background_queue, NAME, "reg", 1, 1, 0)
    payload = {"v": 1, "kind": "background-lane", "migration": NAME, "registration": "reg",
               "generation": 1, "round": 1, "lane": 0}
    assert app.AsyncResult(slot).state == PENDING  # no entry: as if expired or flushed
    task.push_request(id=slot)
    try:
        assert _run(task, installed, "background-lane",
                    lambda data, task_id: Again({**data, "retry": 2}), payload) is None
        assert app.AsyncResult(slot).state == "QUEUED"
        assert queued(celery_project, redis_db) == 1
        message = json.loads(redis_client(redis_db).lindex(celery_project.background_queue, 0))
        assert message["headers"]["id"] == slot
        assert message["headers"]["task"] == "migronaut.background-lane"
        assert json.loads(base64.b64decode(message["body"]))[0] == [{**payload, "retry": 2}]

        done = {"kind": "background-lane", "migration": NAME, "outcome": "exhausted",
                "counters": {"migrated": 3}}
        assert _run(task, installed, "background-lane", lambda data, task_id: done,
                    payload) == done
        assert app.AsyncResult(slot).state == "SUCCESS"
        assert app.AsyncResult(slot).result == done
    finally:
        task.pop_request()
    assert task.track_started is False and task.ignore_result is True
    assert task.store_errors_even_if_ignored is True  # a failed run is still FAILURE



def test_a_busy_coordinator_lock_is_looked_at_again_within_the_poll_interval(
        celery_project: Any, project: Any, redis_db: int) -> None:
    """``busy`` (a lane closing its pass holds the coordinator lock for milliseconds): the chain
    re-checks within ``poll_interval_ms``, not after the lock's ttl/2; a ``wait`` keeps its
    ``retryAfterMs``; a stop continues at once."""
    from migronaut.background.coordination.coordinator import Answer
    from migronaut.executors.celery.background_tasks import Again, Coordinator

    configure(project)
    _, installed = celery_project.app()
    chain = Coordinator(installed)
    poll_s = installed.settings.poll_interval_ms / 1000
    data = {"v": 1, "kind": "background", "migration": NAME, "round": 2}
    busy = chain.decide(None, NAME, data, Answer("busy", retry_after_ms=300_000))  # type: ignore[arg-type]
    assert isinstance(busy, Again) and busy.countdown == poll_s and busy.payload == data
    waiting = chain.decide(None, NAME, data,  # type: ignore[arg-type]
                           Answer("wait", reason="checksum", retry_after_ms=300_000))
    assert isinstance(waiting, Again) and waiting.countdown == 300.0
    stopping = chain.decide(None, NAME, data, Answer("wait", reason="stopping"))  # type: ignore[arg-type]
    assert isinstance(stopping, Again) and stopping.countdown == 0.0

def test_a_worker_process_shares_one_background_engine_across_its_threads(
        celery_project: Any, project: Any, redis_db: int) -> None:
    """Background tasks on any pool thread use the process's one engine (one client, built once
    even when threads ask at the same moment); the migration queue's tasks keep a Migrator per
    thread; ``close`` forgets both."""
    import threading

    configure(project)
    _, installed = celery_project.app()
    context = installed.context
    barrier = threading.Barrier(4)
    engines: list[Any] = []
    migrators: list[Any] = []

    def task() -> None:
        barrier.wait()
        engines.append(context.engine())
        migrators.append(context.migrator())

    threads = [threading.Thread(target=task) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    try:
        assert len(engines) == 4 and all(engine is engines[0] for engine in engines)
        assert context.shared_migrator().background is engines[0]
        assert len({id(migrator) for migrator in migrators}) == 4
        assert all(migrator is not context.shared_migrator() for migrator in migrators)
    finally:
        context.close()
    assert context.engine() is not engines[0]  # closed: the next use builds a new one
    context.close()


# ----------------------------------------------------------------- CLI: background enqueue


def queued(celery_project: Any, redis_db: int) -> int:
    return int(redis_client(redis_db).llen(celery_project.background_queue))


def test_enqueue_heals_once_and_a_live_chain_absorbs_the_next(
        celery_project: Any, project: Any, cli: Any, db: Any, redis_db: int) -> None:
    configure(project)
    register(project, cli, db, docs=60)
    redis_client(redis_db).flushdb()  # forget what `up` enqueued: the heal sends it again

    first = cli("background", "enqueue", "--json", "--reason", "deploy 42")
    assert first.exit_code == 0, first.stderr
    chain = coordinator_id(celery_project.background_queue, NAME)
    assert first.json == {"jobs": [{"migration": NAME, "id": chain}]}
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


def test_enqueue_of_a_migration_whose_status_it_does_not_know_is_state_invalid(
        celery_project: Any, project: Any, cli: Any, db: Any, redis_db: int) -> None:
    """Fail closed: a named heal refuses a stored status migronaut does not know (exit 35,
    naming the field) — it used to answer "nothing enqueued" as for a finished migration —
    and sends nothing. A heal of everything serves it (its coordinator refuses it in turn)
    instead of passing over it."""
    configure(project)
    register(project, cli, db, docs=10)
    redis_client(redis_db).flushdb()  # forget what `up` enqueued
    db[STATES].update_one({"_id": NAME}, {"$set": {"status": "weird"}})
    before = db[STATES].find_one({"_id": NAME})
    result = cli("background", "enqueue", NAME, "--json")
    assert result.exit_code == 35, result.stderr
    assert result.json["error"]["code"] == "STATE_INVALID"
    assert "has a status migronaut does not understand: 'weird'" in \
        result.json["error"]["message"]
    assert queued(celery_project, redis_db) == 0
    healed = cli("background", "enqueue", "--json")
    assert healed.exit_code == 0, healed.stderr
    assert healed.json == {"jobs": [{"migration": NAME, "id": coordinator_id(
        celery_project.background_queue, NAME)}]}
    assert db[STATES].find_one({"_id": NAME}) == before


def test_enqueue_without_the_celery_extra_is_config_invalid(
        celery_project: Any, project: Any, cli: Any, db: Any, redis_db: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    configure(project)
    register(project, cli, db, docs=10)
    redis_client(redis_db).flushdb()  # forget what `up` enqueued
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


# ------------------------------------------------------------ worker loss, broker loss, shutdown


def progressing(db: Any, above: int) -> Callable[[], bool]:
    """Some lane holds a lease and more than ``above`` documents are migrated."""
    return lambda: live_leases(db) > 0 and migrated(db) > above


def holds_lease(db: Any, worker: Any) -> Callable[[], bool]:
    """``worker``'s process (a threads pool: one pid) holds a lease mid-partition."""
    return lambda: db[PARTITIONS].count_documents(
        {"background": NAME, "lease.pid": worker.process.pid}) > 0 and migrated(db) > 0


@pytest.mark.one_interpreter
def test_kill_9_mid_lane_repeatedly_then_the_queue_lost_a_heal_brings_the_work_back(
        celery_project: Any, project: Any, cli: Any, db: Any, redis_db: int) -> None:
    configure(project)
    docs = 1200
    register(project, cli, db, docs=docs, max_parallel=4, sleep=0.01)
    victim = celery_project.worker(concurrency=3)
    survivor = celery_project.worker(concurrency=3)

    def heal() -> None:
        result = cli("background", "enqueue", "--json")
        assert result.exit_code == 0, result.stderr

    for round_ in range(3):
        wait_until(holds_lease(db, victim), every=heal, why=f"the victim's lane {round_}")
        victim.kill()  # kill -9 of the worker's process group, in the middle of its lane
        assert not victim.alive
        victim = celery_project.worker(concurrency=3)
    wait_until(progressing(db, migrated(db)), every=heal, why="progress before the flush")
    assert migrated(db) < docs, "the scenario needs the run to be unfinished here"
    redis_client(redis_db).flushdb()  # the queue (and the ledger) lost mid-run

    wait_until(completed(db), every=heal, timeout=300, why="the healed run to complete")
    assert_exactly_once(db, docs)
    assert state(db)["round"] >= 2  # a heal or takeover started a newer chain
    # the killed lanes' leases expired and were reclaimed; their batches were not counted twice
    assert sum(p.get("reclaims", 0) for p in db[PARTITIONS].find({"background": NAME})) >= 1
    assert survivor.alive


@pytest.mark.one_interpreter
def test_a_warm_shutdown_releases_leases_at_once_and_another_worker_finishes(
        celery_project: Any, project: Any, cli: Any, db: Any) -> None:
    configure(project, lock_ttl=60)  # a lease left behind would hold its slot for a minute
    docs = 800
    register(project, cli, db, docs=docs, max_parallel=3, sleep=0.01)
    first = celery_project.worker(concurrency=4)
    wait_until(progressing(db, 50), why="lanes working")

    assert first.stop() == 0  # SIGTERM: lanes stop at their next batch boundary
    assert live_leases(db) == 0  # released, not left to expire
    stopped_at = migrated(db)
    assert stopped_at < docs
    partitions = list(db[PARTITIONS].find({"background": NAME}))
    assert all(p.get("failures", 0) == 0 for p in partitions)  # a stop is not a failure

    celery_project.worker(concurrency=4)  # its tasks were re-enqueued: nobody heals here
    wait_until(completed(db), why="the second worker to finish")
    assert_exactly_once(db, docs)
    assert "Warm shutdown" in first.log() or "worker: Warm shutdown" in first.log()


def test_pause_resume_cancel_while_lane_tasks_are_queued(
        celery_project: Any, project: Any, cli: Any, db: Any, redis_db: int) -> None:
    configure(project)
    docs = 800
    register(project, cli, db, docs=docs, max_parallel=4, sleep=0.01)
    celery_project.worker(concurrency=1)  # one thread: most lane tasks wait in the queue
    wait_until(lambda: progressing(db, 0)() and queued(celery_project, redis_db) > 0,
               why="a lane working while others are queued")

    assert cli("background", "pause", NAME).exit_code == 0
    chain = coordinator_id(celery_project.background_queue, NAME)
    app, _ = celery_project.app()
    wait_until(lambda: live_leases(db) == 0 and app.AsyncResult(chain).state == "SUCCESS",
               why="the lanes and the coordinator chain to stop")
    assert app.AsyncResult(chain).result["status"] == "paused"
    paused_at = migrated(db)
    assert state(db)["status"] == "paused" and paused_at < docs
    wait_until(lambda: queued(celery_project, redis_db) == 0, why="the queued lanes to drain")
    assert migrated(db) == paused_at  # queued lanes ran, saw the pause and did nothing

    assert cli("background", "resume", NAME).exit_code == 0
    assert cli("background", "enqueue", NAME).exit_code == 0  # a new chain, a new round
    wait_until(progressing(db, paused_at), why="work after the resume")
    assert cli("background", "cancel", NAME, "--yes").exit_code == 0
    wait_until(lambda: live_leases(db) == 0 and queued(celery_project, redis_db) == 0,
               why="the lanes to stop after the cancel")
    final = state(db)
    assert final["status"] == "cancelled"
    assert db[COLLECTION].count_documents({"hits": {"$gt": 1}}) == 0  # never twice
    assert migrated(db) < docs


def test_a_failing_lane_gives_up_after_its_retries_and_the_state_says_why(
        celery_project: Any, project: Any, cli: Any, db: Any) -> None:
    configure(project, max_lane_retries=1)
    project.write_migration(NAME, '''
def step(ctx):
    raise RuntimeError("the step cannot reach the archive")


background = {"collection": "items", "step": step, "max_slice_failures": 5}
''')
    assert cli("up").exit_code == 0
    worker = celery_project.worker(concurrency=2)
    wait_until(lambda: state(db)["status"] == "failed", timeout=180,
               why="the migration to fail")
    final = state(db)
    assert "the step cannot reach the archive" in final["lastError"]
    assert "gave up after 1 retries: " in worker.log()
    assert "the step cannot reach the archive" in worker.log()
    assert live_leases(db) == 0
    partition = db[PARTITIONS].find_one({"background": NAME})
    assert partition is not None and partition["status"] == "failed"


# --------------------------------------------------------------------- RabbitMQ as the broker


@pytest.fixture
def rabbit_project(project: Any, redis_db: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``project`` served through Celery with RabbitMQ as the broker (the result backend, which
    keeps the send ledger, on this run's Redis database); queues of its own, deleted after."""
    from helpers.celery_worker import RABBIT_URL, CeleryProject, queue_names, require_rabbitmq

    require_rabbitmq()
    redis_client(redis_db).flushdb()
    queue, background = queue_names()
    celery = CeleryProject(project.path, project.env(), RABBIT_URL,
                           f"redis://127.0.0.1:6379/{redis_db}", queue, background)
    for name, value in celery.env_variables().items():
        monkeypatch.setenv(name, value)
    try:
        yield celery
    finally:
        celery.kill_all()
        app, _ = celery.app()
        with app.connection_for_write() as connection:
            channel = connection.default_channel
            for name in (queue, background):
                channel.queue_delete(name)
                channel.exchange_delete(name)
        redis_client(redis_db).flushdb()


@pytest.mark.one_interpreter
def test_kill_9_mid_lane_with_rabbitmq_the_killed_tasks_come_back(
        rabbit_project: Any, project: Any, cli: Any, db: Any) -> None:
    configure(project)
    docs = 800
    register(project, cli, db, docs=docs, max_parallel=3, sleep=0.01)
    victim = rabbit_project.worker(concurrency=3)
    wait_until(holds_lease(db, victim), why="the victim's lane")
    victim.kill()
    # RabbitMQ redelivers the dead consumer's unacknowledged tasks at once: no heal needed
    rabbit_project.worker(concurrency=3)
    wait_until(completed(db), why="the run to complete")
    assert_exactly_once(db, docs)


# ------------------------------------------------------------------------------ the verify tick


def test_the_verify_tick_is_on_beat_unless_switched_off(celery_project: Any,
                                                        project: Any) -> None:
    configure(project)
    app, _ = celery_project.app(verify_interval_ms=1500)
    entry = app.conf.beat_schedule["migronaut-background-verify"]
    assert entry["task"] == "migronaut.background-verify" and entry["schedule"] == 1.5
    assert entry["options"]["queue"] == celery_project.background_queue
    assert entry["args"] == [{"v": 1, "kind": "background-verify"}]
    app, _ = celery_project.app(verify_interval_ms=None)
    assert "migronaut-background-verify" not in (app.conf.beat_schedule or {})


def test_the_verify_tick_heals_what_nobody_enqueued(
        celery_project: Any, project: Any, cli: Any, db: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    configure(project, verify_interval_ms=1000)
    worker = celery_project.worker(concurrency=3, beat=True)  # its start-up heal finds nothing
    with monkeypatch.context() as patched:
        patched.setitem(sys.modules, "celery", None)  # `up` cannot enqueue what it registers
        register(project, cli, db, docs=200, max_parallel=2)  # registered after: nobody enqueues
    wait_until(completed(db), timeout=120, why="the verify tick's heal to run it")
    assert_exactly_once(db, 200)
    assert "migronaut.background-verify" in worker.log()


def test_a_completed_coordinator_heals_the_migration_that_waited_for_it(
        celery_project: Any, project: Any, cli: Any, db: Any) -> None:
    from helpers.background import background_file, seed

    configure(project)  # no verify tick: only the heal after completion can start the second
    seed(db, "orders", 80)
    project.write_migration("0002_orders_v1", background_file(
        collection="orders", requires=f'requires = ["{NAME}"]'))
    register(project, cli, db, docs=150, max_parallel=2)
    assert db[STATES].find_one({"_id": "0002_orders_v1.py"})["status"] == "blocked"

    celery_project.worker(concurrency=3)
    wait_until(lambda: db[STATES].find_one({"_id": "0002_orders_v1.py"})["status"]
               == "completed", timeout=180, why="the dependent migration to complete")
    assert_exactly_once(db, 150)
    assert db["orders"].count_documents({"active": True}) == 80


def test_a_stalled_migration_gets_one_takeover_that_finishes_it_in_a_new_round(
        celery_project: Any, project: Any, cli: Any, db: Any, redis_db: int,
        caplog: pytest.LogCaptureFixture) -> None:
    from migronaut.executors.celery import enqueue_background
    from migronaut.executors.celery.background_producer import takeover_id

    configure(project)
    register(project, cli, db, docs=100, max_parallel=2)
    redis_client(redis_db).flushdb()  # forget what `up` enqueued: no chain but the dead one
    app, installed = celery_project.app()
    with make_migrator(project) as migrator:
        engine = migrator.background
        # a chain that took round 1 and then died with its worker: the ledger still says STARTED
        chain = coordinator_id(celery_project.background_queue, NAME)
        takeover = takeover_id(celery_project.background_queue, NAME, 1)
        assert engine.coordinate(NAME, driver="celery", ref=chain).round == 1
        app.backend.store_result(chain, None, "STARTED")
        wait_until(lambda: engine.stalled(1000) == [NAME], timeout=30, why="the stall")

        with caplog.at_level("WARNING", logger="migronaut"):
            sent = enqueue_background(installed, stall_ms=1000, engine=engine)
        assert sent == [{"migration": NAME, "id": takeover, "takeover": True}]
        assert "looks stalled" in caplog.text
        assert enqueue_background(installed, stall_ms=1000, engine=engine) == []  # once a round
        stale = engine.coordinate(NAME, driver="celery", round=1)
        assert stale.next == "process"  # nothing ran the takeover yet: round 1 is still current

    celery_project.worker(concurrency=3)
    wait_until(completed(db), why="the takeover chain to complete")
    assert_exactly_once(db, 100)
    assert state(db)["round"] == 2
    # the last step was the takeover chain's or one of its round-2 lanes'
    ref = state(db)["coordinator"]["ref"]
    assert ref == takeover or "-r2-l" in ref, ref
    result = app.AsyncResult(takeover)
    wait_until(lambda: result.state == "SUCCESS", timeout=30, why="the takeover's result")
    assert result.result == {"kind": "background", "migration": NAME, "status": "completed",
                             "round": 2}


# ------------------------------------------------------------- chain liveness, kept in MongoDB


def chain_dead(db: Any) -> bool:
    """The migration's coordinator chain recorded a heartbeat that expired (server time)."""
    return db[STATES].count_documents({"_id": NAME, "chain": {"$exists": True}, "$expr": {
        "$lte": ["$chain.until", "$$NOW"]}}) == 1


@pytest.mark.one_interpreter
def test_a_killed_worker_s_chain_is_taken_over_by_a_surviving_worker_within_its_ttl(
        celery_project: Any, project: Any, cli: Any, db: Any) -> None:
    """kill -9 of the worker running the coordinator chain and its lanes: the ledger still
    calls them live and nothing looks stalled for stall_ms (10 minutes here), yet the surviving
    worker finishes the run within about chain_ttl_ms — nobody heals."""
    configure(project, stall_ms=600_000, chain_ttl_ms=3000)
    docs = 600
    register(project, cli, db, docs=docs, max_parallel=3, sleep=0.01)
    victim = celery_project.worker(concurrency=3)
    wait_until(holds_lease(db, victim), timeout=120, why="the victim's lanes")
    victim.kill()  # the chain and its lanes die with it; the ledger still says QUEUED/STARTED
    survivor = celery_project.worker(concurrency=3)
    wait_until(completed(db), timeout=120, why="a takeover by the surviving worker")
    assert_exactly_once(db, docs)
    assert state(db)["round"] >= 2
    # the chain died (taken over once its heartbeat expired) or hopped to the survivor, which
    # found the killed lanes stranded after chain_ttl_ms — either way, not after stall_ms
    log = survivor.log()
    assert ("stopped renewing its heartbeat" in log
            or "its lanes look stranded (no lease, no progress for 3000 ms)" in log), log[-2000:]


def test_enqueue_calls_a_chain_live_only_while_its_heartbeat_in_mongodb_is(
        celery_project: Any, project: Any, cli: Any, db: Any) -> None:
    from migronaut.executors.celery.background_producer import takeover_id

    configure(project, stall_ms=600_000)
    register(project, cli, db, docs=60, max_parallel=2)
    app, _ = celery_project.app()
    chain = coordinator_id(celery_project.background_queue, NAME)
    with make_migrator(project) as migrator:
        engine = migrator.background
        assert engine.coordinate(NAME, driver="celery", ref=chain).round == 1
        assert engine.renew_chain(NAME, round=1, ref=chain, ttl_ms=1500)
        app.backend.store_result(chain, None, "STARTED")  # what a killed worker leaves

        live = cli("background", "enqueue", "--json")
        assert live.exit_code == 0 and live.json == {"jobs": []}
        wait_until(lambda: chain_dead(db), timeout=30, why="the heartbeat to expire")
        dead = cli("background", "enqueue", "--json")
        assert dead.exit_code == 0, dead.stderr
        takeover = takeover_id(celery_project.background_queue, NAME, 1)
        assert dead.json == {"jobs": [{"migration": NAME, "id": takeover, "takeover": True}]}
        assert "stopped renewing its heartbeat" in dead.stderr
        # a chain of a superseded round renews nothing
        assert engine.coordinate(NAME, driver="celery", ref=takeover).round == 2
        assert not engine.renew_chain(NAME, round=1, ref=chain, ttl_ms=60_000)
        assert engine.chains([NAME]) == {NAME: False}


def test_the_worker_s_chain_watch_takes_over_dead_chains_only(
        celery_project: Any, project: Any, cli: Any, db: Any, redis_db: int) -> None:
    from migronaut.executors.celery.background_producer import takeover_id
    from migronaut.executors.celery.watch import ChainWatch

    configure(project, stall_ms=600_000)
    register(project, cli, db, docs=60, max_parallel=2)
    app, installed = celery_project.app()
    chain = coordinator_id(celery_project.background_queue, NAME)
    with make_migrator(project) as migrator:
        engine = migrator.background
        installed.context.engine = lambda: engine  # type: ignore[method-assign]
        watch = ChainWatch(installed)
        assert watch.interval_s == 1.5  # half of chain_ttl_ms
        watch.tick()  # `up` queued a chain that has not run a step: not the watch's business
        assert queued(celery_project, redis_db) == 1

        assert engine.coordinate(NAME, driver="celery", ref=chain).round == 1
        assert engine.renew_chain(NAME, round=1, ref=chain, ttl_ms=1000)
        app.backend.store_result(chain, None, "STARTED")
        watch.tick()
        assert queued(celery_project, redis_db) == 1  # the heartbeat is live
        wait_until(lambda: chain_dead(db), timeout=30, why="the heartbeat to expire")
        watch.tick()
        assert queued(celery_project, redis_db) == 2
        takeover = takeover_id(celery_project.background_queue, NAME, 1)
        assert app.AsyncResult(takeover).state == "QUEUED"
        watch.tick()  # once a round
        assert queued(celery_project, redis_db) == 2


def test_a_garbage_ledger_entry_is_unknown_and_mongodb_decides(
        celery_project: Any, project: Any, cli: Any, db: Any, redis_db: int) -> None:
    configure(project)
    register(project, cli, db, docs=60)
    chain = coordinator_id(celery_project.background_queue, NAME)
    redis_client(redis_db).set(f"celery-task-meta-{chain}", b"\x00not a result{")
    before = queued(celery_project, redis_db)  # (up enqueued one; its entry is garbage now)

    result = cli("background", "enqueue", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json == {"jobs": [{"migration": NAME, "id": chain}]}
    assert f"entry for task {chain} cannot be read (DecodeError)" in result.stderr
    assert queued(celery_project, redis_db) == before + 1
    app, _ = celery_project.app()
    assert app.AsyncResult(chain).state == "QUEUED"  # the send's mark replaced the garbage


def test_up_on_a_celery_project_enqueues_what_it_registered(
        celery_project: Any, project: Any, cli: Any, db: Any, redis_db: int) -> None:
    configure(project)
    register(project, cli, db, docs=60)  # register() runs `up` and checks it exits 0
    assert queued(celery_project, redis_db) == 1
    chain = coordinator_id(celery_project.background_queue, NAME)
    message = json.loads(redis_client(redis_db).lindex(celery_project.background_queue, 0))
    assert message["headers"]["id"] == chain
    assert state(db)["status"] == "pending"


def test_up_says_what_to_run_when_it_cannot_enqueue(
        celery_project: Any, project: Any, cli: Any, db: Any, redis_db: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    configure(project)
    monkeypatch.setitem(sys.modules, "celery", None)  # the extra is not installed
    db[COLLECTION].insert_many([{"n": i} for i in range(10)])
    project.write_migration(NAME, hits_migration())
    result = cli("up")
    assert result.exit_code == 0, result.stderr
    assert (f"Background migration(s) {NAME} registered but not enqueued on Celery "
            "(CONFIG_INVALID: the config has a celery table but the celery extra is not "
            "installed") in result.stderr
    assert 'run "migronaut background enqueue" once a broker' in result.stderr
    assert state(db)["status"] == "pending"  # the registration stands
    assert queued(celery_project, redis_db) == 0


def test_a_lane_leaves_a_spec_it_cannot_read_to_run_slice_to_refuse() -> None:
    """A junk ``spec`` reaches ``run_slice`` (which refuses it as STATE_INVALID naming the field)
    instead of failing the lane task with a raw AttributeError while reading ``sliceMs``."""
    from types import SimpleNamespace

    from migronaut.executors.celery.background_tasks import Lane

    calls: list[dict[str, Any]] = []
    state = {"status": "running", "spec": "junk"}
    engine = SimpleNamespace(
        state=lambda name: state,
        run_slice=lambda name, **kwargs: calls.append({"name": name, **kwargs}) or "refused",
    )
    lane = Lane.__new__(Lane)
    lane.settings = SimpleNamespace(slice_ms=5000)  # type: ignore[assignment]
    lane.installed = SimpleNamespace(context=SimpleNamespace(shutdown=None))  # type: ignore[assignment]
    assert lane.step(engine, "m", {}, "task-1") == "refused"  # type: ignore[arg-type]
    assert calls == [{"name": "m", "slice_ms": 5000, "cancellation": None, "ref": "task-1",
                      "state": state}]
