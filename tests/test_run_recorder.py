"""The run recorder: one record per locked run (who, why, what, outcome) and its log lines."""

from __future__ import annotations

import datetime as dt
import getpass
from typing import Any

import pytest
from pymongo import monitoring

from helpers.engine import (
    LOCKS,
    LOSES_LOCK_AND_WAITS,
    Events,
    applied,
    calls,
    captured_logger,
    hold_lock,
    make_migrator,
    records,
    write_simple,
)
from migronaut import LockAlreadyHeldError, LockLostError, MigrationExecutionFailedError
from migronaut.errors import RunAbortedError
from migronaut.observability import recorder as recorder_module
from migronaut.observability.recorder import REQUESTED_BY_VARIABLES, resolve_requested_by

RUNS = "_migronaut_runs"
LOGS = "_migronaut_runs_logs"

FAILING = """
def up(ctx):
    ctx.logger.info("about to fail")
    raise RuntimeError("no route to mongodb://u:Pw0rdLeak@h")

def down(ctx):
    pass
"""

LOGGING = """
import datetime

def up(ctx):
    ctx.logger.debug("debug detail")
    ctx.logger.info("copied %d documents", 3, extra={"collection": "users", "n": 3})
    ctx.logger.warning("connecting to mongodb://admin:S3cretPw@db.example:27017/app",
                       extra={"userland": True, "uri": "mongodb://admin:S3cretPw@db/x",
                              "when": datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC),
                              "tags": {"a"}})

def down(ctx):
    ctx.logger.info("reverting")
"""


def the_run(db: Any, collection: str = RUNS) -> dict[str, Any]:
    (run,) = list(db[collection].find({}))
    return run


def lines(db: Any, run_id: str | None = None) -> list[dict[str, Any]]:
    query = {} if run_id is None else {"runId": run_id}
    return list(db[LOGS].find(query, {"_id": 0}).sort("seq", 1))


# ------------------------------------------------------------------------------- record content


