"""Running migrations: transactions, timeouts, ``stop()``, reentrancy (reference core §7.6, §7.7,
§8.3, §5.4)."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.engine import (
    Events,
    applied,
    body_threads_alive,
    calls,
    make_migrator,
    records,
    wait_until,
    write_simple,
)
from migronaut import (
    ConfigInvalidError,
    MigrationExecutionFailedError,
    MigrationInDoubtError,
    MigrationTimeoutError,
    RunAbortedError,
    TransactionsUnsupportedError,
)
from migronaut.core import changelog as changelog_module

# -------------------------------------------------------------------------- transactions

TXN_WRITE_THEN_RAISE = """
use_transaction = {flag}

def up(ctx):
    ctx.db["data"].insert_one({{"m": "written"}}, session=ctx.session)
    ctx.db["seen"].insert_one({{"session": ctx.session is not None}})
    raise RuntimeError("failed after writing")

def down(ctx):
    pass
"""


def test_a_transactional_body_that_raises_leaves_no_data_and_no_applied_record(
    project: Any, db: Any
) -> None:
    project.write_migration("0001_txn", TXN_WRITE_THEN_RAISE.format(flag=True))
    with make_migrator(project) as migrator, pytest.raises(MigrationExecutionFailedError):
        migrator.up()
    assert db["seen"].find_one()["session"] is True  # the body ran, inside a session
    assert db["data"].count_documents({}) == 0  # rolled back
    assert records(db)["0001_txn.py"]["status"] == "failed"  # only the failed trace


def test_without_a_transaction_the_same_body_leaves_its_write(project: Any, db: Any) -> None:
    project.write_migration("0001_plain", TXN_WRITE_THEN_RAISE.format(flag=False))
    with make_migrator(project) as migrator, pytest.raises(MigrationExecutionFailedError):
        migrator.up()
    assert db["seen"].find_one()["session"] is False
    assert db["data"].count_documents({}) == 1


SESSION_PROBE = """
{header}
def up(ctx):
    ctx.db["probe"].insert_one({{"name": {name!r}, "session": ctx.session is not None}},
                               session=ctx.session)

def down(ctx):
    ctx.db["probe"].insert_one({{"name": {name!r}, "down_session": ctx.session is not None}},
                               session=ctx.session)
"""


@pytest.mark.parametrize("global_flag", [False, True])
def test_use_transaction_per_file_overrides_the_global_default(
    project: Any, db: Any, global_flag: bool
) -> None:
    project.write_migration("0001_default", SESSION_PROBE.format(header="", name="default"))
    project.write_migration(
        "0002_on", SESSION_PROBE.format(header="use_transaction = True", name="on")
    )
    project.write_migration(
        "0003_off", SESSION_PROBE.format(header="use_transaction = False", name="off")
    )
    with make_migrator(project, use_transaction=global_flag) as migrator:
        migrator.up()
        migrator.down()
    seen = {d["name"]: d["session"] for d in db["probe"].find({"session": {"$exists": True}})}
    assert seen == {"default": global_flag, "on": True, "off": False}
    down = {
        d["name"]: d["down_session"] for d in db["probe"].find({"down_session": {"$exists": 1}})
    }
    assert down == {"default": global_flag, "on": True, "off": False}


def test_the_changelog_write_is_inside_the_transaction(
    project: Any, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If recording fails after the record was written in the transaction, data and record
    roll back together."""
    original = changelog_module.Changelog.mark_applied

    def write_then_fail(self: Any, record: Any, session: Any = None) -> None:
        original(self, record, session)
        raise RuntimeError("network blip after the changelog write")

    monkeypatch.setattr(changelog_module.Changelog, "mark_applied", write_then_fail)
    project.write_migration(
        "0001_txn", SESSION_PROBE.format(header="use_transaction = True", name="txn")
    )
    with make_migrator(project) as migrator, pytest.raises(MigrationExecutionFailedError):
        migrator.up()
    assert db["probe"].count_documents({}) == 0
    assert records(db)["0001_txn.py"]["status"] == "failed"


