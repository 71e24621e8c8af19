"""``migronaut background <action>`` end to end against the server: every action in human and
``--json`` mode, exit codes, stored state, confirmations, conflicts, and the long-running
``run``/``work``/``progress`` as real processes (signals, leases released)."""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import pytest

from helpers.background import (
    NAME,
    PARTITIONS,
    STATES,
    hold_coordinator,
    leases,
    migration,
    register,
)
from helpers.engine import make_migrator, wait_until
from helpers.wire_audit import AUDIT

LOCKS = "_migronaut_locks"
BAD_URI = {"MIGRONAUT_URI": "mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=300"}


def state(db: Any, name: str = NAME) -> dict[str, Any]:
    found = db[STATES].find_one({"_id": name})
    assert found is not None
    return dict(found)


def history_actions(db: Any, name: str = NAME) -> list[str]:
    return [entry["action"] for entry in state(db, name).get("history", [])]


def json_lines(text: str) -> list[Any]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# -------------------------------------------------------------------------------------- status


def test_status_with_nothing_registered(cli: Any) -> None:
    human = cli("background", "status")
    assert human.exit_code == 0, human.stderr
    assert "No background migrations registered" in human.stdout
    assert cli("background", "status", "--json").json == {"background": []}
    assert cli("background", "status", "--check").exit_code == 0


def test_status_table_json_and_unknown_names(project: Any, cli: Any, db: Any) -> None:
    register(project, cli, db)
    human = cli("background", "status")
    assert human.exit_code == 0, human.stderr
    for column in ("Background migration", "Status", "Collection", "Versions", "Pass",
                   "Partitions", "Lanes", "Migrated", "Note"):
        assert column in human.stdout
    assert NAME in human.stdout and "pending" in human.stdout and "0 → 1" in human.stdout
    assert "0/2" in human.stdout  # lanes: live leases / maxParallel

    document = cli("background", "status", NAME, "--json").json
    [view] = document["background"]
    assert view["migration"] == NAME and view["status"] == "pending"
    assert view["collection"] == "users" and view["from"] == 0 and view["to"] == 1
    assert view["maxParallel"] == 2 and view["liveLeases"] == 0
    assert view["registeredAt"].endswith("Z")

    unknown = cli("background", "status", "0009_nope.py", "--json")
    assert unknown.exit_code == 6 and unknown.json["error"]["code"] == "CONFIG_INVALID"
    assert "run up first" in unknown.json["error"]["message"]
    partitions = cli("background", "status", "0009_nope.py", "--partitions")
    assert partitions.exit_code == 9, partitions.stderr
    # checked before connecting: an unreachable server is never contacted
    assert cli("background", "status", "--partitions", env=BAD_URI).exit_code == 6


JUNK_STATE = [
    ("spec", "spec", "junk"), ("spec", "spec", ["a"]), ("plan", "plan", "x"),
    ("plan", "plan", {"token": "t"}), ("spec.maxParallel", "spec.maxParallel", "x"),
    ("spec.maxParallel", "spec.maxParallel", 0),
]


@pytest.mark.parametrize(("path", "field", "junk"), JUNK_STATE)
def test_one_junk_state_document_is_state_invalid_naming_it(
    project: Any, cli: Any, db: Any, path: str, field: str, junk: Any
) -> None:
    """A state field migronaut cannot read (``spec: 'junk'``, ``plan: 'x'``, an unusable
    ``spec.maxParallel``) used to exit 1 (``'str' object has no attribute 'get'``): ``status``,
    ``run`` and ``verify`` refuse with ``STATE_INVALID`` (exit 35) naming the migration and the
    field, and write nothing; the other migrations still answer by name."""
    register(project, cli, db, docs=40)
    db.orders.insert_many([{"n": i} for i in range(40)])
    project.write_migration("0002_orders_v1", migration(collection="orders"))
    assert cli("up").exit_code == 0
    db[STATES].update_one({"_id": NAME}, {"$set": {path: junk}})
    before = state(db)
    for args in (("background", "status"), ("background", "run", NAME, "--once"),
                 ("background", "run", "--all", "--once"), ("background", "verify")):
        refused = cli(*args, "--json")
        assert refused.exit_code == 35, (args, refused.stdout, refused.stderr)
        error = refused.json["error"]
        assert error["code"] == "STATE_INVALID"
        assert error["message"].startswith(
            f"Background migration {NAME} has a {field} migronaut does not understand: ")
        assert error["context"]["record"] == NAME
        assert error["context"]["problems"][0]["field"] == field
        human = cli(*args)
        assert human.exit_code == 35 and "Traceback" not in human.stderr
        assert f"✖ STATE_INVALID: Background migration {NAME} has a {field}" in human.stderr
    other = cli("background", "status", "0002_orders_v1.py", "--json")
    assert other.exit_code == 0, other.stderr
    assert other.json["background"][0]["status"] == "pending"
    assert state(db) == before
    assert state(db, "0002_orders_v1.py")["status"] == "pending"  # --all ran nothing after it
    assert db[PARTITIONS].count_documents({"lease": {"$exists": True}}) == 0
    assert db[LOCKS].count_documents({}) == 0


