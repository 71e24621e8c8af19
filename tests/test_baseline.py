"""``migronaut baseline``: mark pending files applied without running them (reference core
§11.2), through the API and the CLI."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.engine import (
    CHANGELOG,
    LOCKS,
    Events,
    applied,
    calls,
    hold_lock,
    make_migrator,
    records,
    write_simple,
)
from migronaut import IrreversibleMigrationError, MigrationFileNotFoundError
from migronaut.core.files import checksum_bytes

PROMPT = "Mark pending migration files as applied WITHOUT running them? [y/N] "


def snapshot(db: Any) -> tuple[Any, ...]:
    return (
        list(db[CHANGELOG].find({}, {"_id": 0}).sort("name", 1)),
        list(db[LOCKS].find({})),
        calls(db),
    )


@pytest.fixture
def existing(project: Any) -> Any:
    """Four migration files describing a schema the database already has."""
    write_simple(project, "0001_a", "0002_b", "0003_c", "0004_d")
    return project


def test_baseline_records_every_pending_file_in_one_batch_without_running_it(
    existing: Any, db: Any
) -> None:
    with make_migrator(existing, environment="staging") as migrator:
        events = Events(migrator)
        result = migrator.baseline()
    assert (result.baselined, result.skipped, result.batch) == (
        ["0001_a.py", "0002_b.py", "0003_c.py", "0004_d.py"], 0, 1)
    assert result.to_dict() == {"baselined": result.baselined, "skipped": 0, "batch": 1}
    assert calls(db) == [] and db["things"].count_documents({}) == 0
    run_id = events.of("run:start")[0]["runId"]
    for name, record in records(db).items():
        assert record["status"] == "applied" and record["origin"] == "baseline"
        assert record["batch"] == 1 and record["duration"] == 0
        assert record["checksum"] == checksum_bytes((existing.migrations / name).read_bytes())
        assert record["environment"] == "staging" and record["executedBy"]
        assert record["runId"] == run_id and record["appliedAt"] is not None
    assert events.names == ["run:start", "lock:acquired", "lock:released", "run:end"]
    end = events.of("run:end")[0]
    assert end["command"] == "baseline" and end["success"] is True
    assert events.of("run:start")[0]["command"] == "baseline"
    assert (end["baselined"], end["skipped"], end["total"]) == (4, 0, 4)
    assert db[LOCKS].count_documents({}) == 0


def test_baseline_to_is_inclusive_and_up_runs_the_rest(existing: Any, db: Any) -> None:
    with make_migrator(existing) as migrator:
        result = migrator.baseline("0002_b.py")
        assert (result.baselined, result.skipped, result.batch) == (
            ["0001_a.py", "0002_b.py"], 2, 1)
        assert [(r.file, r.batch) for r in migrator.up()] == [("0003_c.py", 2), ("0004_d.py", 2)]
    assert calls(db, "up") == ["0003_c", "0004_d"]


def test_baseline_is_re_runnable_and_adds_only_what_is_pending(existing: Any, db: Any) -> None:
    with make_migrator(existing) as migrator:
        migrator.up("0001_a.py")
        first = migrator.baseline("0003_c.py")
        assert (first.baselined, first.skipped, first.batch) == (
            ["0002_b.py", "0003_c.py"], 2, 2)
        stored = records(db)
        again = migrator.baseline("0003_c.py")
        assert (again.baselined, again.skipped, again.batch) == ([], 4, None)
        assert again.to_dict() == {"baselined": [], "skipped": 4, "batch": None}
        assert records(db) == stored
        write_simple(existing, "0005_e")
        last = migrator.baseline()
        assert (last.baselined, last.skipped, last.batch) == (["0004_d.py", "0005_e.py"], 3, 3)
    assert records(db)["0001_a.py"].get("origin") is None  # the applied one is left alone
    assert calls(db, "up") == ["0001_a"]


def test_baselined_records_are_forward_only(existing: Any, db: Any) -> None:
    with make_migrator(existing) as migrator:
        migrator.baseline("0002_b.py")
        migrator.up()
        migrator.down()  # the native batch reverts
        before = snapshot(db)
        for refuse in (
            lambda: migrator.down(),
            lambda: migrator.down("0001_a.py"),
            lambda: migrator.down(steps=1),
            lambda: migrator.redo(),
            lambda: migrator.redo("0002_b.py"),
            lambda: migrator.dry_run("down"),
        ):
            with pytest.raises(IrreversibleMigrationError) as info:
                refuse()
            assert info.value.exit_code == 13
            assert "(baselined)" in info.value.message
            assert snapshot(db) == before


def test_baseline_unknown_to_is_file_not_found(existing: Any, db: Any) -> None:
    with make_migrator(existing) as migrator, pytest.raises(MigrationFileNotFoundError) as info:
        migrator.baseline("0009_nowhere.py")
    assert info.value.exit_code == 8 and info.value.context["to"] == "0009_nowhere.py"
    assert db[CHANGELOG].count_documents({}) == 0
    assert db[LOCKS].count_documents({}) == 0


def test_baseline_dry_run_reads_only(existing: Any, db: Any) -> None:
    with make_migrator(existing) as migrator:
        events = Events(migrator)
        hold_lock(db)
        before = snapshot(db)
        result = migrator.baseline("0003_c.py", dry_run=True)
    assert (result.baselined, result.skipped, result.batch, result.dry_run) == (
        ["0001_a.py", "0002_b.py", "0003_c.py"], 1, 1, True)
    assert result.to_dict()["dryRun"] is True
    assert snapshot(db) == before and events.items == []


def test_nothing_to_baseline_in_an_empty_directory(project: Any, db: Any) -> None:
    with make_migrator(project) as migrator:
        result = migrator.baseline()
    assert (result.baselined, result.skipped, result.batch) == ([], 0, None)
    assert db[CHANGELOG].count_documents({}) == 0


# ---------------------------------------------------------------------------------- the CLI


def test_cli_baseline_with_yes(existing: Any, db: Any, cli: Any) -> None:
    result = cli("baseline", "--yes", "--to", "0002_b.py")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "✔ Baselined 2 migration(s) as applied (batch 1)\n"
    assert PROMPT not in result.stderr
    assert applied(db) == ["0001_a.py", "0002_b.py"]
    again = cli("baseline", "--yes", "--to", "0002_b.py", "--json")
    assert again.exit_code == 0
    assert again.json == {"baselined": [], "skipped": 4, "batch": None}
    assert "Nothing to baseline" in again.stderr


@pytest.mark.parametrize("answer", ["y\n", "YES\n"])
def test_cli_baseline_prompt_accepted(existing: Any, db: Any, cli: Any, answer: str) -> None:
    result = cli("baseline", input=answer)
    assert result.exit_code == 0, result.stderr
    assert PROMPT in result.stderr
    assert len(applied(db)) == 4 and calls(db) == []


@pytest.mark.parametrize("answer", ["n\n", "\n", "nope\n"])
def test_cli_baseline_prompt_declined_changes_nothing(
    existing: Any, db: Any, cli: Any, answer: str
) -> None:
    before = snapshot(db)
    result = cli("baseline", input=answer)
    assert result.exit_code == 0
    assert result.stdout == "Aborted\n"
    assert snapshot(db) == before


def test_cli_baseline_closed_stdin_exits_6(existing: Any, db: Any, cli: Any) -> None:
    before = snapshot(db)
    result = cli("baseline")
    assert result.exit_code == 6
    assert "✖ CONFIG_INVALID: stdin closed before the confirmation was answered" in (
        result.stderr)
    assert snapshot(db) == before


def test_cli_baseline_json_needs_yes_before_connecting(existing: Any, db: Any, cli: Any) -> None:
    before = snapshot(db)
    result = cli("baseline", "--json", "--uri", "mongodb://127.0.0.1:1/?"
                 "serverSelectionTimeoutMS=200")
    assert result.exit_code == 6
    assert result.json["error"]["code"] == "CONFIG_INVALID"
    assert "--json is non-interactive: pass --yes" in result.json["error"]["message"]
    assert snapshot(db) == before
    ok = cli("baseline", "--json", "--yes")
    assert ok.exit_code == 0 and ok.json["batch"] == 1 and len(ok.json["baselined"]) == 4


@pytest.mark.parametrize(
    ("args", "code", "exit_code", "message"),
    [
        (("--to", "0009_nowhere.py"), "MIGRATION_FILE_NOT_FOUND", 8,
         "Migration file not found: 0009_nowhere.py"),
        (("--to", "../0001_a.py"), "MIGRATION_INVALID_NAME", 19, "must be a bare filename"),
        (("--reason", ""), "CONFIG_INVALID", 6, "reason must be a non-empty string"),
    ],
)
def test_cli_baseline_bad_input(
    existing: Any, db: Any, cli: Any, args: tuple[str, ...], code: str, exit_code: int,
    message: str,
) -> None:
    before = snapshot(db)
    for mode in ((), ("--json",)):
        result = cli("baseline", "--yes", *args, *mode)
        assert result.exit_code == exit_code, result.stderr
        assert f"✖ {code}: " in result.stderr and message in result.stderr
        if mode:
            assert result.json["error"]["code"] == code
    assert snapshot(db) == before


def test_cli_baseline_dry_run_lists_and_needs_no_confirmation(
    existing: Any, db: Any, cli: Any
) -> None:
    before = snapshot(db)
    result = cli("baseline", "--dry-run", "--to", "0002_b.py")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [
        "◎ Dry-run  Would baseline 2 migration(s) as applied (batch 1)",
        "  0001_a.py",
        "  0002_b.py",
    ]
    as_json = cli("baseline", "--dry-run", "--json")
    assert as_json.exit_code == 0
    assert as_json.json["dryRun"] is True and len(as_json.json["baselined"]) == 4
    assert snapshot(db) == before


def test_cli_baseline_lock_held_exits_3(existing: Any, db: Any, cli: Any) -> None:
    hold_lock(db)
    before = snapshot(db)
    result = cli("baseline", "--yes", "--json")
    assert result.exit_code == 3
    assert result.json["error"]["code"] == "LOCK_ALREADY_HELD"
    assert snapshot(db) == before


def test_cli_down_of_a_baselined_record_exits_13(existing: Any, db: Any, cli: Any) -> None:
    assert cli("baseline", "--yes").exit_code == 0
    before = snapshot(db)
    for args in (("down",), ("redo",), ("down", "--steps", "2"), ("dry-run", "down")):
        result = cli(*args, "--json")
        assert result.exit_code == 13, (args, result.stderr)
        assert result.json["error"]["code"] == "MIGRATION_IRREVERSIBLE"
        assert "baselined" in result.json["error"]["message"]
    assert snapshot(db) == before