def test_recording_failure_without_a_transaction_says_the_body_succeeded(
    project: Any, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(self: Any, *args: Any) -> Any:
        raise RuntimeError("changelog unavailable")

    # the final write alone, and sent with the next migration's claim
    monkeypatch.setattr(changelog_module.Changelog, "finish", fail)
    monkeypatch.setattr(changelog_module.Changelog, "finish_and_claim", fail)
    write_simple(project, "0001_a", "0002_b")
    with make_migrator(project) as migrator, pytest.raises(MigrationExecutionFailedError) as info:
        migrator.up()
    context = info.value.context
    assert context["phase"] == "changelog-write" and context["bodySucceeded"] is True
    assert context["inDoubt"] is True
    assert "changelog unavailable" in info.value.message
    assert "migronaut resolve 0001_a.py --applied" in info.value.message
    assert calls(db) == ["0001_a"]  # the body ran and its write stays; 0002 never ran
    # no failed trace claims the body failed: its intent stays, in doubt
    assert {name: r["status"] for name, r in records(db).items()} == {"0001_a.py": "running"}


# ------------------------------------------------------------------------------ timeouts

SLOW_BODY = """
{header}
timeout_ms = 200

def up(ctx):
    ctx.db["data"].insert_one({{"m": "slow"}}, session=ctx.session)
    cancelled = ctx.cancellation.wait(20)  # returns as soon as the run cancels us
    ctx.db["late"].insert_one({{"cancelled": cancelled,
                               "reason": getattr(ctx.cancellation.reason, "code", None)}})

def down(ctx):
    pass
"""


@pytest.mark.parametrize("transactional", [False, True])
def test_timeout_stops_the_run_and_records_nothing_even_if_the_body_finishes(
    project: Any, db: Any, transactional: bool
) -> None:
    header = "use_transaction = True" if transactional else ""
    project.write_migration("0001_slow", SLOW_BODY.format(header=header))
    write_simple(project, "0002_next")
    with make_migrator(project) as migrator, pytest.raises(MigrationTimeoutError) as info:
        migrator.up()
    error = info.value
    assert error.exit_code == 14
    assert error.context["name"] == "0001_slow.py" and error.context["timeoutMs"] == 200
    assert error.context["direction"] == "up"
    assert "timed out after 200ms" in error.message
    # the body keeps running in the background, sees the cancellation and finishes late
    late = wait_until(lambda: db["late"].find_one(), what="the late body to finish")
    wait_until(lambda: not body_threads_alive(), what="the body thread to end")
    assert late["cancelled"] is True and late["reason"] == "MIGRATION_TIMEOUT"
    assert applied(db) == []
    assert calls(db) == []  # the next migration never ran
    # a transactional body's writes are never committed after its timeout
    assert db["data"].count_documents({}) == (0 if transactional else 1)
    if transactional:
        assert records(db)["0001_slow.py"]["status"] == "failed"
        assert error.context["inDoubt"] is False
        return
    # outside a transaction the body wrote and may have gone on: its claim stays, in doubt, and
    # nothing runs it again until an operator records the outcome
    assert error.context["inDoubt"] is True and "migronaut resolve 0001_slow.py" in error.message
    assert records(db)["0001_slow.py"]["status"] == "running"
    with make_migrator(project) as migrator, pytest.raises(MigrationInDoubtError) as again:
        migrator.up()
    assert again.value.exit_code == 36 and again.value.context["name"] == "0001_slow.py"
    assert db["data"].count_documents({}) == 1


def test_global_timeout_and_file_override(project: Any, db: Any) -> None:
    project.write_migration(
        "0001_quick",
        """
        timeout_ms = 60000

        def up(ctx):
            ctx.db["quick"].insert_one({"ok": True})

        def down(ctx):
            pass
    """,
    )
    project.write_migration(
        "0002_waits",
        """
        def up(ctx):
            ctx.cancellation.wait(20)

        def down(ctx):
            pass
    """,
    )
    with (
        make_migrator(project, timeout_ms=150) as migrator,
        pytest.raises(MigrationTimeoutError) as info,
    ):
        migrator.up()
    assert info.value.context["timeoutMs"] == 150
    assert applied(db) == ["0001_quick.py"]
    wait_until(lambda: not body_threads_alive(), what="the body thread to end")


# ---------------------------------------------------------------------------------- stop


def test_stop_finishes_the_migration_in_flight_and_skips_the_rest(project: Any, db: Any) -> None:
    project.write_migration(
        "0001_a",
        """
        def up(ctx):
            ctx.db["seen"].insert_one({"cancelled": ctx.cancellation.cancelled})

        def down(ctx):
            pass
    """,
    )
    write_simple(project, "0002_b", "0003_c")
    with make_migrator(project) as migrator:
        events = Events(migrator)

        def stop_on_first(payload: dict[str, Any]) -> None:
            if payload["migration"] == "0001_a.py":
                migrator.stop("operator said so")

        migrator.on("migration:start", stop_on_first)
        with pytest.raises(RunAbortedError) as info:
            migrator.up()
        error = info.value
        assert error.exit_code == 11
        assert error.context["reason"] == "operator said so"
        assert [(r["file"], r["status"]) for r in error.context["results"]] == [
            ("0001_a.py", "applied")
        ]
        assert applied(db) == ["0001_a.py"]
        assert db["seen"].find_one()["cancelled"] is True  # the body could see the stop
        assert calls(db) == []
        assert db["_migronaut_locks"].count_documents({}) == 0
        assert events.of("run:end")[0]["success"] is False
        # the stop does not leak into the next run
        migrator.off("migration:start", stop_on_first)
        assert [r.file for r in migrator.up()] == ["0002_b.py", "0003_c.py"]


def test_stop_with_nothing_running_is_a_no_op(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project) as migrator:
        migrator.stop()
        assert [r.status for r in migrator.up()] == ["applied"]


def test_stop_during_set_up_is_latched_until_the_run_starts(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    holder: list[Any] = []

    def generate_id() -> str:
        # called while the run is being set up (connected, not yet locked): a signal lands here
        holder[0].stop("SIGTERM received")
        return "run-latched"

    with make_migrator(project, generate_id=generate_id) as migrator:
        holder.append(migrator)
        events = Events(migrator)
        with pytest.raises(RunAbortedError) as info:
            migrator.up()
    assert info.value.context["reason"] == "SIGTERM received"
    assert applied(db) == [] and calls(db) == []
    assert "migration:start" not in events.names


def test_a_second_run_on_the_same_migrator_is_refused(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    refused: list[BaseException] = []
    with make_migrator(project) as migrator:

        def reenter(payload: dict[str, Any]) -> None:
            for attempt in (migrator.up, migrator.down, migrator.redo):
                try:
                    attempt()
                except BaseException as error:
                    refused.append(error)

        migrator.on("migration:start", reenter)
        assert [r.status for r in migrator.up()] == ["applied"]
    assert len(refused) == 3
    assert all(isinstance(e, ConfigInvalidError) for e in refused)
    assert "already in flight" in str(refused[0])
    assert refused[0].context["runId"] == records(db)["0001_a.py"]["runId"]  # type: ignore[attr-defined]
    assert calls(db) == ["0001_a"]


def test_a_standalone_servers_transaction_refusal_is_named_clearly(project: Any, db: Any) -> None:
    """The dev server runs transactions, so the standalone reply (code 20) is raised by the body
    as the driver would raise it; the engine must name the topology, not blame the migration."""
    project.write_migration(
        "0001_txn",
        """
        from pymongo.errors import OperationFailure

        use_transaction = True

        def up(ctx):
            raise OperationFailure(
                "Transaction numbers are only allowed on a replica set member or mongos", code=20
            )

        def down(ctx):
            pass
        """,
    )
    with make_migrator(project) as migrator, pytest.raises(TransactionsUnsupportedError) as info:
        migrator.up()
    assert info.value.exit_code == 15
    assert info.value.context["name"] == "0001_txn.py"
    assert "replica set" in info.value.message
    assert applied(db) == []
