"""The migration queue on real Celery workers (threads pool) and the test's own Redis database:
``enqueue_up`` through the queue, a held lock, a failing migration and the ``sync`` ticks after
it, bad payloads, redaction in the result backend, and a worker killed in the middle of ``up``."""

from __future__ import annotations

import time
from typing import Any

import pytest

from helpers.celery_worker import redis_client, workers
from helpers.queue_migrations import (
    A,
    B,
    C,
    in_doubt_then_resolved,
    records,
    until,
    waiting_on,
    write_marking,
)
from migronaut import Migrator, QueueJobFailedError, QueueJobInvalidError
from migronaut.celery import QueueHandle, enqueue_down, enqueue_up


def sync_tick(app: Any, queue: str, timeout: float = 60.0) -> dict[str, Any]:
    sent = app.send_task("migronaut.sync", args=({"v": 1, "kind": "sync"},), queue=queue)
    return dict(sent.get(timeout=timeout))


def test_up_through_the_queue_applies_each_file_once(project: Any, celery_project: Any,
                                                     db: Any) -> None:
    for name in (A, B, C):
        write_marking(project, name)
    with workers(celery_project.worker(concurrency=2)):
        app, installed = celery_project.app()
        handle = enqueue_up(app, requested_by="deploy", reason="release 7")
        assert isinstance(handle, QueueHandle)
        assert [(j.kind, j.migration) for j in handle.jobs] == [("up", A), ("up", B), ("up", C)]
        results = handle.wait(90)
        assert [r["results"][0]["status"] for r in results] == ["applied"] * 3
        assert [r["migration"] for r in results] == [A, B, C]
        stored = records(db)
        assert {r["status"] for r in stored.values()} == {"applied"}
        assert {r["batch"] for r in stored.values()} == {handle.batch}
        assert {r["requestedBy"] for r in stored.values()} == {"deploy"}
        assert sorted(d["name"] for d in db.marks.find()) == [A, B, C]
        assert enqueue_up(installed).up_to_date  # nothing left: nothing sent
        assert sync_tick(app, celery_project.queue)["results"] == []
        # the last batch reverted through the queue, newest first
        down = enqueue_down(app)
        assert [j.migration for j in down.jobs] == [C, B, A]
        assert [r["results"][0]["status"] for r in down.wait(90)] == ["reverted"] * 3
    assert db.marks.count_documents({}) == 0


def test_a_held_lock_makes_the_job_wait_then_succeed(project: Any, celery_project: Any,
                                                     db: Any) -> None:
    release, started = celery_project.path / "release", celery_project.path / "started"
    write_marking(project, A, waiting_on(release, started))
    write_marking(project, B)
    with workers(celery_project.worker(concurrency=1)) as (worker,):
        app, _ = celery_project.app()
        with Migrator(cwd=celery_project.path) as holder:
            import threading

            applying = threading.Thread(target=holder.up, kwargs={"to": A})
            applying.start()  # holds the migration lock until `release` exists
            until(started.exists, what="the in-process up to start")
            handle = enqueue_up(app)
            assert [j.migration for j in handle.jobs] == [A, B]
            until(lambda: "waiting for it to release" in worker.log(), what="the job to wait")
            with pytest.raises(QueueJobFailedError) as early:
                handle.wait(1)
            assert early.value.context["timedOut"] is True
            release.write_text("go")
            applying.join(60)
        results = handle.wait(90)
    assert [r["results"][0]["status"] for r in results] == ["skipped", "applied"]
    assert sorted(d["name"] for d in db.marks.find()) == [A, B]  # A once: by the holder


def test_a_failing_migration_stops_the_chain_and_sync_holds_the_line(
    project: Any, celery_project: Any, db: Any
) -> None:
    write_marking(project, A)
    write_marking(project, B, "    raise RuntimeError('B is broken')\n")
    write_marking(project, C)
    with workers(celery_project.worker(concurrency=2)) as (worker,):
        app, _ = celery_project.app()
        handle = enqueue_up(app)
        with pytest.raises(QueueJobFailedError) as failed:
            handle.wait(90)
        context = failed.value.context
        assert (context["migration"], context["code"]) == (B, "MIGRATION_EXECUTION_FAILED")
        assert "B is broken" in failed.value.message
        assert failed.value.exit_code == 26
        time.sleep(1.0)  # a later job would have had time to run
        stored = records(db)
        assert (stored[A]["status"], stored[B]["status"]) == ("applied", "failed")
        assert C not in stored
        for _ in range(2):
            tick = sync_tick(app, celery_project.queue)
            assert tick["held"] == {"migration": B, "reason": "failed"}
            assert tick["results"] == []
        assert C not in records(db)
        assert worker.log().count("holding at " + B) == 2
        write_marking(project, B)  # fixed: the next tick goes on
        tick = sync_tick(app, celery_project.queue)
        assert [r["file"] for r in tick["results"]] == [B, C]
    assert {r["status"] for r in records(db).values()} == {"applied"}
    assert sorted(d["name"] for d in db.marks.find()) == [A, B, C]


