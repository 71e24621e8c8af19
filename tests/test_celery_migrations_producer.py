"""The migration-queue producer on real workers: converge jobs (collections.md §2.13), waiting
migrations, progress in the task state, background registrations — and the producer's refusals
of bad input, before anything is sent."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.celery_worker import redis_client, workers
from helpers.queue_migrations import A, B, C, records, until, waiting_on, write_marking
from migronaut import (
    BackgroundPendingError,
    ConfigInvalidError,
    MigrationBlockedError,
    QueueJobFailedError,
)
from migronaut.celery import enqueue_converge, enqueue_down, enqueue_up

CONVERGING = """\
converge_after_up = true

[[collections]]
name = "things"
indexes = [{key = {m = 1}, name = "by_m"}]
"""


def index_names(db: Any, name: str) -> set[str]:
    return {index["name"] for index in db[name].list_indexes()} - {"_id_"}


def test_converge_after_up_ends_the_chain_with_a_converge_job(
    project: Any, celery_project: Any, db: Any
) -> None:
    project.write("migronaut.toml", CONVERGING)
    write_marking(project, A)
    write_marking(project, B)
    with workers(celery_project.worker(concurrency=2)):
        app, _ = celery_project.app()
        handle = enqueue_up(app)
        assert [j.kind for j in handle.jobs] == ["up", "up", "converge"]
        results = handle.wait(90)
        assert results[-1]["kind"] == "converge"
        assert results[-1]["converge"]["changed"] >= 1  # it created the collection and index
        assert index_names(db, "things") == {"by_m"}
        assert enqueue_up(app).up_to_date  # nothing pending, no drift: nothing sent
        db.things.drop_index("by_m")
        drift = enqueue_up(app)  # nothing pending but drift: a converge job alone
        assert [j.kind for j in drift.jobs] == ["converge"]
        drift.wait(60)
        assert index_names(db, "things") == {"by_m"}
        assert [j.kind for j in enqueue_up(app, to=A).jobs] == []  # to: never converges


def test_a_converge_job_is_ordered(project: Any, celery_project: Any, db: Any) -> None:
    project.write("migronaut.toml", CONVERGING.replace("converge_after_up = true", ""))
    write_marking(project, A)
    with workers(celery_project.worker(concurrency=1)):
        app, _ = celery_project.app()
        with pytest.raises(QueueJobFailedError) as blocked:
            enqueue_converge(app).wait(60)
        assert blocked.value.context["code"] == MigrationBlockedError.code
        assert "things" not in db.list_collection_names()
        enqueue_up(app).wait(60)
        assert enqueue_converge(app, reason="nightly").wait(60)[0]["kind"] == "converge"
    assert index_names(db, "things") == {"by_m"}


def test_a_migration_waiting_for_background_work_is_not_enqueued(
    project: Any, celery_project: Any, db: Any
) -> None:
    write_marking(project, A)
    project.write_migration(B, """\
        requires = ["20240101500000_backfill.py"]

        def up(ctx):
            pass

        def down(ctx):
            pass
        """)
    write_marking(project, C)
    with workers(celery_project.worker(concurrency=1)):
        app, _ = celery_project.app()
        handle = enqueue_up(app)
        assert [j.migration for j in handle.jobs] == [A]
        assert handle.waiting == {"migration": B, "waitsFor": [
            {"migration": "20240101500000_backfill.py", "status": "unregistered"}]}
        assert not handle.up_to_date
        handle.wait(60)
        with pytest.raises(BackgroundPendingError) as pending:
            enqueue_up(app, B)
        assert (pending.value.code, pending.value.exit_code) == ("BACKGROUND_PENDING", 31)
    assert set(records(db)) == {A}


def test_an_up_job_reports_progress_in_its_state(project: Any, celery_project: Any,
                                                 db: Any) -> None:
    from celery.result import AsyncResult

    go, started = project.path / "go", project.path / "started"
    write_marking(project, A, waiting_on(go, started))
    with workers(celery_project.worker(concurrency=1)):
        app, _ = celery_project.app()
        handle = enqueue_up(app)
        job = AsyncResult(handle.ids[0], app=app)
        until(lambda: job.state == "PROGRESS", what="the PROGRESS state")
        assert job.info == {"kind": "up", "applied": [], "migration": A}
        go.write_text("go")
        assert handle.wait(60)[0]["results"][0]["status"] == "applied"


def test_an_up_job_lists_the_background_migrations_it_registered(
    project: Any, celery_project: Any, db: Any
) -> None:
    db.items.insert_many([{"_id": i, "n": i} for i in range(5)])
    project.write_migration("20240101000000_backfill.py", """\
        def migrate(doc, ctx):
            doc["m"] = doc["n"] * 2
            return doc

        background = {"collection": "items", "from": 0, "to": 1, "migrate": migrate}
        """)
    with workers(celery_project.worker(concurrency=1)):
        app, _ = celery_project.app()
        result = enqueue_up(app).wait(60)[0]
    assert result["results"][0]["status"] == "applied"
    assert isinstance(result["background"], list)  # coordinators: the background producer's
    state = db["_migronaut_background"].find_one({"_id": "20240101000000_backfill.py"})
    assert state is not None and state["status"] in ("pending", "running", "completed")


def test_the_producer_refuses_bad_input_before_sending(
    project: Any, celery_project: Any, db: Any, redis_db: int
) -> None:
    from celery import Celery

    write_marking(project, A)
    app, installed = celery_project.app()
    with pytest.raises(ConfigInvalidError, match=r"install\(app\) first"):
        enqueue_up(Celery("elsewhere"))
    with pytest.raises(ConfigInvalidError, match="requested_by"):
        enqueue_up(app, requested_by="x" * 129)
    with pytest.raises(ConfigInvalidError, match="--to cannot be combined"):
        enqueue_up(installed, A, to=A)
    with pytest.raises(ConfigInvalidError, match="reason"):
        enqueue_converge(app, reason="")
    assert enqueue_down(app).jobs == []  # nothing applied: nothing to revert
    client = redis_client(redis_db)
    assert client.llen(celery_project.queue) == 0  # nothing was sent
    assert records(db) == {}


def test_a_file_changed_after_planning_is_refused_by_the_worker(
    project: Any, celery_project: Any, db: Any
) -> None:
    write_marking(project, A)
    app, _ = celery_project.app()
    handle = enqueue_up(app)  # planned (and its checksum pinned) before any worker runs
    write_marking(project, A, "    pass\n")
    with workers(celery_project.worker(concurrency=1)), \
            pytest.raises(QueueJobFailedError) as refused:
        handle.wait(60)
    assert refused.value.context["code"] == "CHECKSUM_MISMATCH"
    assert "not the one planned" in refused.value.message
    assert records(db) == {} and db.marks.count_documents({}) == 0