def test_status_partitions_table_and_json(project: Any, cli: Any, db: Any) -> None:
    register(project, cli, db)
    assert cli("background", "run", NAME, "--once").exit_code == 0
    human = cli("background", "status", NAME, "--partitions")
    assert human.exit_code == 0, human.stderr
    for column in ("#", "Status", "Scope", "Migrated", "Lease", "Claims", "Error"):
        assert column in human.stdout
    assert "objectId" in human.stdout  # the scope's type bracket, never its bounds
    rows = cli("background", "status", NAME, "--partitions", "--json").json["partitions"]
    assert len(rows) >= 2
    for row in rows:
        assert row["scope"]["kind"] == "id-range"
        assert set(row["scope"]) <= {"kind", "bracket", "group"}  # never the _id bounds
        assert "token" not in json.dumps(row)


def test_status_progress_and_the_dashboard_page_never_read_the_documents(
        project: Any, cli: Any, db: Any) -> None:
    """``background status --json``, ``background progress --json`` and the dashboard's
    migration page answer from the state and the partitions: none of their commands reaches the
    migrated collection, and ten times the documents send exactly the same commands — so they
    cost a million-document migration what they cost this one."""
    from migronaut.dashboard.board import Board

    register(project, cli, db, docs=300)
    assert cli("background", "run", NAME, "--once").exit_code == 0

    def sent_by(surfaces: dict[str, Any]) -> dict[str, list[tuple[str, str]]]:
        sent: dict[str, list[tuple[str, str]]] = {}
        for surface, read in surfaces.items():
            with AUDIT.recording() as got:
                read()
            # (the connection's own ping and endSessions aside)
            sent[surface] = [(s.command, s.target) for s in got
                             if s.command not in ("ping", "endSessions")]
        return sent

    def status() -> None:
        result = cli("background", "status", NAME, "--json")
        assert result.exit_code == 0, result.stderr

    def progress() -> None:
        result = cli("background", "progress", NAME, "--json")
        assert result.exit_code == 0, result.stderr

    def page() -> None:
        with make_migrator(project) as migrator:
            assert Board(migrator).migration(NAME)["name"] == NAME

    running = {"status": status, "dashboard": page}
    before = sent_by(running)
    # (already at the target version: the lanes skip them; the views must not even look)
    db["users"].insert_many([{"n": i, "__v": 1} for i in range(300, 3300)])
    assert sent_by(running) == before
    assert state(db)["status"] == "running"
    with make_migrator(project) as migrator:
        assert migrator.background.drive(NAME)["status"] == "completed"
    finished = sent_by({"status": status, "progress": progress, "dashboard": page})
    for sent in (*before.values(), *finished.values()):
        assert sent and all(target in (STATES, PARTITIONS) for _, target in sent), sent
    assert len(finished["status"]) <= 3  # the state (the name checked, the view), one aggregate
    assert len(finished["progress"]) <= 5  # + the partitions, one find
    assert len(finished["dashboard"]) <= 5  # the view, the partitions, the state for its plan


def test_status_check_exit_codes(project: Any, cli: Any, db: Any) -> None:
    register(project, cli, db)
    pending = cli("background", "status", "--check")
    assert pending.exit_code == 31
    assert "✖ Background migrations are not all completed" in pending.stderr
    as_json = cli("background", "status", "--check", "--json")
    assert as_json.exit_code == 31 and as_json.json["background"][0]["status"] == "pending"
    assert cli("background", "run", NAME).exit_code == 0
    assert cli("background", "status", "--check").exit_code == 0

    db[STATES].update_one({"_id": NAME}, {"$set": {"status": "failed"}})
    failed = cli("background", "status", "--check")
    assert failed.exit_code == 32
    assert "✖ A background migration failed" in failed.stderr


