"""Lifecycle events (reference core §10.2): order, payloads, contained listeners."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import project_on
from helpers.engine import (
    Events,
    applied,
    captured_logger,
    hold_lock,
    make_migrator,
    records,
    write_simple,
)
from migronaut import LockAlreadyHeldError, LockLostError, MigrationExecutionFailedError
from migronaut.errors import RunAbortedError
from migronaut.observability.events import EVENTS


def test_event_order_and_payloads_of_a_successful_up(project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    with make_migrator(project, lock_ttl_seconds=30) as migrator:
        events = Events(migrator)
        migrator.up()
    assert events.names == [
        "run:start",
        "lock:acquired",
        "migration:start",
        "migration:success",
        "migration:start",
        "migration:success",
        "lock:released",
        "run:end",
    ]
    run_id = records(db)["0001_a.py"]["runId"]
    assert {e["runId"] for e in events.items} == {run_id}
    start, acquired, m_start, m_ok = events.items[:4]
    assert start["command"] == "up" and start["direction"] == "up"
    assert acquired["owner"] == run_id and acquired["ttlMs"] == 30_000
    assert isinstance(acquired["acquireMs"], int)
    assert m_start == {
        "event": "migration:start",
        "runId": run_id,
        "migration": "0001_a.py",
        "direction": "up",
        "batch": 1,
    }
    assert m_ok["migration"] == "0001_a.py" and m_ok["batch"] == 1
    assert isinstance(m_ok["durationMs"], int) and m_ok["attempts"] == 1
    released, end = events.items[-2:]
    assert released["owner"] == run_id
    assert end["success"] is True and end["command"] == "up" and end["direction"] == "up"
    assert (end["applied"], end["reverted"], end["total"]) == (2, 0, 2)
    assert isinstance(end["durationMs"], int)
    assert "error" not in end


def test_events_of_a_failed_run(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    project.write_migration(
        "0002_fail",
        """
        def up(ctx):
            raise RuntimeError("no route to mongodb://u:Pw0rdLeak@h")

        def down(ctx):
            pass
    """,
    )
    with make_migrator(project) as migrator:
        events = Events(migrator)
        with pytest.raises(MigrationExecutionFailedError):
            migrator.up()
    assert events.names == [
        "run:start",
        "lock:acquired",
        "migration:start",
        "migration:success",
        "migration:start",
        "migration:error",
        "lock:released",
        "run:end",
    ]
    error_event = events.of("migration:error")[0]
    assert error_event["migration"] == "0002_fail.py" and error_event["batch"] == 1
    assert "Pw0rdLeak" not in error_event["error"] and "no route" in error_event["error"]
    end = events.of("run:end")[0]
    assert end["success"] is False and end["applied"] == 1 and end["total"] == 2
    assert "Pw0rdLeak" not in end["error"] and "0002_fail.py" in end["error"]


def test_down_and_redo_events(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project) as migrator:
        migrator.up()
        events = Events(migrator)
        migrator.down()
        assert events.of("run:start")[0]["command"] == "down"
        assert events.of("run:end")[0]["reverted"] == 1
        assert events.of("migration:start")[0]["direction"] == "down"
        migrator.up()
        events.items.clear()
        migrator.redo()
    assert [(e["migration"], e["direction"]) for e in events.of("migration:success")] == [
        ("0001_a.py", "down"),
        ("0001_a.py", "up"),
    ]
    end = events.of("run:end")[0]
    assert (end["command"], end["applied"], end["reverted"]) == ("redo", 1, 1)


def test_no_lock_emits_skipped_lock_events(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project) as migrator:
        events = Events(migrator)
        migrator.up(no_lock=True)
    assert events.of("lock:acquired")[0]["skipped"] is True
    assert events.of("lock:released")[0]["skipped"] is True
    assert applied(db) == ["0001_a.py"]


def test_a_refused_lock_emits_no_run_events(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    hold_lock(db)
    with make_migrator(project) as migrator:
        events = Events(migrator)
        with pytest.raises(LockAlreadyHeldError):
            migrator.up()
    assert not {"run:start", "lock:acquired", "migration:start"} & set(events.names)


@pytest.mark.parametrize(
    "event", ["*", "run:start", "migration:start", "migration:success", "lock:acquired", "run:end"]
)
def test_a_raising_listener_never_breaks_a_run(project: Any, db: Any, event: str) -> None:
    write_simple(project, "0001_a", "0002_b")

    def explode(payload: dict[str, Any]) -> None:
        raise RuntimeError("listener bug")

    with make_migrator(project) as migrator:
        migrator.on(event, explode)
        results = migrator.up()
    assert [r.status for r in results] == ["applied", "applied"]
    assert applied(db) == ["0001_a.py", "0002_b.py"]


def test_off_removes_a_listener(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    seen: list[str] = []

    def listener(payload: dict[str, Any]) -> None:
        seen.append(payload["event"])

    with make_migrator(project) as migrator:
        migrator.on("run:start", listener).off("run:start", listener)
        migrator.up()
    assert seen == []


# ------------------------------------------------------------------------- stop and lost lock


def test_events_of_a_stopped_run(project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    with make_migrator(project) as migrator:
        events = Events(migrator)
        migrator.on("migration:success", lambda payload: migrator.stop("deploy cancelled"))
        with pytest.raises(RunAbortedError):
            migrator.up()
    assert events.names == [
        "run:start",
        "lock:acquired",
        "migration:start",
        "migration:success",
        "lock:released",
        "run:end",
    ]
    end = events.of("run:end")[0]
    assert end["success"] is False and end["error"] == "deploy cancelled"
    assert (end["applied"], end["total"]) == (1, 1)
    run_id = records(db)["0001_a.py"]["runId"]
    assert {e["runId"] for e in events.items} == {run_id}


def test_events_of_a_run_that_lost_its_lock(project: Any, db: Any) -> None:
    project.write_migration(
        "0001_loses_lock",
        """
        def up(ctx):
            ctx.db["_migronaut_locks"].delete_one({"_id": "migronaut_lock"})
            ctx.cancellation.wait(20)  # bounded: until the heartbeat notices

        def down(ctx):
            pass
        """,
    )
    write_simple(project, "0002_b")
    with (
        captured_logger() as (logger, _),
        make_migrator(project, lock_ttl_seconds=2, logger=logger) as migrator,
    ):
        events = Events(migrator)
        with pytest.raises(LockLostError):
            migrator.up()
    assert events.names == [
        "run:start",
        "lock:acquired",
        "migration:start",
        "lock:lost",
        "migration:success",
        "lock:released",
        "run:end",
    ]
    run_id = events.of("run:start")[0]["runId"]
    assert events.of("lock:lost")[0] == {
        "event": "lock:lost", "runId": run_id, "owner": run_id,
        "reason": "another run reclaimed it",
    }
    end = events.of("run:end")[0]
    assert end["success"] is False and end["error"] == "Lost the migration lock mid-run"


# -------------------------------------------------------------------------------- migration:log

USERLAND_LOGS = """
def up(ctx):
    ctx.logger.info("plain line, not an event")
    ctx.logger.debug("copied %d from mongodb://u:Pw0rdLeak@h", 7,
                     extra={"userland": True, "n": 7, "err": ValueError("dup key: { a: 1 }")})
    ctx.logger.error("x" * 3000, extra={"userland": True})