def test_beat_runs_sync_ticks_that_do_not_move_past_a_failure(
    project: Any, celery_project: Any, db: Any
) -> None:
    project.write("migronaut.toml", "[celery]\nsync_interval_s = 1\n")
    write_marking(project, A, "    raise RuntimeError('A is broken')\n")
    write_marking(project, B)
    with workers(celery_project.worker(concurrency=1, beat=True)) as (worker,):
        until(lambda: worker.log().count("holding at " + A) >= 2, timeout=90,
              what="two held sync ticks")
        stored = records(db)
        assert stored[A]["status"] == "failed" and B not in stored
        write_marking(project, A)
        until(lambda: records(db).get(B, {}).get("status") == "applied", timeout=90,
              what="the tick after the fix")
    assert sorted(d["name"] for d in db.marks.find()) == [A, B]


@pytest.mark.parametrize(("data", "words"), [
    ({"v": 2, "kind": "up"}, "newer than this worker"),
    ({"v": 1, "kind": "up", "migration": "../x.py"}, "bare migration file name"),
    ({"v": 1, "kind": "up", "prune": True}, "'prune' is not a known field"),
    ({"v": 1, "kind": "up", "ordered": True}, "'ordered' needs a migration"),
    ("up everything", "payload must be an object"),
])
def test_a_bad_payload_is_refused_and_not_retried(project: Any, celery_project: Any, db: Any,
                                                  data: Any, words: str) -> None:
    write_marking(project, A)
    with workers(celery_project.worker(concurrency=1)) as (worker,):
        app, _ = celery_project.app()
        sent = app.send_task("migronaut.up", args=(data,), queue=celery_project.queue)
        with pytest.raises(QueueJobInvalidError) as refused:
            sent.get(timeout=60)
        assert words in str(refused.value)
        assert sent.state == "FAILURE"
        assert "Retry in" not in worker.log() and "retrying" not in worker.log()
    assert records(db) == {} and db.marks.count_documents({}) == 0


@pytest.mark.parametrize(("body", "secret", "kept"), [
    ('ctx.db.people.insert_one({"email": "alice@example.com"})', "alice@example.com", "E11000"),
    ('raise RuntimeError("cannot reach mongodb://admin:hunter2secret@db.internal/app")',
     "hunter2secret", "db.internal"),
])
def test_secrets_in_an_error_never_reach_the_result_backend(
    project: Any, celery_project: Any, db: Any, redis_db: int, body: str, secret: str, kept: str
) -> None:
    db.people.create_index("email", unique=True)
    db.people.insert_one({"email": "alice@example.com"})
    project.write_migration(A, f"""\
        def up(ctx):
            {body}

        def down(ctx):
            pass
        """)
    with workers(celery_project.worker(concurrency=1)):
        app, _ = celery_project.app()
        with pytest.raises(QueueJobFailedError) as failed:
            enqueue_up(app).wait(60)
    assert kept in failed.value.message and secret not in failed.value.message
    assert secret not in str(failed.value.context)
    raw = _dump(redis_client(redis_db))
    assert "celery-task-meta" in raw and kept in raw  # the failure is there, redacted
    assert secret not in raw


def _dump(client: Any) -> str:
    """Every key and value of a Redis database, as text."""
    parts = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key).decode()
        parts.append(key.decode(errors="replace"))
        if kind == "string":
            parts.append(client.get(key).decode(errors="replace"))
        elif kind == "list":
            parts += [v.decode(errors="replace") for v in client.lrange(key, 0, -1)]
        elif kind == "hash":
            parts += [v.decode(errors="replace") for v in client.hgetall(key).values()]
        elif kind == "zset":
            parts += [v.decode(errors="replace") for v in client.zrange(key, 0, -1)]
        elif kind == "set":
            parts += [v.decode(errors="replace") for v in client.smembers(key)]
    return "\n".join(parts)


def test_a_worker_killed_mid_up_leaves_it_in_doubt_then_applies_once(
    project: Any, celery_project: Any, db: Any
) -> None:
    """The killed worker's body may or may not have finished: the job that comes back refuses
    with ``MIGRATION_IN_DOUBT`` (never retried) until the operator resolves it."""
    project.write("migronaut.toml",
                         "[celery]\nvisibility_timeout_s = 5\nslice_ms = 500\n")
    celery_project.base_env["MIGRONAUT_LOCK_TTL"] = "5"
    go, started = celery_project.path / "go", celery_project.path / "started"
    write_marking(project, A, waiting_on(go, started))
    write_marking(project, B)
    first = celery_project.worker(concurrency=1)
    with workers(first):
        app, _ = celery_project.app()
        handle = enqueue_up(app)
        until(started.exists, what="the up job to start")
        first.kill()
        started.unlink()
        go.write_text("go")
        with workers(celery_project.worker(concurrency=1)):
            results = in_doubt_then_resolved(handle, app, db, celery_project.path)
    assert [r["results"][0]["status"] for r in results] == ["applied", "applied"]
    assert sorted(d["name"] for d in db.marks.find()) == [A, B]  # exactly once each
    assert {r["status"] for r in records(db).values()} == {"applied"}