# ----------------------------------------------------------------------------------------- run


def test_run_to_completion_with_two_lanes(project: Any, cli: Any, db: Any) -> None:
    register(project, cli, db, max_parallel=2)
    result = cli("background", "run", NAME, "--concurrency", "2", "--json")
    assert result.exit_code == 0, result.stderr
    [view] = result.json["background"]
    assert view["status"] == "completed" and view["totals"]["migrated"] == 300
    assert db.users.count_documents({"__v": 1, "__rev": 1, "active": True}) == 300
    stored = state(db)
    assert stored["status"] == "completed" and stored["plan"]["partitions"] >= 2
    assert stored["coordinator"]["kind"] == "cli"
    assert leases(db) == 0

    again = cli("background", "run", NAME)  # nothing left: prints the table, exit 0
    assert again.exit_code == 0 and "completed" in again.stdout


def test_run_warns_when_concurrency_exceeds_max_parallel(project: Any, cli: Any,
                                                        db: Any) -> None:
    register(project, cli, db, max_parallel=2, docs=60)
    result = cli("background", "run", NAME, "--concurrency", "4")
    assert result.exit_code == 0, result.stderr
    assert f"--concurrency 4 is more than {NAME}'s maxParallel (2) — using 2" in result.stderr
    assert "completed" in result.stdout