def test_a_successful_up_is_recorded_with_who_why_what(project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    with make_migrator(project) as migrator:
        migrator.up(requested_by="alice", reason="ticket OPS-7")
    run = the_run(db)
    assert run["_id"] == records(db)["0001_a.py"]["runId"]
    assert (run["command"], run["direction"], run["outcome"]) == ("up", "up", "success")
    assert (run["requestedBy"], run["requestedBySource"]) == ("alice", "argument")
    assert run["reason"] == "ticket OPS-7"
    assert run["executedBy"] == records(db)["0001_a.py"]["executedBy"]
    assert isinstance(run["host"], str) and isinstance(run["pid"], int)
    assert run["locked"] is True and run["environment"] == "production"
    assert isinstance(run["startedAt"], dt.datetime) and isinstance(run["endedAt"], dt.datetime)
    assert run["startedAt"] <= run["endedAt"]
    assert isinstance(run["durationMs"], int) and run["durationMs"] >= 0
    assert (run["applied"], run["reverted"], run["skipped"], run["total"]) == (
        ["0001_a.py", "0002_b.py"], [], 0, 2)
    assert run["error"] is None and run["lockLost"] is None


def test_down_and_redo_records(project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    with make_migrator(project) as migrator:
        migrator.up()
        migrator.down()
        migrator.up()
        migrator.redo()
    by_command = {r["command"]: r for r in db[RUNS].find({})}
    assert by_command["down"]["direction"] == "down"
    assert by_command["down"]["reverted"] == ["0002_b.py", "0001_a.py"]
    assert by_command["down"]["applied"] == []
    assert by_command["redo"]["direction"] is None
    assert (by_command["redo"]["reverted"], by_command["redo"]["applied"]) == (
        ["0002_b.py"], ["0002_b.py"])
    assert all(r["outcome"] == "success" for r in by_command.values())


def test_a_skipped_migration_is_counted(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project) as migrator:
        migrator.up()
        migrator.up("0001_a.py")
    skipped = db[RUNS].find_one({"skipped": 1})
    assert skipped is not None and skipped["applied"] == [] and skipped["total"] == 1


def test_a_failed_run_records_the_redacted_error(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    project.write_migration("0002_fail", FAILING)
    with make_migrator(project) as migrator, pytest.raises(MigrationExecutionFailedError):
        migrator.up()
    run = the_run(db)
    assert run["outcome"] == "failed"
    assert run["error"]["code"] == "MIGRATION_EXECUTION_FAILED"
    assert "0002_fail.py" in run["error"]["message"]
    assert "Pw0rdLeak" not in str(run)
    assert (run["applied"], run["total"]) == (["0001_a.py"], 2)
    # the lines of the failing migration were written when it failed
    assert [ln["msg"] for ln in lines(db)] == ["about to fail"]
    assert lines(db)[0]["migration"] == "0002_fail.py"


def test_a_stopped_run_is_recorded_as_stopped(project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    with make_migrator(project) as migrator:
        migrator.on("migration:success", lambda payload: migrator.stop("deploy cancelled"))
        with pytest.raises(RunAbortedError):
            migrator.up()
    run = the_run(db)
    assert run["outcome"] == "stopped"
    assert run["error"] == {"code": "RUN_ABORTED", "message": "deploy cancelled"}
    assert run["applied"] == ["0001_a.py"]
    assert calls(db) == ["0001_a"]


LOSE_LOCK = """
def up(ctx):
    ctx.db["_migronaut_locks"].delete_one({"_id": "migronaut_lock"})
    ctx.cancellation.wait(20)  # bounded: until the heartbeat notices and the run cancels us

def down(ctx):
    pass
"""


def test_a_run_that_lost_its_lock_is_recorded_as_lock_lost(project: Any, db: Any) -> None:
    project.write_migration("0001_loses_lock", LOSE_LOCK)
    write_simple(project, "0002_b")
    with (
        captured_logger() as (logger, _),
        make_migrator(project, lock_ttl_seconds=2, logger=logger) as migrator,
        pytest.raises(LockLostError),
    ):
        migrator.up()
    run = the_run(db)
    assert run["outcome"] == "lock-lost"
    assert run["lockLost"] == "another run reclaimed it"
    assert run["error"]["code"] == "LOCK_LOST"
    assert run["applied"] == ["0001_loses_lock.py"]


def test_a_lost_lock_under_warn_is_a_success_that_says_so(project: Any, db: Any) -> None:
    project.write_migration("0001_loses_lock", LOSES_LOCK_AND_WAITS)
    with (
        captured_logger() as (logger, _),
        make_migrator(project, lock_ttl_seconds=2, on_lock_lost="warn", logger=logger) as m,
    ):
        m.on("lock:lost", lambda p: db["lost"].insert_one({"reason": p["reason"]}))
        m.up()
    run = the_run(db)
    assert (run["outcome"], run["lockLost"]) == ("success", "another run reclaimed it")


def test_a_refused_lock_records_nothing(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    hold_lock(db)
    with make_migrator(project) as migrator, pytest.raises(LockAlreadyHeldError):
        migrator.up()
    assert db[RUNS].count_documents({}) == 0
    assert db[LOGS].count_documents({}) == 0


def test_a_no_lock_run_is_recorded_as_unlocked(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project) as migrator:
        migrator.up(no_lock=True)
    assert the_run(db)["locked"] is False


def test_the_record_says_running_while_the_run_is_in_flight(project: Any, db: Any) -> None:
    project.write_migration(
        "0001_looks",
        """
        def up(ctx):
            seen = ctx.db["_migronaut_runs"].find_one({"_id": ctx.run.id})
            ctx.db["seen"].insert_one({"outcome": seen["outcome"],
                                       "started": "startedAt" in seen})

        def down(ctx):
            pass
        """,
    )
    with make_migrator(project) as migrator:
        migrator.up()
    seen = db["seen"].find_one()
    assert (seen["outcome"], seen["started"]) == ("running", True)
    assert the_run(db)["outcome"] == "success"


# ------------------------------------------------------------------------------ requested by


def test_requested_by_comes_from_the_environment(
    project: Any, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in REQUESTED_BY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GITHUB_ACTOR", "octocat")
    write_simple(project, "0001_a")
    with make_migrator(project) as migrator:
        migrator.up()
    run = the_run(db)
    assert (run["requestedBy"], run["requestedBySource"]) == ("octocat", "GITHUB_ACTOR")
    assert "requestedBy" not in records(db)["0001_a.py"] or \
        records(db)["0001_a.py"]["requestedBy"] is None  # the changelog keeps only what was given


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, ("runner", "os-user")),
        ({"GITLAB_USER_LOGIN": "gl"}, ("gl", "GITLAB_USER_LOGIN")),
        ({"GITHUB_ACTOR": "gh", "MIGRONAUT_REQUESTED_BY": "ops"},
         ("ops", "MIGRONAUT_REQUESTED_BY")),
        ({"BUILD_USER_ID": "  ", "BUILD_USER": "jenkins-jo"}, ("jenkins-jo", "BUILD_USER")),
        ({"GITHUB_ACTOR": "x" * 300}, ("x" * 128, "GITHUB_ACTOR")),
    ],
)
def test_requested_by_resolution_order(
    environ: dict[str, str], expected: tuple[str, str]
) -> None:
    assert resolve_requested_by(None, "runner", environ) == expected
    assert resolve_requested_by("alice", "runner", environ) == ("alice", "argument")


def test_without_any_hint_the_os_user_requested_it(
    project: Any, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in REQUESTED_BY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    write_simple(project, "0001_a")
    with make_migrator(project) as migrator:
        migrator.up()
    run = the_run(db)
    assert run["requestedBySource"] == "os-user"
    assert run["requestedBy"] == run["executedBy"] == getpass.getuser()


# ----------------------------------------------------------------------- config and failures


def test_record_runs_false_records_nothing_but_still_emits_migration_log(
    project: Any, db: Any
) -> None:
    project.write_migration("0001_logs", LOGGING)
    with make_migrator(project, record_runs=False) as migrator:
        events = Events(migrator)
        migrator.up()
    assert RUNS not in db.list_collection_names() and LOGS not in db.list_collection_names()
    assert len(events.of("migration:log")) == 1


def test_a_custom_runs_collection_and_its_indexes(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project, runs_collection="ops_runs") as migrator:
        migrator.up()
        assert "startedAt" in db["ops_runs"].index_information()
        # a run that logs nothing leaves the log lines' collection (and its index) uncreated
        assert "ops_runs_logs" not in db.list_collection_names()
        project.write_migration("0002_logs", LOGGING)
        migrator.up()
    assert [run["outcome"] for run in db["ops_runs"].find({})] == ["success", "success"]
    assert db["ops_runs_logs"].index_information()["runId_seq"]["unique"] is True
    assert RUNS not in db.list_collection_names()


def test_ensure_indexes_false_creates_no_index(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project, ensure_indexes=False) as migrator:
        migrator.up()
    assert set(db[RUNS].index_information()) == {"_id_"}


def _refuse_writes(db: Any, name: str) -> None:
    db.create_collection(name, validator={"$jsonSchema": {"required": ["neverThere"]}})


def test_a_record_that_cannot_be_written_never_fails_the_run(project: Any, db: Any) -> None:
    _refuse_writes(db, RUNS)
    write_simple(project, "0001_a", "0002_b")
    with captured_logger() as (logger, handler), make_migrator(project, logger=logger) as m:
        assert [r.status for r in m.up("0001_a.py")] == ["applied"]
        assert [r.status for r in m.up()] == ["applied"]
    assert applied(db) == ["0001_a.py", "0002_b.py"]
    assert db[LOCKS].count_documents({}) == 0
    assert db[RUNS].count_documents({}) == 0
    warnings = [r.getMessage() for r in handler.records
                if r.levelname == "WARNING" and "Run history not recorded" in r.getMessage()]
    assert len(warnings) == 1 and "run start" in warnings[0]  # warned once, not per write
    assert "the run goes on" in warnings[0]


def test_log_lines_that_cannot_be_written_are_counted_as_dropped(project: Any, db: Any) -> None:
    _refuse_writes(db, LOGS)
    project.write_migration("0001_logs", LOGGING)
    with captured_logger() as (logger, handler), make_migrator(project, logger=logger) as m:
        m.up()
    run = the_run(db)
    assert run["outcome"] == "success"
    assert (run["logLines"], run["logLinesDropped"]) == (0, 3)  # debug, info, warning
    assert handler.has("Run history not recorded (log lines)")


# -------------------------------------------------------------------------------- log lines


def test_ctx_logger_lines_are_kept_with_their_run_redacted(project: Any, db: Any) -> None:
    project.write_migration("0001_logs", LOGGING)
    with make_migrator(project) as migrator:
        migrator.up(reason="backfill")
        migrator.down()
    up_run = db[RUNS].find_one({"command": "up"})
    kept = lines(db, up_run["_id"])
    assert [ln["seq"] for ln in kept] == [1, 2]  # the debug line is not kept at info level
    info, warning = kept
    assert info == {
        "kind": "migration", "runId": up_run["_id"], "direction": "up",
        "migration": "0001_logs.py", "batch": 1, "attempt": 1, "level": "info",
        "msg": "copied 3 documents", "data": {"collection": "users", "n": 3},
        "at": info["at"], "seq": 1,
    }
    assert warning["level"] == "warning"
    assert "S3cretPw" not in str(warning) and "admin:****@" in warning["msg"]
    assert warning["data"]["tags"] == ["a"]
    assert warning["data"]["when"] == dt.datetime(2024, 1, 2)
    assert "userland" not in warning["data"]
    assert up_run["logLines"] == 2
    down_run = db[RUNS].find_one({"command": "down"})
    (reverting,) = lines(db, down_run["_id"])
    assert (reverting["msg"], reverting["direction"]) == ("reverting", "down")


def test_debug_lines_are_kept_when_the_logger_is_at_debug(project: Any, db: Any) -> None:
    project.write_migration("0001_logs", LOGGING)
    with captured_logger() as (logger, _), make_migrator(project, logger=logger) as migrator:
        migrator.up()
    assert [ln["level"] for ln in lines(db)] == ["debug", "info", "warning"]


def test_hook_lines_are_kept_without_a_migration(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")

    def before_all(ctx: Any) -> None:
        ctx.logger.info("warming caches")

    with make_migrator(project, hooks={"before_all": before_all}) as migrator:
        migrator.up()
    (line,) = lines(db)
    assert line["msg"] == "warming caches" and "migration" not in line


class InsertCounter(monitoring.CommandListener):
    def __init__(self) -> None:
        self.inserts: list[int] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "insert" and event.command.get("insert") == LOGS:
            self.inserts.append(len(event.command.get("documents", [])))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def test_lines_are_written_in_bulk_and_bounded_per_run(
    project: Any, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recorder_module, "MAX_LINES", 250)
    monkeypatch.setattr(recorder_module, "FLUSH_EVERY", 100)
    project.write_migration(
        "0001_chatty",
        """
        def up(ctx):
            for i in range(300):
                ctx.logger.info("row %d", i)

        def down(ctx):
            pass
        """,
    )
    counter = InsertCounter()
    with make_migrator(project, client_options={"event_listeners": [counter]}) as migrator:
        migrator.up()
    assert counter.inserts == [100, 100, 50, 1]  # two full buffers, the rest, the notice
    kept = lines(db)
    assert len(kept) == 251
    assert kept[249]["msg"] == "row 249"
    notice = kept[-1]
    assert notice["truncated"] is True and notice["level"] == "warning"
    assert notice["msg"] == "50 more log line(s) of this run were not kept (limit 250 per run)"
    run = the_run(db)
    assert (run["logLines"], run["logLinesDropped"]) == (250, 50)
