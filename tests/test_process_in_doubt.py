"""A migration whose outcome is unknown is never run again without a decision (real processes).

Outside a transaction a run claims the changelog record (``running``) before the body and
records the outcome after it. When the run ends in between — killed, its lock force-released
under it, its final write cut off — the migration is *in doubt*: ``up``, ``down``, ``redo`` and
``status --check`` refuse with ``MIGRATION_IN_DOUBT`` (exit 36) until ``migronaut resolve``
records the operator's decision. Synchronisation is on documents the bodies write and on process
exits, every wait bounded. The cut-connection cases at the end run through the API, on the same
server (it serves ``failCommand``), as do those of a final write or commit that fails going up
or down: the run ends with its typed error and its lock is released all the same.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import project_on
from helpers.engine import (
    CHANGELOG,
    LOCKS,
    ChangelogUpdates,
    make_migrator,
    records,
    wait_until,
)
from helpers.failpoints import configure
from migronaut import MigronautError

pytestmark = pytest.mark.slow


@pytest.fixture
def db(failpoint_client: Any, db_name: str) -> Iterator[Any]:
    """The test's database, on the server that serves ``failCommand``."""
    yield failpoint_client[db_name]
    failpoint_client.drop_database(db_name)


@pytest.fixture
def project(tmp_path: Path, failpoint_uri: str, db_name: str,
            monkeypatch: pytest.MonkeyPatch) -> Any:
    return project_on(tmp_path, failpoint_uri, db_name, monkeypatch)

IN_DOUBT = 36

#: Counts its executions, then holds on a gate document (bounded: 60 s).
COUNTING_GATED = """
import time

def up(ctx):
    ctx.db["counters"].update_one({"_id": "n"}, {"$inc": {"n": 1}}, upsert=True)
    ctx.db["started"].insert_one({"at": time.time()})
    for _ in range(1200):
        if ctx.db["gate"].find_one({"_id": "go"}):
            break
        time.sleep(0.05)

def down(ctx):
    pass
"""

QUICK = """
def up(ctx):
    ctx.db["counters"].update_one({"_id": "quick"}, {"$inc": {"n": 1}}, upsert=True)

def down(ctx):
    pass
"""


def count(db: Any, key: str = "n") -> int:
    doc = db["counters"].find_one({"_id": key})
    return int(doc["n"]) if doc else 0


def assert_in_doubt(result: Any, name: str, run_id: str) -> None:
    assert result.exit_code == IN_DOUBT, result.stderr
    error = result.json["error"]
    assert error["code"] == "MIGRATION_IN_DOUBT"
    assert error["context"]["name"] == name and error["context"]["runId"] == run_id
    assert error["context"]["host"] and error["context"]["startedAt"]
    assert name in error["message"] and run_id in error["message"]
    assert f"migronaut resolve {name}" in error["message"]


def test_a_forced_unlock_under_a_live_run_never_applies_its_migration_twice(
    project: Any, db: Any, cli_process: Any
) -> None:
    project.write_migration("0001_slow", COUNTING_GATED)
    first = cli_process.start("up", "--json")
    wait_until(lambda: db["started"].find_one(), timeout=60, what="0001 to start")
    record = records(db)["0001_slow.py"]
    assert record["status"] == "running"
    intent = record["intent"]
    assert intent["pid"] == first.pid and intent["lockOwner"] == intent["runId"]
    assert intent["direction"] == "up" and intent["startedAt"] is not None

    # the holder is alive: unlock refuses without --force, and changes nothing
    refused = cli_process("unlock", "--yes", "--json", timeout=60)
    assert refused.exit_code == 3, refused.stderr
    assert refused.json["error"]["code"] == "LOCK_ALREADY_HELD"
    assert "looks alive" in refused.json["error"]["message"]
    assert "--force" in refused.json["error"]["message"]
    assert db[LOCKS].count_documents({}) == 1

    # while it runs, status shows it running (its run holds the lock)
    rows = {r["file"]: r for r in cli_process("status", "--json", timeout=60).json}
    assert rows["0001_slow.py"]["status"] == "running"

    unlocked = cli_process("unlock", "--yes", "--force", "--json", timeout=60)
    assert unlocked.exit_code == 0, unlocked.stderr
    assert unlocked.json["holder"]["pid"] == first.pid

    # the run that takes the lock next finds the migration in doubt and does not run it
    second = cli_process("up", "--json", timeout=60)
    assert_in_doubt(second, "0001_slow.py", intent["runId"])
    assert count(db) == 1
    checked = cli_process("status", "--check", "--json", timeout=60)
    assert checked.exit_code == IN_DOUBT, checked.stderr

    db["gate"].insert_one({"_id": "go"})
    one = cli_process.wait(first, timeout=60)
    assert one.exit_code == 10, one.stderr  # LOCK_LOST, and its outcome recorded
    assert one.json["error"]["code"] == "LOCK_LOST"
    record = records(db)["0001_slow.py"]
    assert record["status"] == "applied" and "intent" not in record

    third = cli_process("up", "--json", timeout=60)
    assert third.exit_code == 0, third.stderr
    assert count(db) == 1
    assert db[CHANGELOG].count_documents({}) == 1
    assert db[LOCKS].count_documents({}) == 0