def test_run_once_is_one_coordinator_step_and_one_round(project: Any, cli: Any,
                                                        db: Any) -> None:
    register(project, cli, db)
    result = cli("background", "run", NAME, "--once", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json["background"][0]["status"] == "running"  # nothing finalized it yet
    assert state(db)["generation"] == 1 and leases(db) == 0
    assert db.users.count_documents({"__v": 1}) > 0

    hold_coordinator(db)
    busy = cli("background", "run", NAME, "--once", "--json")
    assert busy.exit_code == 3, busy.stderr
    assert busy.json["error"]["code"] == "LOCK_ALREADY_HELD"


def test_run_refusals_before_connecting(cli: Any) -> None:
    for args in (["run"], ["run", NAME, "--all"], ["run", NAME, "--concurrency", "0"],
                 ["run", NAME, "--concurrency", "65"], ["run", NAME, "--concurrency", "two"]):
        result = cli("background", *args, "--json", env=BAD_URI)
        assert result.exit_code == 6, (args, result.stderr)
        assert result.json["error"]["code"] == "CONFIG_INVALID"


def test_run_unregistered_is_config_invalid(cli: Any) -> None:
    result = cli("background", "run", "0009_nope.py")
    assert result.exit_code == 6
    assert "0009_nope.py is not registered — run up first" in result.stderr


def test_run_failure_exits_32_with_partial(project: Any, cli: Any, db: Any) -> None:
    register(project, cli, db, docs=20, fail=True)
    result = cli("background", "run", NAME, "--json")
    assert result.exit_code == 32, result.stderr
    assert result.json["error"]["code"] == "BACKGROUND_FAILED"
    assert result.json["partial"][0]["status"] == "failed"
    assert state(db)["status"] == "failed"
    assert cli("background", "status", "--check").exit_code == 32


def test_run_all_oldest_first_unblocks_dependents(project: Any, cli: Any, db: Any) -> None:
    register(project, cli, db, docs=40)
    db.orders.insert_many([{"n": i} for i in range(40)])
    project.write_migration("0002_orders_v1", migration(
        collection="orders", extra='\nrequires = ["0001_users_v1.py"]\n'))
    assert cli("up").exit_code == 0
    assert state(db, "0002_orders_v1.py")["status"] == "blocked"
    result = cli("background", "run", "--all", "--json")
    assert result.exit_code == 0, result.stderr
    assert [v["migration"] for v in result.json["background"]] == [NAME, "0002_orders_v1.py"]
    assert [v["status"] for v in result.json["background"]] == ["completed", "completed"]
    assert db.orders.count_documents({"__v": 1}) == 40
    idle = cli("background", "run", "--all")
    assert idle.exit_code == 0 and "Nothing to run" in idle.stdout
    assert cli("background", "run", "--all", "--json").json == {"background": []}


# ------------------------------------------------------------------------------------ controls


def test_pause_resume_cancel_retry_human_and_json(project: Any, cli: Any, db: Any) -> None:
    register(project, cli, db)
    paused = cli("background", "pause", NAME, "--reason", "maintenance window")
    assert paused.exit_code == 0, paused.stderr
    assert paused.stdout == f"{NAME}: pause (pending → paused)\n"
    stored = state(db)
    assert stored["status"] == "paused"
    assert stored["control"]["action"] == "pause"
    assert stored["control"]["reason"] == "maintenance window"
    assert stored["history"][-1]["action"] == "pause"

    again = cli("background", "pause", NAME, "--json")
    assert again.exit_code == 0 and again.json == {"applied": "unchanged", "status": "paused"}
    assert "✔ Nothing to do — paused" in cli("background", "pause", NAME).stdout

    resumed = cli("background", "resume", NAME, "--json")
    assert resumed.exit_code == 0
    assert resumed.json == {"applied": "changed", "status": "pending"}

    waited = cli("background", "pause", NAME, "--wait", "--json")
    assert waited.json == {"applied": "changed", "status": "paused", "stopped": True}

    cancelled = cli("background", "cancel", NAME, "-y", "--json")
    assert cancelled.exit_code == 0, cancelled.stderr
    assert cancelled.json == {"applied": "changed", "status": "cancelled"}
    assert state(db)["status"] == "cancelled"

    conflict = cli("background", "pause", NAME, "--json")
    assert conflict.exit_code == 33
    assert conflict.json["error"]["code"] == "BACKGROUND_CONFLICT"
    assert "Cannot pause background migration" in conflict.json["error"]["message"]

    retried = cli("background", "retry", NAME)
    assert retried.exit_code == 0 and f"{NAME}: retry (cancelled → pending)" in retried.stdout
    assert history_actions(db)[-5:] == ["pause", "resume", "pause", "cancel", "retry"]


def test_cancel_marks_open_partitions_cancelled(project: Any, cli: Any, db: Any) -> None:
    register(project, cli, db, sleep=0.001)
    assert cli("background", "run", NAME, "--once").exit_code == 0
    db[PARTITIONS].update_many({"background": NAME}, {"$set": {"status": "pending"}})
    assert cli("background", "cancel", NAME, "--yes").exit_code == 0
    statuses = {p["status"] for p in db[PARTITIONS].find({"background": NAME})}
    assert statuses == {"cancelled"}


def test_retry_from_start_and_reopen(project: Any, cli: Any, db: Any) -> None:
    register(project, cli, db, docs=60)
    assert cli("background", "run", NAME).exit_code == 0
    assert state(db)["pass"] >= 1
    # retry on a completed migration reopens it
    reopened = cli("background", "retry", NAME, "--json")
    assert reopened.json == {"applied": "changed", "status": "running"}
    assert state(db)["reopened"] == 1
    assert cli("background", "cancel", NAME, "-y").exit_code == 0
    from_start = cli("background", "retry", NAME, "--from-start", "-y", "--json")
    assert from_start.exit_code == 0, from_start.stderr
    assert from_start.json == {"applied": "changed", "status": "pending"}
    stored = state(db)
    assert stored["pass"] == 0 and stored["badIds"] == [] and stored["phase"] == "partition"
    assert db[PARTITIONS].count_documents({"background": NAME}) == 0
    assert cli("background", "run", NAME).exit_code == 0
    assert state(db)["status"] == "completed"


def test_a_document_failing_again_after_retry_from_start_is_counted_once(
    project: Any, cli: Any, db: Any
) -> None:
    """Three documents fail, over a budget of two: the migration fails. One is fixed, the rest
    are tried again from the start and fail again: ``totals.failed`` is the two documents of
    the failed list, not the five failures seen; the other totals are kept."""
    db.users.insert_many([{"n": i, "bad": i in (3, 4, 5)} for i in range(120)])
    db.users.create_index([("__v", 1), ("_id", 1)])
    failing = migration(batch_size=50).replace(
        'if False:\n        raise ValueError("cannot migrate this one")',
        'if doc.get("bad"):\n        raise ValueError("cannot migrate this one")',
    ).replace('"max_parallel": 2,', '"max_parallel": 2,\n    "max_document_errors": 2,')
    assert 'if doc.get("bad")' in failing and '"max_document_errors": 2' in failing
    project.write_migration("0001_users_v1", failing)
    assert cli("up").exit_code == 0
    failed = cli("background", "run", NAME)
    assert failed.exit_code == 32, failed.stderr
    db.users.update_one({"n": 5}, {"$set": {"bad": False}})
    assert cli("background", "retry", NAME, "--from-start", "-y").exit_code == 0
    assert state(db)["totals"].get("failed", 0) == 0
    completed = cli("background", "run", NAME)
    assert completed.exit_code == 0, completed.stderr
    view = cli("background", "status", NAME, "--json").json["background"][0]
    assert view["status"] == "completed" and view["failedDocuments"] == 2
    assert view["totals"]["failed"] == 2
    assert view["totals"]["migrated"] == db.users.count_documents({"__v": 1}) == 118
    assert len(state(db)["badIds"]) == 2


def test_controls_on_unregistered_name_exit_9(cli: Any) -> None:
    for args in (["pause"], ["resume"], ["cancel", "-y"], ["retry"], ["retry", "--from-start",
                 "-y"], ["repin", "-y"], ["unlock", "-y"]):
        action, *flags = args
        result = cli("background", action, "0009_nope.py", *flags, "--json")
        assert result.exit_code == 9, (args, result.stderr)
        assert result.json["error"]["code"] == "NOT_APPLIED"


def test_conflicts_exit_33_before_any_prompt(project: Any, cli: Any, db: Any) -> None:
    register(project, cli, db, docs=10)
    assert cli("background", "run", NAME).exit_code == 0
    for action in ("pause", "cancel", "resume"):
        result = cli("background", action, NAME, input="y\n")
        assert result.exit_code == 33, (action, result.stderr)
        assert "[y/N]" not in result.stderr
    assert state(db)["status"] == "completed"


# ------------------------------------------------------------------------------- confirmations


def test_cancel_confirmation(project: Any, cli: Any, db: Any) -> None:
    register(project, cli, db, docs=10)
    declined = cli("background", "cancel", NAME, input="n\n")
    assert declined.exit_code == 0, declined.stderr
    assert "Aborted" in declined.stdout
    assert f"⚠ {NAME} is pending (pass 0, 0 migrated, 0 lane(s) working)" in declined.stderr
    assert f"Cancel {NAME}? [y/N]" in declined.stderr
    assert state(db)["status"] == "pending"

    closed = cli("background", "cancel", NAME, input="")
    assert closed.exit_code == 6 and "stdin closed" in closed.stderr
    assert state(db)["status"] == "pending"

    no_yes = cli("background", "cancel", NAME, "--json", env=BAD_URI)
    assert no_yes.exit_code == 6
    assert "needs confirmation — pass --yes in --json mode" in no_yes.json["error"]["message"]

    accepted = cli("background", "cancel", NAME, input="y\n")
    assert accepted.exit_code == 0 and ": cancel (" in accepted.stdout
    assert state(db)["status"] == "cancelled"


def test_retry_from_start_repin_and_unlock_ask(project: Any, cli: Any, db: Any) -> None:
    register(project, cli, db, docs=10)
    assert cli("background", "cancel", NAME, "-y").exit_code == 0
    asked = cli("background", "retry", NAME, "--from-start", input="n\n")
    assert asked.exit_code == 0 and "Aborted" in asked.stdout
    assert f"Retry from the start {NAME}? [y/N]" in asked.stderr
    assert state(db)["status"] == "cancelled"
    plain = cli("background", "retry", NAME, input="")  # no --from-start: no question
    assert plain.exit_code == 0 and state(db)["status"] == "pending"

    repin = cli("background", "repin", NAME, input="n\n")
    assert repin.exit_code == 0 and "Aborted" in repin.stdout and "[y/N]" in repin.stderr
    unlock = cli("background", "unlock", NAME, input="n\n")
    assert unlock.exit_code == 0 and "Aborted" in unlock.stdout and "[y/N]" in unlock.stderr

    for args in (["retry", NAME, "--from-start"], ["repin", NAME], ["unlock", NAME]):
        result = cli("background", *args, "--json", env=BAD_URI)
        assert result.exit_code == 6, (args, result.stderr)
        assert "pass --yes" in result.json["error"]["message"]


# ------------------------------------------------------------------------------- repin, unlock


def test_repin_adopts_a_changed_file(project: Any, cli: Any, db: Any) -> None:
    register(project, cli, db, docs=10)
    before = state(db)["checksum"]
    project.write_migration("0001_users_v1", migration(max_parallel=3))
    result = cli("background", "repin", NAME, "-y", "--reason", "tuning", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json["applied"] == "changed" and result.json["status"] == "pending"
    assert result.json["replan"] is True
    stored = state(db)
    assert stored["checksum"] == result.json["checksum"] != before
    assert stored["spec"]["maxParallel"] == 3
    assert stored["history"][-1]["action"] == "repin"
    record = db["_migronaut_migrations"].find_one({"name": NAME})
    assert record is not None and record["checksum"] == stored["checksum"]
    human = cli("background", "repin", NAME, "--yes")
    assert human.exit_code == 0 and f"✔ Repinned {NAME}" in human.stdout


def test_retry_with_repin_runs_the_fixed_file(project: Any, cli: Any, db: Any) -> None:
    register(project, cli, db, docs=20, fail=True)
    assert cli("background", "run", NAME).exit_code == 32
    project.write_migration("0001_users_v1", migration())
    result = cli("background", "retry", NAME, "--repin", "--from-start", "-y", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json["status"] == "pending" and len(result.json["checksum"]) == 64
    assert cli("background", "run", NAME).exit_code == 0
    assert db.users.count_documents({"__v": 1}) == 20


def test_unlock_releases_the_coordinator_lock_and_leases(project: Any, cli: Any,
                                                          db: Any) -> None:
    register(project, cli, db)
    assert cli("background", "run", NAME, "--once").exit_code == 0
    hold_coordinator(db)
    db[PARTITIONS].update_one(
        {"background": NAME},
        [{"$set": {"lease": {"slot": 0, "token": "t", "owner": "o", "host": "h", "pid": 1,
                             "ttlMs": 60_000, "renewedAt": "$$NOW", "claimedAt": "$$NOW"}}}],
    )
    result = cli("background", "unlock", NAME, "-y")
    assert result.exit_code == 0, result.stderr
    assert "✔ Released the coordinator lock and 1 lease(s)" in result.stdout
    assert leases(db) == 0
    assert db[LOCKS].find_one({"_id": f"background:{NAME}"}) is None
    again = cli("background", "unlock", NAME, "-y", "--json")
    assert again.json == {"lock": False, "leases": 0}
    assert "(none held) and 0 lease(s)" in cli("background", "unlock", NAME, "-y").stdout
    assert history_actions(db)  # the registration's history is kept


# ------------------------------------------------------------------- dry-run, verify, watch


def test_dry_run_flags_are_checked_before_connecting(cli: Any) -> None:
    for args in (["--sample", "0"], ["--sample", "1001"], ["--first", "x"], ["--steps", "51"],
                 ["--max-docs", "0"], ["--deadline-ms", "50001"], ["--sample", "2", "--first",
                 "2"]):
        result = cli("background", "dry-run", NAME, *args, env=BAD_URI)
        assert result.exit_code == 6, (args, result.stderr)


def test_dry_run_previews_and_writes_nothing(project: Any, cli: Any, db: Any) -> None:
    db.users.insert_many([{"_id": i, "n": i} for i in range(10)])
    project.write_migration("0001_users_v1", migration())  # not registered: works all the same
    human = cli("background", "dry-run", NAME, "--first", "3")
    assert human.exit_code == 0, human.stderr
    assert '✔ 0: {"$set": {' in human.stdout
    assert "◎ 3 of 3 would be migrated, 0 would fail" in human.stdout
    report = cli("background", "dry-run", NAME, "--sample", "4", "--json").json
    assert report["mode"] == "declarative" and report["method"] == "sample"
    assert report["found"] == 4 and report["migrated"] == 4
    assert db.users.count_documents({"__v": 1}) == 0
    assert db[STATES].count_documents({}) == 0
    refused = cli("background", "dry-run", NAME, "--steps", "2")
    assert refused.exit_code == 6, refused.stderr
    no_revert = cli("background", "dry-run", NAME, "--revert")
    assert no_revert.exit_code == 6 and "revert" in no_revert.stderr
    db.users.update_many({}, {"$set": {"__v": 1}})
    nothing = cli("background", "dry-run", NAME)
    assert nothing.exit_code == 1, nothing.stderr
    assert "◎ 0 of 0 would be migrated" in nothing.stdout
    assert cli("background", "dry-run", "0009_nope.py").exit_code == 8


def test_verify_reports_drift(project: Any, cli: Any, db: Any) -> None:
    register(project, cli, db, docs=10)
    assert cli("background", "run", NAME).exit_code == 0
    result = cli("background", "verify")
    assert result.exit_code == 0, result.stderr
    assert "✔ No drift (1 checked, 0 skipped)" in result.stdout
    db.users.insert_one({"n": "late"})
    drift = cli("background", "verify", "--report", "--json")
    assert drift.exit_code == 31, drift.stderr
    assert drift.json["drift"] == [{"migration": NAME, "collection": "users",
                                    "action": "reported"}]
    assert state(db)["status"] == "completed"
    reopened = cli("background", "verify")
    assert reopened.exit_code == 31
    assert "⚠ users: old-shape documents after 0001_users_v1.py — reopened" in reopened.stderr
    assert state(db)["status"] == "running"


def test_a_declared_version_floor_at_or_above_to_is_not_drift(
    project: Any, cli: Any, db: Any
) -> None:
    """``users`` declares ``versioning.min`` 1, the migration's ``to``: the validator refuses
    the old shape, so verify, audit and a runner's verifier skip the collection — a document
    below the floor is converge's business, not a reason to reopen the migration."""
    register(project, cli, db, docs=10)
    assert cli("background", "run", NAME).exit_code == 0
    db.users.insert_one({"n": "late"})
    env = {"MIGRONAUT_COLLECTIONS_DIR": "collections"}
    project.write("collections/users.json", '{"versioning": {"current": 1, "min": 1}}')
    before = state(db)
    audit = cli("audit", "--json", env=env)
    assert audit.exit_code == 0, audit.stderr
    check = next(c for c in audit.json["checks"] if c["name"] == "background")
    assert check["status"] == "pass", check
    skipped = cli("background", "verify", "--json", env=env)
    assert skipped.exit_code == 0, skipped.stderr
    assert skipped.json == {"checked": 0, "skipped": 1, "drift": []}
    with make_migrator(project, collections_dir="collections") as migrator:
        assert migrator.background.verify(on_drift="reopen") == {
            "checked": 0, "skipped": 1, "drift": []}
    assert state(db) == before
    project.write("collections/users.json", '{"versioning": {"current": 1, "min": 0}}')
    reported = cli("background", "verify", "--report", "--json", env=env)
    assert reported.exit_code == 31, reported.stderr
    assert reported.json["drift"] == [{"migration": NAME, "collection": "users",
                                       "action": "reported"}]


@pytest.mark.standalone
def test_watch_refuses_a_server_without_change_streams(cli: Any) -> None:
    result = cli("background", "watch", "--json")
    assert result.exit_code == 6, result.stderr
    assert result.json["error"]["code"] == "CONFIG_INVALID"


# -------------------------------------------------------------- work, progress: real processes


@pytest.mark.slow
def test_progress_json_ticks_while_a_worker_migrates(project: Any, cli: Any, cli_process: Any,
                                                     db: Any) -> None:
    register(project, cli, db, docs=300, sleep=0.01, batch_size=25)
    worker = cli_process.start("background", "work", "--lanes", "2", "--poll", "0.2")
    watcher = cli_process.start("background", "progress", NAME, "--interval", "0.3", "--json")
    result = cli_process.wait(watcher, timeout=120)
    assert result.exit_code == 0, result.stderr
    ticks = json_lines(result.stdout)
    assert len(ticks) >= 2, result.stdout
    for tick in ticks:
        assert set(tick) == {"at", "background", "done"}
        [row] = tick["background"]
        assert row["migration"] == NAME
        for key in ("status", "done", "estimate", "percent", "migrated", "rate", "etaSeconds",
                    "liveLeases", "maxParallel", "failedDocuments", "partitions"):
            assert key in row
    assert [t["done"] for t in ticks].count(True) == 1 and ticks[-1]["done"] is True
    last = ticks[-1]["background"][0]
    assert last["status"] == "completed" and last["migrated"] == 300 and last["percent"] == 100
    assert any(t["background"][0]["status"] == "running" for t in ticks[:-1])
    assert all("_id" not in json.dumps(t) for t in ticks)

    worker.send_signal(signal.SIGTERM)
    stopped = cli_process.wait(worker, timeout=60)
    assert stopped.exit_code == 0, stopped.stderr
    assert "⇉ Worker started — 2 lane(s)" in stopped.stdout
    assert "✔ Worker stopped" in stopped.stdout
    assert leases(db) == 0


def test_progress_human_and_exit_codes(project: Any, cli: Any, db: Any) -> None:
    register(project, cli, db, docs=30)
    assert cli("background", "progress", "0009_nope.py").exit_code == 6
    assert cli("background", "progress", "--interval", "0", env=BAD_URI).exit_code == 6
    assert cli("background", "run", NAME).exit_code == 0
    done = cli("background", "progress", NAME)
    assert done.exit_code == 0, done.stderr
    assert f"◎ {NAME}  completed  pass" in done.stdout and "30/30 (100%)" in done.stdout
    db[STATES].update_one({"_id": NAME}, {"$set": {"status": "failed"}})
    failed = cli("background", "progress", "--json")
    assert failed.exit_code == 32 and len(json_lines(failed.stdout)) == 1
    assert "✖ A background migration failed" in failed.stderr


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_work_shuts_down_cleanly_on_a_signal(project: Any, cli: Any, cli_process: Any, db: Any,
                                              sig: signal.Signals) -> None:
    register(project, cli, db, docs=300, sleep=0.01, batch_size=20)
    worker = cli_process.start("background", "work", "--lanes", "2", "--poll", "0.2", "--json")
    wait_until(lambda: leases(db) > 0, timeout=60, what="a lane to hold a lease")
    worker.send_signal(sig)
    result = cli_process.wait(worker, timeout=60)
    assert result.exit_code == 0, result.stderr
    assert (f"⚠ {sig.name} received — stopping the worker: lanes finish the batch in flight, "
            "checkpoint and release their leases. Press again to exit immediately.\n"
            ) in result.stderr
    assert "current migration" not in result.stderr
    summary = result.json["worker"]
    assert summary["lanes"] == 2 and summary["slices"] >= 1
    assert leases(db) == 0
    stored = state(db)
    assert stored["status"] == "running"
    assert all(p.get("failures", 0) == 0 for p in db[PARTITIONS].find({"background": NAME}))
    # the work goes on from the last checkpoint, each document rewritten exactly once
    assert cli("background", "run", NAME, "--concurrency", "2").exit_code == 0
    assert db.users.count_documents({"__v": 1, "__rev": 1}) == 300


@pytest.mark.slow
def test_run_first_signal_exits_11_second_exits_at_once(project: Any, cli: Any,
                                                        cli_process: Any, db: Any) -> None:
    register(project, cli, db, docs=200, sleep=0.01, batch_size=20)
    first = cli_process.start("background", "run", NAME, "--json")
    wait_until(lambda: leases(db) > 0, timeout=60, what="a lane to hold a lease")
    first.send_signal(signal.SIGINT)
    result = cli_process.wait(first, timeout=60)
    assert result.exit_code == 11, result.stderr
    assert result.json["error"]["code"] == "RUN_ABORTED"
    assert leases(db) == 0 and state(db)["status"] == "running"

    # a transform stuck in a document: the first signal cannot finish the batch quickly
    marker = project.path / "transform-started"
    project.write_migration("0001_users_v1", migration(sleep=5.0, batch_size=5, extra=f"""
_real_migrate = migrate


def migrate(doc, ctx):
    open({str(marker)!r}, "w").close()
    return _real_migrate(doc, ctx)
"""))
    assert cli("background", "repin", NAME, "-y").exit_code == 0
    second = cli_process.start("background", "run", NAME)
    wait_until(marker.exists, timeout=60, what="a transform to start")
    second.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    second.send_signal(signal.SIGTERM)
    assert cli_process.wait(second, timeout=30).exit_code == 143


# ------------------------------------------------------------------------- create --background


def test_create_background_writes_the_skeleton(project: Any, cli: Any) -> None:
    result = cli("create", "backfill status", "--background", "--json")
    assert result.exit_code == 0, result.stderr
    from pathlib import Path

    path = Path(result.json["path"])
    text = path.read_text(encoding="utf-8")
    assert path.name.endswith("_backfill_status.py")
    assert "background = {" in text and '"collection": "TODO"' in text
    assert "# def revert(" in text and "backfill status" in text
    refused = cli("up", "--json")
    assert refused.exit_code == 20
    assert "placeholder" in refused.json["error"]["message"]

    template = project.write("tpl.py", "def up(ctx):\n    pass\n")
    both = cli("create", "x", "--background", "--template", str(template), "--json")
    assert both.exit_code == 6 and both.json["error"]["code"] == "CONFIG_INVALID"