def down(ctx):
    pass
"""


@pytest.mark.parametrize("logger", ["default", None])
def test_migration_log_for_userland_lines(project: Any, db: Any, logger: Any) -> None:
    project.write_migration("0001_logs", USERLAND_LOGS)
    settings = {} if logger == "default" else {"logger": None}
    with make_migrator(project, **settings) as migrator:
        events = Events(migrator)
        migrator.up(requested_by="alice", reason="OPS-7")
    assert events.names.index("migration:log") > events.names.index("migration:start")
    first, second = events.of("migration:log")  # the plain line is no event
    run_id = events.of("run:start")[0]["runId"]
    assert first == {
        "event": "migration:log", "kind": "migration", "runId": run_id, "direction": "up",
        "migration": "0001_logs.py", "batch": 1, "attempt": 1, "level": "debug",
        "msg": "copied 7 from mongodb://u:****@h",
        "data": {"n": 7, "err": {"name": "ValueError", "message": "dup key: { **** }"}},
        "at": first["at"], "seq": first["seq"], "requestedBy": "alice", "reason": "OPS-7",
    }
    assert first["at"].tzinfo is not None
    assert second["seq"] > first["seq"]
    assert second["level"] == "error" and second["truncated"] is True
    assert second["msg"] == "x" * 2048 + "…"


def test_a_plain_migration_logs_its_attempt_like_a_transactional_one(
    project: Any, db: Any
) -> None:
    project.write_migration("0001_logs", USERLAND_LOGS)
    with captured_logger() as (logger, handler), make_migrator(project, logger=logger) as migrator:
        events = Events(migrator)
        migrator.up()
    assert [e["attempt"] for e in events.of("migration:log")] == [1, 1]
    lines = [r for r in handler.records if r.__dict__.get("migration") == "0001_logs.py"
             and r.getMessage().startswith(("plain line", "copied"))]
    assert len(lines) == 2 and [r.__dict__.get("attempt") for r in lines] == [1, 1]


def test_a_raising_listener_of_migration_log_never_breaks_the_migration(
    project: Any, db: Any
) -> None:
    project.write_migration("0001_logs", USERLAND_LOGS)

    def explode(payload: dict[str, Any]) -> None:
        raise RuntimeError("listener bug")

    with make_migrator(project) as migrator:
        migrator.on("migration:log", explode)
        results = migrator.up()
    assert [r.status for r in results] == ["applied"]


# --------------------------------------------------------------------- every listener contained


def _scenario_for(event: str, project: Any) -> tuple[dict[str, Any], Any]:
    """A run that emits ``event``: (migrator settings, action on the migrator)."""
    if event == "migration:skipped":
        write_simple(project, "0001_a")

        def skip(migrator: Any) -> Any:
            migrator.up()
            return migrator.up("0001_a.py")

        return {}, skip
    if event == "converge:wait":
        def converge_and_wait(migrator: Any) -> Any:
            result = migrator.converge()
            assert result.changed == 2 and result.search["wait"]["outcome"] == "ready"
            return []

        return {"collections": [{"name": "c", "search_indexes": [
            {"definition": {"mappings": {"dynamic": True}}}]}],
            "wait_for_search_indexes": True}, converge_and_wait
    if event.startswith("converge:"):
        def converge(migrator: Any) -> Any:
            assert migrator.converge().changed == 2
            return []

        return {"collections": [{"name": "c", "indexes": [{"key": {"a": 1}}]}]}, converge
    if event == "migration:error":
        project.write_migration("0001_fail", "def up(ctx):\n    raise ValueError('boom')\n\n"
                                             "def down(ctx):\n    pass\n")
        return {}, lambda migrator: migrator.up()
    if event == "lock:lost":
        project.write_migration(
            "0001_loses_lock",
            """
            def up(ctx):
                ctx.db["_migronaut_locks"].delete_one({"_id": "migronaut_lock"})
                for _ in range(1000):  # bounded: until the lock:lost listener was called
                    if ctx.db["called"].find_one() or ctx.cancellation.wait(0.02):
                        break

            def down(ctx):
                pass
            """,
        )
        return {"lock_ttl_seconds": 2, "on_lock_lost": "warn"}, lambda migrator: migrator.up()
    project.write_migration("0001_logs", USERLAND_LOGS)
    write_simple(project, "0002_b")
    return {}, lambda migrator: migrator.up()


@pytest.mark.parametrize("event", [*EVENTS, "*"])
def test_a_raising_listener_of_any_event_never_changes_the_run(
    project: Any, db: Any, event: str, request: pytest.FixtureRequest, tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if event == "converge:wait":  # only a server with Atlas Search builds search indexes
        search_client = request.getfixturevalue("search_client")
        (tmp_path / "search").mkdir()
        project = project_on(tmp_path / "search", request.getfixturevalue("search_uri"),
                             db.name, monkeypatch)
        db = search_client[db.name]
        request.addfinalizer(lambda: search_client.drop_database(db.name))
    settings, action = _scenario_for(event, project)
    called: list[str] = []

    def explode(payload: dict[str, Any]) -> None:
        called.append(payload["event"])
        db["called"].insert_one({"event": payload["event"]})
        raise RuntimeError("listener bug")

    with captured_logger() as (logger, _), make_migrator(project, logger=logger, **settings) as m:
        m.on(event, explode)
        if event == "migration:error":
            with pytest.raises(MigrationExecutionFailedError) as info:
                action(m)
            assert "boom" in info.value.message  # the run's own error, not the listener's
            assert records(db)["0001_fail.py"]["status"] == "failed"
        else:
            results = action(m)
            assert all(r.status in ("applied", "skipped") for r in results)
    assert called and (event == "*" or set(called) == {event})
    assert db["_migronaut_locks"].count_documents({}) == 0
    assert db["_migronaut_runs"].count_documents({"outcome": "running"}) == 0


#: Its transaction is retried once: the first attempt fails the way a write conflict does.
RETRIED_ONCE = '''
from pymongo.errors import OperationFailure

use_transaction = True


def up(ctx):
    ctx.db["things"].insert_one({"attempt": ctx.run.attempt}, session=ctx.session)
    if ctx.run.attempt == 1:
        raise OperationFailure("WriteConflict", code=112, details={
            "errmsg": "WriteConflict", "code": 112, "errorLabels": ["TransientTransactionError"]})


def down(ctx):
    pass
'''


def test_the_success_line_and_event_carry_the_attempts_a_migration_needed(
    project: Any, db: Any
) -> None:
    project.write_migration("0001_retried", RETRIED_ONCE)
    write_simple(project, "0002_plain")
    with captured_logger() as (logger, handler), make_migrator(project, logger=logger) as m:
        events = Events(m)
        m.up()
    applied_lines = [r for r in handler.records if r.getMessage().startswith("✔ Applied")]
    assert [(r.__dict__["migration"], r.__dict__["attempts"]) for r in applied_lines] == [
        ("0001_retried.py", 2), ("0002_plain.py", 1)
    ]
    assert [e["attempts"] for e in events.of("migration:success")] == [2, 1]
    rows = db["things"].find({"attempt": {"$exists": True}})
    assert [d["attempt"] for d in rows] == [2]  # the first attempt rolled back