def test_kill_9_during_a_body_leaves_it_in_doubt_until_resolved(
    project: Any, db: Any, cli_process: Any
) -> None:
    project.write_migration("0001_slow", COUNTING_GATED)
    project.write_migration("0002_quick", QUICK)
    victim = cli_process.start("up", "--json")
    wait_until(lambda: db["started"].find_one(), timeout=60, what="0001 to start")
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    run_id = records(db)["0001_slow.py"]["intent"]["runId"]

    released = cli_process("unlock", "--yes", "--force", "--json", timeout=60)
    assert released.exit_code == 0, released.stderr

    for args in (("up",), ("up", "0002_quick.py"), ("redo",), ("down",)):
        refused = cli_process(*args, "--json", timeout=60)
        assert_in_doubt(refused, "0001_slow.py", run_id)
    assert count(db) == 1 and count(db, "quick") == 0
    rows = {r["file"]: r for r in cli_process("status", "--json", timeout=60).json}
    assert rows["0001_slow.py"]["status"] == "in-doubt"
    assert rows["0001_slow.py"]["runId"] == run_id and rows["0001_slow.py"]["pid"] == victim.pid
    human = cli_process("status", timeout=60)
    assert "in doubt" in human.stdout
    audit = cli_process("audit", "--json", timeout=60)
    assert audit.exit_code == 22, audit.stderr
    changelog = next(c for c in audit.json["checks"] if c["name"] == "changelog")
    assert changelog["status"] == "fail" and "0001_slow.py" in changelog["detail"]

    # bad decisions are refused before anything is written
    for args, code in ((("resolve", "0001_slow.py", "--applied", "--yes"), 6),
                       (("resolve", "0001_slow.py", "--yes", "--reason", "x"), 6),
                       (("resolve", "0001_slow.py", "--applied", "--pending", "--yes",
                         "--reason", "x"), 6),
                       (("resolve", "0001_slow.py", "--applied", "--reason", "x"), 6),
                       (("resolve", "0002_quick.py", "--applied", "--yes", "--reason", "x"), 9),
                       (("resolve", "../x.py", "--applied", "--yes", "--reason", "x"), 19)):
        bad = cli_process(*args, "--json", timeout=60)
        assert bad.exit_code == code, (args, bad.stderr)
        assert bad.json["error"]["message"]
        assert records(db)["0001_slow.py"]["status"] == "running"

    resolved = cli_process("resolve", "0001_slow.py", "--applied", "--yes", "--json",
                           "--reason", "counter is 1: the body ran", timeout=60)
    assert resolved.exit_code == 0, resolved.stderr
    assert resolved.json["status"] == "applied" and resolved.json["runId"] == run_id
    record = records(db)["0001_slow.py"]
    assert record["status"] == "applied" and "intent" not in record
    assert record["resolution"]["as"] == "applied"
    assert record["resolution"]["reason"] == "counter is 1: the body ran"
    assert record["resolution"]["intent"]["runId"] == run_id
    run = db["_migronaut_runs"].find_one({"command": "resolve", "outcome": "success"})
    assert run is not None and run["reason"] == "counter is 1: the body ran"
    line = db["_migronaut_runs_logs"].find_one({"runId": run["_id"]})
    assert line is not None and line["migration"] == "0001_slow.py"
    assert "Resolved 0001_slow.py as applied" in line["msg"]

    finish = cli_process("up", "--json", timeout=60)
    assert finish.exit_code == 0, finish.stderr
    assert [(r["file"], r["status"]) for r in finish.json] == [("0002_quick.py", "applied")]
    assert count(db) == 1 and count(db, "quick") == 1


