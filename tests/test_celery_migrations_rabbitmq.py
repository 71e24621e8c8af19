"""The migration queue with RabbitMQ as the broker (results in the test's Redis database): the
happy path, and a worker killed in the middle of ``up`` — RabbitMQ hands the unacknowledged
message back as soon as the dead worker's connection closes, and the job refuses the migration
in doubt until the operator resolves it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from helpers.celery_worker import (
    RABBIT_URL,
    CeleryProject,
    queue_names,
    redis_client,
    require_rabbitmq,
    workers,
)
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
from migronaut.celery import enqueue_up


@pytest.fixture
def rabbit_project(project: Any, redis_db: int,
                   monkeypatch: pytest.MonkeyPatch) -> Iterator[CeleryProject]:
    """``project`` served through Celery with RabbitMQ as the broker; the test's queues are
    deleted at the end."""
    require_rabbitmq()
    from kombu import Connection

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
        with Connection(RABBIT_URL) as connection:
            channel = connection.default_channel
            for name in (queue, background):
                channel.queue_delete(name)
        redis_client(redis_db).flushdb()


def test_up_through_rabbitmq(project: Any, rabbit_project: CeleryProject, db: Any) -> None:
    for name in (A, B, C):
        write_marking(project, name)
    with workers(rabbit_project.worker(concurrency=2)):
        app, _ = rabbit_project.app()
        assert app.conf.broker_url.startswith("amqp://")
        results = enqueue_up(app).wait(90)
    assert [r["results"][0]["status"] for r in results] == ["applied"] * 3
    assert {r["status"] for r in records(db).values()} == {"applied"}
    assert sorted(d["name"] for d in db.marks.find()) == [A, B, C]


def test_a_worker_killed_mid_up_comes_back_through_rabbitmq_in_doubt(
    project: Any, rabbit_project: CeleryProject, db: Any
) -> None:
    """The message comes back; the killed body may have finished, so the job refuses until
    the operator resolves it, and the next ``up`` applies each migration once."""
    rabbit_project.base_env["MIGRONAUT_LOCK_TTL"] = "5"
    go, started = project.path / "go", project.path / "started"
    write_marking(project, A, waiting_on(go, started))
    write_marking(project, B)
    first = rabbit_project.worker(concurrency=1)
    with workers(first):
        app, _ = rabbit_project.app()
        handle = enqueue_up(app)
        until(started.exists, what="the up job to start")
        first.kill()
        started.unlink()
        go.write_text("go")
        with workers(rabbit_project.worker(concurrency=1)):
            results = in_doubt_then_resolved(handle, app, db, rabbit_project.path)
    assert [r["results"][0]["status"] for r in results] == ["applied", "applied"]
    assert sorted(d["name"] for d in db.marks.find()) == [A, B]  # exactly once each
    assert {r["status"] for r in records(db).values()} == {"applied"}


def test_without_a_result_backend_enqueue_is_refused_naming_the_setting(
    project: Any, rabbit_project: CeleryProject, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RabbitMQ carries jobs, not results: a handle could never wait, so nothing is sent."""
    from kombu import Connection

    from migronaut.celery import enqueue_converge, enqueue_down
    from migronaut.errors import ConfigInvalidError

    monkeypatch.delenv("MIGRONAUT_CELERY_RESULT_BACKEND")
    write_marking(project, A)
    app, _ = rabbit_project.app()
    for enqueue in (enqueue_up, enqueue_down, enqueue_converge):
        with pytest.raises(ConfigInvalidError) as refused:
            enqueue(app)
        assert refused.value.code == "CONFIG_INVALID" and refused.value.exit_code == 6
        assert refused.value.context["key"] == "celery.result_backend"
        assert "celery.result_backend is not set" in refused.value.message
        assert "MIGRONAUT_CELERY_RESULT_BACKEND" in refused.value.message
    with Connection(RABBIT_URL) as connection:
        _, count, _ = connection.default_channel.queue_declare(rabbit_project.queue)
    assert count == 0  # nothing was sent
    assert records(db) == {}  # nor applied


def test_a_fleet_run_through_rabbitmq(project: Any, rabbit_project: CeleryProject, cli: Any,
                                      client: Any, tenant_prefix: str) -> None:
    """The fan-out needs no result backend: steps and tenant tasks meet in the run record."""
    from helpers.fleet import counters, fleet_project
    from migronaut import Fleet

    names = fleet_project(project, tenant_prefix, tenants=3)
    with workers(rabbit_project.worker(concurrency=2)):
        sent = cli("fleet", "enqueue", "up", "--canary", "1", "--json")
        assert sent.exit_code == 0, sent.stderr
        with Fleet(cwd=project.path) as fleet:
            run_id = sent.json["runId"]
            until(lambda: fleet.logs(run_id).outcome != "running", 90, "the fleet run to end")
            assert fleet.logs(run_id).outcome == "succeeded"
    assert all(counters(client, name) == {"m1": 1, "m2": 1} for name in names)
