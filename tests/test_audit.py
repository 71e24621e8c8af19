"""``migronaut audit`` / ``Migrator.audit()``: every check of reference core §11.3 (and the
background check of background §6.9) in its pass, warn and fail states, each state built for real
in the test database; the report's JSON shape and exit codes; and that an audit only reads."""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest

from helpers.background import background_file, seed
from helpers.engine import (
    CHANGELOG,
    LOCK_ID,
    LOCKS,
    Events,
    hold_lock,
    make_migrator,
    server_now,
    write_simple,
)

ORDER = ["config", "connection", "transactions", "indexes", "lock", "changelog", "checksums",
         "pending", "ordering", "files", "runtime"]
BAD_URI = "mongodb://auditor:s3cret-pw@127.0.0.1:9/?serverSelectionTimeoutMS=300"
B1 = "0001_users_v1.py"
B2 = "0002_orders_v1.py"
STATES = "_migronaut_background"
PARTITIONS = "_migronaut_background_partitions"
WATCH = "_migronaut_background_watch"
FAILING = "def up(ctx):\n    raise ValueError('boom')\n\n\ndef down(ctx):\n    pass\n"
TWENTY_MINUTES_MS = 20 * 60 * 1000


def audit(cli: Any, *args: str, env: Any = None) -> tuple[int, dict[str, Any]]:
    """``migronaut audit --json``: (exit code, report) — stdout must be one JSON document."""
    result = cli("audit", "--json", *args, env=env)
    assert result.json is not None, f"not JSON: {result.stdout!r} / {result.stderr!r}"
    return result.exit_code, result.json


def check(report: dict[str, Any], name: str) -> dict[str, Any]:
    [found] = [c for c in report["checks"] if c["name"] == name]
    return found


def snapshot(db: Any) -> dict[str, Any]:
    """Every collection of the test database with its documents and index names."""
    return {
        name: (list(db[name].find()), sorted(db[name].index_information()))
        for name in sorted(db.list_collection_names())
    }


def ago(db: Any, collection: str, query: dict[str, Any], **fields: int) -> None:
    """Set each of ``fields`` to server time minus that many milliseconds."""
    db[collection].update_many(
        query, [{"$set": {k: {"$subtract": ["$$NOW", ms]} for k, ms in fields.items()}}]
    )


def backdate_state(db: Any, name: str, ms: int, *fields: str) -> None:
    """Move a background state's ``fields`` and every history entry ``ms`` into the past (server
    time): as if its last status change, and those stamps, happened that long ago."""
    ago(db, STATES, {"_id": name}, **dict.fromkeys(fields, ms))
    then = server_now(db) - dt.timedelta(milliseconds=ms)
    db[STATES].update_one({"_id": name}, {"$set": {"history.$[].at": then}})


# ------------------------------------------------------------------------- a healthy project


def test_a_healthy_project_passes_every_check(
    cli: Any, project: Any, db: Any, db_name: str, server_hello: dict[str, Any]
) -> None:
    write_simple(project, "0001_a", "0002_b")
    assert cli("up").exit_code == 0

    code, report = audit(cli)

    assert code == 0
    assert report == {"ok": True, "failed": 0, "warnings": 0, "checks": report["checks"]}
    assert [c["name"] for c in report["checks"]] == ORDER
    assert {c["status"] for c in report["checks"]} == {"pass"}
    assert all(set(c) == {"name", "status", "detail"} for c in report["checks"])
    details = {c["name"]: c["detail"] for c in report["checks"]}
    assert details["config"] == f'Loaded (database "{db_name}")'
    assert details["connection"] == "Connected"
    if server_hello.get("setName"):
        assert details["transactions"] == f'Replica set "{server_hello["setName"]}"'
    else:  # the dev server: no replica-set name, but transactions work
        assert details["transactions"] == (
            "No replica set reported, but transactions work (the dev server?)")
    assert details["indexes"] == "All 5 changelog indexes present"
    assert details["lock"] == "Not held"
    assert details["changelog"] == "2 record(s), all understood, one per migration"
    assert details["checksums"] == "No applied file changed on disk"
    assert details["pending"] == "No pending migrations"
    assert details["files"] == "Every applied migration has its file"
    assert re.fullmatch(r"Python \d+\.\d+\.\d+\S*, pymongo \S+", details["runtime"])