#: ``up`` through the API, holding (bounded: 60 s) as 0002 starts: after the command that
#: recorded 0001 and claimed 0002, before 0002's body.
HOLDS_BEFORE_THE_SECOND_BODY = """
import time
from migronaut import Migrator

def hold(event):
    if event["migration"] == "0002_quick.py":
        open("claimed.txt", "w").write("claimed")
        time.sleep(60)

with Migrator(env_file=False) as migrator:
    migrator.on("migration:start", hold)
    migrator.up()
"""


def test_kill_9_between_a_record_and_the_next_body_leaves_the_claimed_one_in_doubt(
    project: Any, db: Any, cli_process: Any
) -> None:
    """The record of 0001 and the claim of 0002 travel in one command: a run killed after it
    and before 0002's body leaves 0001 applied and 0002 in doubt (never run on its own)."""
    import subprocess
    import sys

    project.write_migration("0001_first", QUICK.replace('"quick"', '"first"'))
    project.write_migration("0002_quick", QUICK)
    script = project.path / "hold.py"
    script.write_text(HOLDS_BEFORE_THE_SECOND_BODY)
    victim = subprocess.Popen([sys.executable, str(script)], cwd=project.path,
                              env=project.env(), stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until((project.path / "claimed.txt").exists, timeout=60, what="0002 to start")
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
    stored = records(db)
    assert stored["0001_first.py"]["status"] == "applied"
    assert stored["0002_quick.py"]["status"] == "running"
    run_id = stored["0002_quick.py"]["intent"]["runId"]
    assert stored["0002_quick.py"]["intent"]["pid"] == victim.pid
    assert count(db, "first") == 1 and count(db, "quick") == 0

    assert cli_process("unlock", "--yes", "--force", "--json", timeout=60).exit_code == 0
    refused = cli_process("up", "--json", timeout=60)
    assert_in_doubt(refused, "0002_quick.py", run_id)
    assert count(db, "quick") == 0
    resolved = cli_process("resolve", "0002_quick.py", "--pending", "--yes", "--reason",
                           "its body never ran", timeout=60)
    assert resolved.exit_code == 0, resolved.stderr
    finish = cli_process("up", "--json", timeout=60)
    assert finish.exit_code == 0, finish.stderr
    assert [(r["file"], r["status"]) for r in finish.json] == [("0002_quick.py", "applied")]
    assert count(db, "first") == 1 and count(db, "quick") == 1


TRANSACTIONAL_GATED = """
import pathlib
import time

use_transaction = True

def up(ctx):
    ctx.db["counters"].update_one({"_id": "n"}, {"$inc": {"n": 1}}, upsert=True,
                                  session=ctx.session)
    pathlib.Path("started.txt").write_text("started")  # outside the transaction
    for _ in range(1200):
        if ctx.db["gate"].find_one({"_id": "go"}, session=ctx.session):
            break
        time.sleep(0.05)

def down(ctx):
    pass
"""


def test_a_killed_transactional_migration_leaves_nothing_in_doubt(
    project: Any, db: Any, cli_process: Any
) -> None:
    project.write_migration("0001_txn", TRANSACTIONAL_GATED)
    victim = cli_process.start("up", "--json")
    started = project.path / "started.txt"
    wait_until(started.exists, timeout=60, what="0001 to start")
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    assert db[CHANGELOG].count_documents({}) == 0  # no intent: the transaction holds it all
    assert count(db) == 0

    cli_process("unlock", "--yes", "--force", "--json", timeout=60)
    rows = {r["file"]: r for r in cli_process("status", "--json", timeout=60).json}
    assert rows["0001_txn.py"]["status"] == "pending"
    db["gate"].insert_one({"_id": "go"})
    rerun = cli_process("up", "--json", timeout=60)
    assert rerun.exit_code == 0, rerun.stderr
    assert count(db) == 1
    assert records(db)["0001_txn.py"]["status"] == "applied"


#: Counts its execution (under ``%s``), then cuts the connection of the next ``%d`` updates of
#: migronaut's client — its changelog write (and every resend of it) among them; going up, that
#: command also carries the next migration's claim.
CUTS_ITS_RECORD = """
def up(ctx):
    ctx.db["counters"].update_one({"_id": "%s"}, {"$inc": {"n": 1}}, upsert=True)
    ctx.client.admin.command({
        "configureFailPoint": "failCommand", "mode": {"times": %d},
        "data": {"failCommands": ["update"], "closeConnection": True, "appName": "migronaut"},
    })

def down(ctx):
    pass
"""


def test_a_cut_connection_during_the_changelog_write_leaves_the_migration_in_doubt(
    project: Any, db: Any, failpoint_client: Any, cli_process: Any
) -> None:
    project.write_migration("0001_cut", CUTS_ITS_RECORD % ("n", 12))
    try:
        first = cli_process("up", "--json", timeout=120)
    finally:
        configure(failpoint_client, "off")
    try:
        assert first.exit_code == 5, first.stderr
        error = first.json["error"]
        assert error["code"] == "CONNECTION_FAILED"
        context = error["context"]
        assert context["phase"] == "changelog-write" and context["bodySucceeded"] is True
        assert context["inDoubt"] is True
        assert "migronaut resolve 0001_cut.py --applied" in error["message"]
        record = records(db)["0001_cut.py"]
        assert record["status"] == "running"
        assert db[LOCKS].count_documents({}) == 0  # released on the way out

        again = cli_process("up", "--json", timeout=60)
        assert_in_doubt(again, "0001_cut.py", record["intent"]["runId"])
        assert count(db) == 1

        resolved = cli_process("resolve", "0001_cut.py", "--applied", "--yes", "--reason",
                               "the counter moved", timeout=60)
        assert resolved.exit_code == 0, resolved.stderr
        assert "✔ Resolved 0001_cut.py as applied" in resolved.stderr + resolved.stdout
        final = cli_process("up", "--json", timeout=60)
        assert final.exit_code == 0, final.stderr
        assert count(db) == 1
        assert records(db)["0001_cut.py"]["status"] == "applied"
        rows = cli_process("status", "--check", "--json", timeout=60)
        assert rows.exit_code == 0, rows.stderr
    finally:
        configure(failpoint_client, "off")


# -- a cut connection under the command that records one migration and claims the next ------


def counted(db: Any) -> dict[str, int]:
    return {doc["_id"]: doc["n"] for doc in db["counters"].find()}


def test_a_combined_command_cut_once_is_sent_again_and_nothing_runs_twice(
    project: Any, db: Any, failpoint_client: Any
) -> None:
    project.write_migration("0001_a", QUICK.replace('"quick"', '"a"'))
    project.write_migration("0002_cut", CUTS_ITS_RECORD % ("cut", 1))
    project.write_migration("0003_c", QUICK.replace('"quick"', '"c"'))
    listener = ChangelogUpdates()
    try:
        with make_migrator(project, client_options={"event_listeners": [listener]}) as migrator:
            migrator.up()
    finally:
        configure(failpoint_client, "off")
    assert counted(db) == {"a": 1, "cut": 1, "c": 1}
    assert listener.sent.count(["0002", "0003"]) == 2  # cut, then sent again
    assert all(r["status"] == "applied" and "intent" not in r for r in records(db).values())


def test_a_combined_command_never_answered_leaves_the_migration_in_doubt_and_the_next_unrun(
    project: Any, db: Any, failpoint_client: Any
) -> None:
    project.write_migration("0001_cut", CUTS_ITS_RECORD % ("cut", 12))
    project.write_migration("0002_c", QUICK.replace('"quick"', '"c"'))
    try:
        with make_migrator(project) as migrator, pytest.raises(MigronautError) as info:
            migrator.up()
    finally:
        configure(failpoint_client, "off")
    assert info.value.code == "CONNECTION_FAILED"
    assert info.value.context["phase"] == "changelog-write"
    assert info.value.context["inDoubt"] is True
    assert counted(db) == {"cut": 1}
    stored = records(db)
    assert stored["0001_cut.py"]["status"] == "running"
    assert "0002_c.py" not in stored  # neither its claim nor the give-back got through
    with make_migrator(project) as migrator, pytest.raises(MigronautError) as again:
        migrator.up()
    assert again.value.code == "MIGRATION_IN_DOUBT"
    assert again.value.context["name"] == "0001_cut.py"
    assert counted(db) == {"cut": 1}


# -- a final write or commit that fails, going up or down: its error, and the lock released ---


#: The body of ``%s`` arms ``failCommand`` for the next ``%d`` ``%s`` commands (``%s``) of
#: migronaut's client; the other direction does nothing.
ARMS = """
use_transaction = %s

def %s(ctx):
    ctx.client.admin.command({
        "configureFailPoint": "failCommand", "mode": {"times": %d},
        "data": {"failCommands": ["%s"], "appName": "migronaut", %s},
    })

def %s(ctx):
    pass
"""

CUT = '"closeConnection": True'
REFUSED = '"errorCode": 2'

#: case: (transactional, failed command, times, failure, the run's error code, in doubt)
CASES = {
    "record-cut": (False, "update", 12, CUT, "CONNECTION_FAILED", True),
    "record-refused": (False, "update", 1, REFUSED, "MIGRATION_EXECUTION_FAILED", True),
    "commit-refused": (True, "commitTransaction", 1, REFUSED, "MIGRATION_EXECUTION_FAILED",
                       False),
}


@pytest.mark.parametrize("direction", ["up", "down"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_failed_final_write_ends_with_its_error_and_releases_the_lock(
    project: Any, db: Any, failpoint_client: Any, case: str, direction: str
) -> None:
    transactional, command, times, failure, code, in_doubt = CASES[case]
    other = "down" if direction == "up" else "up"
    project.write_migration("0001_x", ARMS % (transactional, direction, times, command,
                                              failure, other))
    if direction == "down":
        with make_migrator(project) as migrator:
            migrator.up()
    before = records(db).get("0001_x.py")
    try:
        with make_migrator(project) as migrator, pytest.raises(MigronautError) as info:
            getattr(migrator, direction)()
    finally:
        configure(failpoint_client, "off")
    assert info.value.code == code
    assert info.value.context["name"] == "0001_x.py"
    assert info.value.context["direction"] == direction
    assert bool(info.value.context.get("inDoubt")) is in_doubt
    assert db[LOCKS].count_documents({}) == 0  # released on the way out, as after any run
    record = records(db).get("0001_x.py")
    if in_doubt:
        assert record is not None
        assert record["status"] == ("running" if direction == "up" else "reverting")
    elif direction == "up":  # rolled back, then recorded as failed
        assert record is not None and record["status"] == "failed"
    else:  # the transaction rolled back: the record is as before the run
        assert record == before
    with make_migrator(project) as migrator, pytest.raises(MigronautError) as again:
        getattr(migrator, direction)()  # the lock is free: the next run is not kept waiting
    assert again.value.code == ("MIGRATION_IN_DOUBT" if in_doubt else code)


def test_a_commit_cut_off_is_retried_and_the_revert_is_recorded_once(
    project: Any, db: Any, failpoint_client: Any
) -> None:
    project.write_migration("0001_x", ARMS % (True, "down", 3, "commitTransaction", CUT, "up"))
    with make_migrator(project) as migrator:
        migrator.up()
    try:
        with make_migrator(project) as migrator:
            results = migrator.down()
    finally:
        configure(failpoint_client, "off")
    assert [(r.file, r.status) for r in results] == [("0001_x.py", "reverted")]
    assert db[LOCKS].count_documents({}) == 0
    assert records(db).get("0001_x.py", {}).get("status") in (None, "reverted")
