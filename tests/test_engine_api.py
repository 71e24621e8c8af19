"""``run_migrations`` (reference core §8.4, §5.5): the boot helper, its summary and lock waiting."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from helpers.engine import (
    LOCKS,
    applied,
    calls,
    captured_logger,
    hold_lock,
    wait_until,
    write_simple,
)
from migronaut import (
    ConfigInvalidError,
    LockAlreadyHeldError,
    MigrationExecutionFailedError,
    Migrator,
    RunAbortedError,
    run_migrations,
)


def settings(project: Any, **extra: Any) -> dict[str, Any]:
    return {
        "uri": project.uri,
        "db_name": project.db_name,
        "cwd": project.path,
        "env_file": False,
        **extra,
    }


def test_summary_of_a_boot_and_of_a_second_boot(project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    seen: list[Migrator] = []
    summary = run_migrations(**settings(project), on_migrator=seen.append)
    assert [(r.file, r.status) for r in summary.applied] == [
        ("0001_a.py", "applied"),
        ("0002_b.py", "applied"),
    ]
    assert summary.up_to_date is False
    assert (summary.waited, summary.waited_ms, summary.attempts) == (False, 0, 1)
    assert summary.to_dict()["upToDate"] is False
    assert len(seen) == 1 and seen[0]._ws.connection._client is None  # always disconnected
    again = run_migrations(**settings(project))
    assert again.applied == [] and again.up_to_date is True
    assert calls(db) == ["0001_a", "0002_b"]


def test_failures_propagate_as_typed_errors(project: Any, db: Any) -> None:
    project.write_migration(
        "0001_fail", "def up(ctx):\n    raise ValueError('x')\ndef down(ctx):\n    pass\n"
    )
    with pytest.raises(MigrationExecutionFailedError):
        run_migrations(**settings(project))
    assert db[LOCKS].count_documents({}) == 0


def test_a_held_lock_throws_by_default(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    hold_lock(db)
    with pytest.raises(LockAlreadyHeldError):
        run_migrations(**settings(project))
    assert applied(db) == []


def test_wait_for_a_held_lock_then_apply(project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    hold_lock(db, owner="peer-replica")
    outcome: dict[str, Any] = {}
    with captured_logger() as (logger, handler):

        def boot() -> None:
            try:
                outcome["summary"] = run_migrations(
                    **settings(project, logger=logger),
                    on_lock_held="wait",
                    lock_poll_interval_ms=20,
                    lock_wait_timeout_ms=60_000,
                )
            except BaseException as error:
                outcome["error"] = error

        thread = threading.Thread(target=boot)
        thread.start()
        wait_until(lambda: handler.has("waiting for it to release"), what="the waiter to wait")
        assert applied(db) == []  # still waiting while the peer holds the lock
        db[LOCKS].delete_one({"owner": "peer-replica"})  # the peer finishes
        thread.join(30)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    summary = outcome["summary"]
    assert summary.waited is True and summary.attempts >= 2 and summary.waited_ms > 0
    assert [r.file for r in summary.applied] == ["0001_a.py", "0002_b.py"]
    assert summary.up_to_date is False
    assert applied(db) == ["0001_a.py", "0002_b.py"]


def test_wait_times_out_on_a_stalled_holder(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    hold_lock(db, owner="stalled")
    with pytest.raises(LockAlreadyHeldError) as info:
        run_migrations(
            **settings(project),
            on_lock_held="wait",
            lock_wait_timeout_ms=300,
            lock_poll_interval_ms=20,
        )
    context = info.value.context
    assert context["timedOut"] is True
    assert context["attempts"] >= 2 and context["waitedMs"] >= 300
    assert context["holder"]["runId"] == "stalled"
    assert applied(db) == []


class RecordingStop(threading.Event):
    """A stop event that is never set and keeps every pause the waiter (the thread that made
    it) asked it for; the thread forwarding a stop to the run polls it too."""

    def __init__(self) -> None:
        super().__init__()
        self.pauses: list[float] = []
        self.waiter = threading.current_thread()

    def wait(self, timeout: float | None = None) -> bool:
        if timeout and threading.current_thread() is self.waiter:
            self.pauses.append(timeout)
        return super().wait(timeout)


def test_every_poll_is_logged_and_no_pause_outlasts_a_quarter_of_the_budget(
    project: Any, db: Any
) -> None:
    write_simple(project, "0001_a")
    hold_lock(db, owner="stalled")
    stop = RecordingStop()
    with captured_logger() as (logger, handler), pytest.raises(LockAlreadyHeldError) as info:
        run_migrations(**settings(project, logger=logger), on_lock_held="wait",
                       lock_wait_timeout_ms=400, lock_poll_interval_ms=200, stop_event=stop)
    attempts = info.value.context["attempts"]
    assert stop.pauses and all(pause <= 0.1 for pause in stop.pauses)  # 400 ms / 4
    polls = [r.__dict__ for r in handler.records
             if r.levelname == "DEBUG" and "nextDelayMs" in r.__dict__]
    # one line per poll, the refusal that timed out excepted
    assert [p["attempts"] for p in polls] == list(range(1, attempts))
    assert [p["nextDelayMs"] for p in polls] == [int(pause * 1000) for pause in stop.pauses]
    waited = [p["waitedMs"] for p in polls]
    assert waited == sorted(waited) and waited[-1] <= info.value.context["waitedMs"]
    assert applied(db) == []


def test_no_wait_for_a_lock_document_nobody_can_read(project: Any, db: Any) -> None:
    """It frees only by ``unlock``: waiting out the budget would only delay the start-up."""
    write_simple(project, "0001_a")
    hold_lock(db, owner="odd")
    db[LOCKS].update_one({"owner": "odd"}, {"$unset": {"lockedAt": ""}})
    with pytest.raises(LockAlreadyHeldError) as info:
        run_migrations(**settings(project), on_lock_held="wait", lock_wait_timeout_ms=600_000,
                       lock_poll_interval_ms=20)
    context = info.value.context
    assert context["problems"] == [{"field": "lockedAt", "message": "lockedAt is missing"}]
    assert "timedOut" not in context and "attempts" not in context  # refused on the first try
    assert applied(db) == []


def test_a_stop_event_aborts_the_wait(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    hold_lock(db)
    stop = threading.Event()
    outcome: dict[str, Any] = {}
    with captured_logger() as (logger, handler):

        def boot() -> None:
            try:
                run_migrations(
                    **settings(project, logger=logger),
                    on_lock_held="wait",
                    lock_poll_interval_ms=20,
                    stop_event=stop,
                )
            except BaseException as error:
                outcome["error"] = error

        thread = threading.Thread(target=boot)
        thread.start()
        wait_until(lambda: handler.has("waiting for it to release"), what="the waiter to wait")
        stop.set()
        thread.join(30)
    assert isinstance(outcome.get("error"), RunAbortedError)
    assert applied(db) == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"on_lock_held": "spin"},
        {"lock_wait_timeout_ms": 0},
        {"lock_wait_timeout_ms": -1},
        {"lock_poll_interval_ms": 0},
        {"lock_poll_interval_ms": 2**31},
        {"lock_poll_interval_ms": True},
    ],
)
def test_wait_options_are_validated_before_connecting(project: Any, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigInvalidError):
        run_migrations(
            uri="mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=100",
            db_name="x",
            cwd=project.path,
            env_file=False,
            **kwargs,
        )


@pytest.mark.parametrize(("kwargs", "option", "message"), [
    ({"on_migrator": 42}, "on_migrator",
     "on_migrator must be a callable taking the migrator (or None) (got 42)"),
    ({"lock_poll_interval_ms": None}, "lock_poll_interval_ms",
     "lock_poll_interval_ms must be a positive integer (got None)"),
    ({"lock_wait_timeout_ms": "5s"}, "lock_wait_timeout_ms",
     "lock_wait_timeout_ms must be a positive integer (got '5s')"),
    ({"lock_poll_interval_ms": 0.5}, "lock_poll_interval_ms",
     "lock_poll_interval_ms must be a positive integer (got 0.5)"),
    ({"no_lock": "yes"}, "no_lock", "no_lock must be True or False (got 'yes')"),
    ({"stop_event": True}, "stop_event",
     "stop_event must be a threading.Event (or None) (got True)"),
    ({"on_lock_held": None}, "on_lock_held", "on_lock_held must be 'throw' or 'wait' (got None)"),
    ({"config_path": 3}, "config_path", "config_path must be a path (or None) (got 3)"),
])
def test_every_run_migrations_option_is_checked_before_connecting(
    project: Any, db: Any, kwargs: dict[str, Any], option: str, message: str
) -> None:
    """A bad option is ``CONFIG_INVALID`` naming it before anything connects — not a raw
    ``TypeError`` from inside the run (``on_migrator=42``), nor a value that passes the check
    and fails later (``lock_poll_interval_ms=None``): no hook, no body, no lock, no record."""
    write_simple(project, "0001_a")
    seen: list[Migrator] = []
    options = {"on_migrator": seen.append, **kwargs}
    with pytest.raises(ConfigInvalidError) as info:
        run_migrations(**settings(project), **options)
    assert info.value.code == "CONFIG_INVALID" and info.value.exit_code == 6
    assert info.value.message == message
    assert info.value.context["option"] == option
    assert not isinstance(info.value.__cause__, TypeError)
    assert seen == []
    assert applied(db) == [] and calls(db) == []
    assert db[LOCKS].count_documents({}) == 0


def test_a_stop_event_set_during_the_run_stops_it_between_migrations(project: Any, db: Any) -> None:
    """Reference §8.4: the signal stops a wait between polls *and a run between migrations*."""
    project.write_migration(
        "0001_a",
        """
        def up(ctx):
            # the stop reaches the run asynchronously: wait (bounded) until it has
            ctx.db["seen"].insert_one({"cancelled": ctx.cancellation.wait(10)})

        def down(ctx):
            pass
        """,
    )
    write_simple(project, "0002_b", "0003_c")
    stop = threading.Event()

    def wire(migrator: Migrator) -> None:
        migrator.on("migration:start", lambda payload: stop.set())

    with pytest.raises(RunAbortedError) as info:
        run_migrations(**settings(project), stop_event=stop, on_migrator=wire)
    assert db["seen"].find_one()["cancelled"] is True
    assert [r["file"] for r in info.value.context["results"]] == ["0001_a.py"]
    assert applied(db) == ["0001_a.py"]
    assert calls(db) == []
    assert db[LOCKS].count_documents({}) == 0