def test_a_lost_connection_is_retried_not_failed(project: Any, celery_project: Any,
                                                 db: Any, redis_db: int) -> None:
    write_marking(project, A)
    app, _ = celery_project.app()
    handle = enqueue_up(app)  # planned against the real server
    celery_project.base_env["MIGRONAUT_URI"] = (
        "mongodb://admin:hunter2secret@127.0.0.1:9/?serverSelectionTimeoutMS=200"
        "&connectTimeoutMS=200")
    with workers(celery_project.worker(concurrency=1)) as (worker,):
        until(lambda: worker.log().count("CONNECTION_FAILED") >= 2, timeout=90,
              what="two attempts")
        assert "retrying in" in worker.log()
        from celery.result import AsyncResult

        assert AsyncResult(handle.ids[0], app=app).state in ("RETRY", "STARTED")
        with pytest.raises(QueueJobFailedError) as waited:
            handle.wait(1)
        assert waited.value.context["timedOut"] is True
        assert "hunter2secret" not in worker.log()
    assert "hunter2secret" not in _dump(redis_client(redis_db))
    assert records(db) == {}


def test_a_warm_shutdown_during_a_lock_wait_puts_the_job_back(
    project: Any, celery_project: Any, db: Any
) -> None:
    from helpers.engine import hold_lock

    write_marking(project, A)
    hold_lock(db, ttl_ms=600_000)
    first = celery_project.worker(concurrency=1)
    with workers(first):
        app, _ = celery_project.app()
        handle = enqueue_up(app)
        until(lambda: "waiting for it to release" in first.log(), what="the lock wait")
        assert first.stop(timeout=60) == 0  # the wait ends at once; the job goes back
        assert "FAILURE" not in first.log() and "raised unexpected" not in first.log()
        db["_migronaut_locks"].delete_many({})
        with workers(celery_project.worker(concurrency=1)):
            results = handle.wait(90)
    assert results[0]["results"][0]["status"] == "applied"
    assert [d["name"] for d in db.marks.find()] == [A]


def test_a_sync_tick_that_finds_the_lock_held_leaves_it_to_the_next_tick(
    project: Any, celery_project: Any, db: Any
) -> None:
    from helpers.engine import hold_lock

    project.write("migronaut.toml", "[celery]\nlock_wait_timeout_ms = 300\n")
    write_marking(project, A)
    hold_lock(db, ttl_ms=600_000)
    with workers(celery_project.worker(concurrency=1)) as (worker,):
        app, _ = celery_project.app()
        tick = sync_tick(app, celery_project.queue)
        assert (tick["lockHeld"], tick["results"]) == (True, [])
        assert "retrying" not in worker.log()
        db["_migronaut_locks"].delete_many({})
        assert [r["file"] for r in sync_tick(app, celery_project.queue)["results"]] == [A]


@pytest.mark.parametrize("leave", ["sys.exit(3)", "raise KeyboardInterrupt"])
def test_a_file_that_exits_while_the_worker_imports_it_fails_the_job(
    project: Any, celery_project: Any, db: Any, leave: str
) -> None:
    """``sys.exit()`` / ``KeyboardInterrupt`` at a migration file's top level used to leave the
    worker's task STARTED forever: the job fails with the typed error naming the file, and the
    next job of the chain never runs."""
    marker = celery_project.path / "leave-now"
    write_marking(project, A)
    project.write_migration(B, (
        "import sys\nfrom pathlib import Path\n\n"
        f"if Path({str(marker)!r}).exists():\n    {leave}\n\n\n"
        "def up(ctx):\n    ctx.db.marks.insert_one({'name': 'B'})\n\n\n"
        "def down(ctx):\n    pass\n"))
    write_marking(project, C)
    with workers(celery_project.worker(concurrency=1)):
        app, _ = celery_project.app()
        handle = enqueue_up(app)  # the producer reads the files before the marker exists
        marker.write_text("go")
        with pytest.raises(QueueJobFailedError) as failed:
            handle.wait(90)
        context = failed.value.context
        assert (context["migration"], context["code"]) == (B, "MIGRATION_EXECUTION_FAILED")
        assert f"Migration file failed to load: {B}, line 5: " in failed.value.message
        time.sleep(1.0)  # a later job would have had time to run
    stored = records(db)
    assert stored[A]["status"] == "applied" and C not in stored
    assert B not in stored or stored[B]["status"] != "applied"
    assert sorted(d["name"] for d in db.marks.find()) == [A]
