"""Lifecycle events (reference core §10.2): order, payloads, contained listeners."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.engine import Events, applied, hold_lock, make_migrator, records, write_simple
from migronaut import LockAlreadyHeldError, MigrationExecutionFailedError


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