def test_human_output_is_one_line_per_check_and_a_summary(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a")
    assert cli("up").exit_code == 0

    result = cli("audit")

    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == len(ORDER) + 1
    for line, name in zip(lines, ORDER, strict=False):
        assert line.startswith(f"✔ {name:<12} "), line
    assert lines[-1] == "No problems found (0 warning(s))"
    assert "\x1b[" not in result.stdout  # not a TTY: no colours


# --------------------------------------------------------------------------------- read-only


def test_an_audit_writes_nothing_creates_no_index_and_emits_no_event(
    project: Any, db: Any
) -> None:
    write_simple(project, "0001_a")
    migrator = make_migrator(project)  # ensure_indexes is on (the default)
    try:
        events = Events(migrator)
        report = migrator.audit()

        assert db.list_collection_names() == []  # no changelog, no index, no lock, no probe
        assert events.items == []
        assert report.ok
        assert [c.name for c in report.checks] == ORDER
        indexes = next(c for c in report.checks if c.name == "indexes")
        assert indexes.status == "warn"
        assert indexes.detail == (
            "Missing: name_unique, status_batch, batch, status_name, status_appliedAt_name "
            "(created by the next command that writes the changelog)")

        migrator.status()  # no read-only command creates them...
        assert db.list_collection_names() == []
        migrator.up()  # ...the first run that may write the changelog does
        assert migrator.changelog.missing_indexes() == []
    finally:
        migrator.close()


def test_an_audit_leaves_a_populated_database_untouched(cli: Any, project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    assert cli("up", "--to", "0001_a.py").exit_code == 0
    db[CHANGELOG].drop_index("batch")
    hold_lock(db, age_ms=120_000)
    before = snapshot(db)

    code, report = audit(cli)

    assert code == 0 and report["warnings"] == 3  # index, stale lock, pending
    assert snapshot(db) == before


# ------------------------------------------------------------------------- config (fatal)


@pytest.mark.parametrize(
    ("arrange", "env", "named"),
    [
        ("migronaut.toml", {}, "lock_ttl_seconds (migronaut.toml): must be a positive integer"),
        (None, {"MIGRONAUT_LOCK_TTL": "soon"}, "MIGRONAUT_LOCK_TTL: must be a positive integer"),
        (None, {"MIGRONAUT_DB": None}, "db_name: db_name is required"),
    ],
)
def test_an_invalid_config_fails_the_config_check_and_ends_the_report(
    cli: Any, project: Any, db: Any, arrange: str | None, env: dict[str, Any], named: str
) -> None:
    if arrange:
        project.write(arrange, 'lock_ttl_seconds = "soon"\n')

    code, report = audit(cli, env=env)

    assert code == 22
    assert report["ok"] is False and report["failed"] == 1 and report["warnings"] == 0
    [config] = report["checks"]
    assert config["name"] == "config" and config["status"] == "fail"
    assert config["detail"].startswith("Invalid configuration: ")
    assert named in config["detail"]
    assert db.list_collection_names() == []

    human = cli("audit", env=env)
    assert human.exit_code == 22
    assert human.stdout.startswith("✖ config       Invalid configuration: ")
    assert human.stderr.strip() == "1 check(s) failed, 0 warning(s)"


# --------------------------------------------------------------------- connection (fatal)


def test_an_unreachable_server_fails_the_connection_check(cli: Any) -> None:
    code, report = audit(cli, "--uri", BAD_URI)

    assert code == 22
    assert report["ok"] is False and report["failed"] == 1
    assert [(c["name"], c["status"]) for c in report["checks"]] == [
        ("config", "pass"), ("connection", "fail")]
    assert check(report, "connection")["detail"].startswith("Failed to connect to MongoDB at ")
    assert "error" not in report  # a finding, not an error envelope

    human = cli("audit", "--uri", BAD_URI)
    assert human.exit_code == 22
    assert human.stdout.splitlines()[1].startswith("✖ connection   Failed to connect to MongoDB")
    for text in (human.stdout, human.stderr, cli("audit", "--json", "--uri", BAD_URI).stdout):
        assert "s3cret-pw" not in text


def test_an_injected_client_is_used_and_not_closed(project: Any, client: Any) -> None:
    migrator = make_migrator(project, uri=None, client=client)
    try:
        report = migrator.audit()
    finally:
        migrator.close()
    connection = next(c for c in report.checks if c.name == "connection")
    assert (connection.status, connection.detail) == ("pass", "Using the injected client")
    client.admin.command("ping")  # still open


# ---------------------------------------------------------------------------- transactions


@pytest.fixture(scope="module")
def standalone() -> Iterator[Any]:
    from migronaut.devserver import start_subprocess

    with start_subprocess(standalone=True) as server:
        yield server


@pytest.mark.skipif(bool(os.environ.get("MIGRONAUT_TEST_URI")),
                    reason="starts its own dev server (--standalone)")
def test_a_standalone_warns_and_fails_with_use_transaction_on(
    cli: Any, project: Any, standalone: Any
) -> None:
    code, report = audit(cli, "--uri", standalone.uri)
    assert code == 0
    transactions = check(report, "transactions")
    assert transactions == {
        "name": "transactions", "status": "warn",
        "detail": "Standalone server — no transactions (a migration with use_transaction = True "
                  "fails)"}

    code, report = audit(cli, "--uri", standalone.uri, env={"MIGRONAUT_USE_TRANSACTION": "true"})
    assert code == 22
    assert report["ok"] is False and report["failed"] == 1
    assert check(report, "transactions") == {
        "name": "transactions", "status": "fail",
        "detail": "Standalone server with use_transaction on — transactions need a replica set "
                  "or a sharded cluster"}
    assert [c["name"] for c in report["checks"]] == ORDER  # not fatal: every check ran


# --------------------------------------------------------------------------------- indexes


def test_a_dropped_changelog_index_warns_and_stays_dropped(
    cli: Any, project: Any, db: Any
) -> None:
    write_simple(project, "0001_a")
    assert cli("up").exit_code == 0
    db[CHANGELOG].drop_index("status_name")

    code, report = audit(cli)

    assert code == 0 and report["ok"] is True and report["warnings"] == 1
    assert check(report, "indexes") == {
        "name": "indexes", "status": "warn",
        "detail": "Missing: status_name (created by the next command that writes the changelog)"}
    assert "status_name" not in db[CHANGELOG].index_information()

    _, report = audit(cli, env={"MIGRONAUT_ENSURE_INDEXES": "false"})
    assert check(report, "indexes")["detail"] == (
        "Missing: status_name (ensure_indexes is off: create them)")

    coloured = cli("audit", env={"MIGRONAUT_FORCE_COLOR": "1"})
    assert coloured.exit_code == 0
    assert "\x1b[33m⚠ indexes      Missing: status_name" in coloured.stdout
    assert "\x1b[32mNo problems found (1 warning(s))\x1b[0m" in coloured.stdout


# ------------------------------------------------------------------------------------ lock


def test_lock_not_held_fresh_and_past_its_ttl(cli: Any, project: Any, db: Any) -> None:
    _, report = audit(cli)
    assert check(report, "lock") == {"name": "lock", "status": "pass", "detail": "Not held"}

    hold_lock(db, age_ms=5_000, ttl_ms=60_000)
    _, report = audit(cli)
    fresh = check(report, "lock")
    assert fresh["status"] == "pass"
    assert re.fullmatch(r"Held by pid 4242 on other-host for [5-9]s", fresh["detail"])

    hold_lock(db, age_ms=120_000, ttl_ms=60_000)
    before = db[LOCKS].find_one({"_id": LOCK_ID})
    code, report = audit(cli)
    stale = check(report, "lock")
    assert code == 0 and stale["status"] == "warn"
    assert re.fullmatch(
        r"Held by pid 4242 on other-host for 12\ds — past its TTL of 60s, likely from a crashed "
        r"run \(migronaut unlock\)", stale["detail"])
    assert db[LOCKS].find_one({"_id": LOCK_ID}) == before  # never reclaimed by an audit


# ------------------------------------------------------------------------------- checksums


def test_an_applied_file_edited_on_disk_fails_the_audit(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    assert cli("up").exit_code == 0
    path = project.migrations / "0001_a.py"
    path.write_text(path.read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")

    code, report = audit(cli)

    assert code == 22
    assert report["ok"] is False and report["failed"] == 1 and report["warnings"] == 0
    assert check(report, "checksums") == {
        "name": "checksums", "status": "fail", "detail": "Edited after being applied: 0001_a.py"}
    human = cli("audit")
    assert human.exit_code == 22
    assert "✖ checksums    Edited after being applied: 0001_a.py" in human.stdout.splitlines()
    assert human.stderr.strip() == "1 check(s) failed, 0 warning(s)"


def test_a_line_ending_only_change_is_not_drift(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a")
    assert cli("up").exit_code == 0
    path = project.migrations / "0001_a.py"
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))

    code, report = audit(cli)
    assert code == 0 and check(report, "checksums")["status"] == "pass"


# ------------------------------------------------------------------------ pending, ordering


def test_pending_counts_failed_rows_and_ordering_names_late_files(
    cli: Any, project: Any
) -> None:
    write_simple(project, "0002_b")
    assert cli("up").exit_code == 0
    write_simple(project, "0001_a", "0003_c")
    project.write_migration("0004_d", FAILING)
    assert cli("up").exit_code == 7  # 0001 and 0003 apply, 0004 fails (a failed record)
    write_simple(project, "0000_early", "0005_e")

    code, report = audit(cli)

    assert code == 0 and report["ok"] is True and report["warnings"] == 2
    assert check(report, "pending") == {
        "name": "pending", "status": "warn", "detail": "3 pending migration(s) (1 failed)"}
    assert check(report, "ordering") == {
        "name": "ordering", "status": "warn",
        "detail": "Pending but older than the newest applied migration: 0000_early.py"}


# ---------------------------------------------------------------------------------- runtime


def test_runtime_warns_about_extensions_python_cannot_load(cli: Any, project: Any) -> None:
    project.write("migronaut.toml", 'file_extensions = [".py", ".js"]\n')

    code, report = audit(cli)

    runtime = check(report, "runtime")
    assert code == 0 and runtime["status"] == "warn"
    assert re.fullmatch(r"Python \S+, pymongo \S+ cannot load migration files ending in \.js "
                        r"\(file_extensions\)", runtime["detail"])


# ------------------------------------------------------------------------------- background


def register(cli: Any, project: Any, db: Any, *, docs: int = 60, **options: Any) -> None:
    seed(db, docs=docs)
    project.write_migration("0001_users_v1", background_file(**options))
    result = cli("up")
    assert result.exit_code == 0, result.stderr


def background(cli: Any, *, expect_code: int = 0) -> dict[str, Any]:
    code, report = audit(cli)
    assert code == expect_code, report
    return check(report, "background")


def finding(status: str, detail: str) -> dict[str, str]:
    return {"name": "background", "status": status, "detail": detail}


def test_no_background_check_without_background_migrations(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a")
    assert cli("up").exit_code == 0
    _, report = audit(cli)
    assert "background" not in [c["name"] for c in report["checks"]]


def test_background_passes_while_pending_and_once_completed(
    cli: Any, project: Any, db: Any
) -> None:
    register(cli, project, db)
    _, report = audit(cli)
    assert [c["name"] for c in report["checks"]] == [*ORDER[:-1], "background", "runtime"]
    assert check(report, "background") == finding("pass", "1 background migration(s): 1 pending")

    assert cli("background", "run", B1).exit_code == 0
    assert background(cli) == finding("pass", "1 background migration(s): 1 completed")

    assert cli("down").exit_code == 0  # re-registered in the revert direction
    assert cli("background", "run", B1).exit_code == 0
    assert background(cli) == finding("pass", "1 background migration(s): 1 reverted")


def test_background_pending_for_long_warns_and_paused_warns(
    cli: Any, project: Any, db: Any
) -> None:
    register(cli, project, db)
    backdate_state(db, B1, TWENTY_MINUTES_MS, "registeredAt")
    found = background(cli)
    assert found["status"] == "warn"
    assert re.fullmatch(rf"{B1} pending for 2\d min — is a runner up\?", found["detail"])

    assert cli("background", "pause", B1).exit_code == 0
    assert background(cli) == finding("warn", f"{B1} is paused")

    # resumed just now: pending again, but not for long (the clock restarts at the status move)
    assert cli("background", "resume", B1).exit_code == 0
    assert background(cli) == finding("pass", "1 background migration(s): 1 pending")


def test_background_failed_fails_and_blocks_its_dependent(cli: Any, project: Any, db: Any) -> None:
    seed(db, "orders", 20)
    register(cli, project, db, fail_on=5, extra_spec='"max_document_errors": 0,')
    project.write_migration("0002_orders_v1", background_file(
        collection="orders", requires=f'requires = ["{B1}"]'))
    assert cli("up").exit_code == 0
    assert cli("background", "run", B1).exit_code == 32

    code, report = audit(cli)

    assert code == 22 and report["ok"] is False and report["failed"] == 1
    found = check(report, "background")
    assert found["status"] == "fail"
    failed, blocked = found["detail"].split("; ")
    assert re.fullmatch(rf"{B1} failed \(.*cannot migrate this one.*\)", failed), failed
    assert blocked == f"{B2} is blocked by failed {B1}"
    assert cli("audit").stderr.strip() == "1 check(s) failed, 0 warning(s)"


def test_background_completed_with_failed_documents_keeps_warning(
    cli: Any, project: Any, db: Any
) -> None:
    register(cli, project, db, fail_on=5, extra_spec='"max_document_errors": 3,')
    assert cli("background", "run", B1).exit_code == 0
    assert db[STATES].find_one({"_id": B1})["status"] == "completed"

    assert background(cli) == finding(
        "warn", f"{B1} completed with 1 document(s) that could not be migrated")


def test_background_running_stalled_failed_and_foreign_partitions_warn(
    cli: Any, project: Any, db: Any
) -> None:
    register(cli, project, db, docs=150)
    assert cli("background", "run", B1, "--once").exit_code == 0  # plan + one round: running
    state = db[STATES].find_one({"_id": B1})
    assert state["status"] == "running"
    assert background(cli)["status"] == "pass"

    backdate_state(db, B1, TWENTY_MINUTES_MS, "lastProgressAt")
    found = background(cli)
    assert re.fullmatch(rf"{B1} running but stalled \(no live lease, no progress for 2\d min\)",
                        found["detail"]), found

    db[STATES].update_one({"_id": B1}, {"$currentDate": {"lastProgressAt": True}})
    token, generation = state["plan"]["token"], state["generation"]
    db[PARTITIONS].update_one({"background": B1, "plan": token}, {"$set": {"status": "failed"}})
    db[PARTITIONS].insert_one({"background": B1, "generation": generation, "plan": "crashed",
                               "seq": 0, "status": "pending"})
    assert background(cli) == finding(
        "warn", f"{B1}: 1 failed partition(s) in the current plan; "
                f"{B1}: 1 partition(s) of an old plan")


def test_background_old_shape_documents_after_completion_warn_without_reopening(
    cli: Any, project: Any, db: Any
) -> None:
    register(cli, project, db)
    assert cli("background", "run", B1).exit_code == 0
    db.users.insert_one({"n": "late"})  # an old application version wrote a v0 document
    before = snapshot(db)

    assert background(cli) == finding("warn", f"{B1} holds old-shape documents again (users)")
    assert snapshot(db) == before  # reported, not reopened


def test_background_file_changed_missing_and_record_without_state(
    cli: Any, project: Any, db: Any
) -> None:
    register(cli, project, db)
    path = project.migrations / B1
    path.write_text(path.read_text(encoding="utf-8") + "\n# tuned\n", encoding="utf-8")
    code, report = audit(cli)
    assert code == 22  # the changelog record's checksum fails the checksums check too
    assert check(report, "background") == finding(
        "warn", f"{B1} changed on disk since it was registered (repin it)")

    path.unlink()
    assert background(cli) == finding("warn", f"{B1}: file missing")

    db[STATES].delete_one({"_id": B1})
    assert background(cli) == finding(
        "warn", f"{B1} is applied but its background migration is not registered")


def test_background_live_watch_rows_without_a_leader_warn_in_stream_mode(
    cli: Any, project: Any, db: Any
) -> None:
    register(cli, project, db)
    assert cli("background", "run", B1).exit_code == 0
    db[WATCH].insert_many([{"_id": "users", "state": "fallback"},
                           {"_id": "orders", "state": "streaming"}])
    ago(db, WATCH, {}, updatedAt=TWENTY_MINUTES_MS)
    assert background(cli)["status"] == "pass"  # the default 'poll' mode hosts no watcher

    code, report = audit(cli, env={"MIGRONAUT_BACKGROUND_DRIFT": "stream"})
    found = check(report, "background")
    assert code == 0 and found["status"] == "warn"
    orders, users = found["detail"].split("; ")
    assert re.fullmatch(r"orders: drift watcher had no live leader for 2\d min", orders)
    assert re.fullmatch(r"users: drift watcher fallen back to polling for 2\d min", users)
