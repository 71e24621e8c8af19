"""Migrations in doubt through the API: every entry point refuses with ``MIGRATION_IN_DOUBT``,
claims are given back or turned into ``failed`` records when a body fails, and ``resolve``
records the operator's decision (the process-level scenarios are in test_process_in_doubt.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import migronaut.core.changelog as changelog_module
from helpers.engine import (
    CHANGELOG,
    calls,
    make_migrator,
    records,
    server_now,
    write_simple,
)
from migronaut import (
    AsyncMigrator,
    ConfigInvalidError,
    MigrationInDoubtError,
    MigrationInvalidNameError,
    NotAppliedError,
    StateInvalidError,
    arun_migrations,
    run_migrations,
)
from migronaut.errors import EXIT_CODES

GONE_RUN = "run-that-is-gone"


def leave_in_doubt(db: Any, name: str, status: str = "running") -> None:
    """What a run killed in the middle of a body outside a transaction leaves behind."""
    previous = "applied" if status == "reverting" else None
    fields: dict[str, Any] = {"status": status, "intent": {
        "runId": GONE_RUN, "lockOwner": GONE_RUN, "host": "other-host", "pid": 4242,
        "direction": "up" if status == "running" else "down", "previous": previous,
        "startedAt": server_now(db), "record": {"batch": 7, "checksum": "c" * 64}}}
    if status == "reverting":
        fields.update({"batch": 3, "appliedAt": server_now(db), "checksum": "c" * 64})
    db[CHANGELOG].update_one({"name": name}, {"$set": fields}, upsert=True)


def assert_refused(error: MigrationInDoubtError, name: str) -> None:
    assert error.code == "MIGRATION_IN_DOUBT" and error.exit_code == 36
    assert error.context["name"] == name and error.context["runId"] == GONE_RUN
    assert error.context["host"] == "other-host" and error.context["pid"] == 4242
    assert error.context["alive"] is False
    assert f"migronaut resolve {name}" in error.message


def test_the_exit_code_is_ours_and_new() -> None:
    assert EXIT_CODES["MIGRATION_IN_DOUBT"] == 36
    assert sorted(EXIT_CODES.values()) == sorted(set(EXIT_CODES.values()))


def test_up_down_and_redo_refuse_and_run_nothing(project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    with make_migrator(project) as migrator:
        migrator.up("0001_a.py")
    leave_in_doubt(db, "0002_b.py")
    before = records(db)
    with make_migrator(project) as migrator:
        for run in (migrator.up, migrator.down, migrator.redo,
                    lambda: migrator.up("0001_a.py", force=True),
                    lambda: migrator.dry_run("up"), lambda: migrator.dry_run("down")):
            with pytest.raises(MigrationInDoubtError) as info:
                run()
            assert_refused(info.value, "0002_b.py")
        rows = {row.file: row for row in migrator.status()}
        assert rows["0002_b.py"].status == "in-doubt"
        assert rows["0002_b.py"].run_id == GONE_RUN and rows["0002_b.py"].direction == "up"
        assert [row.file for row in migrator.pending()] == ["0002_b.py"]
        assert [row.file for row in migrator.status("applied")] == ["0001_a.py"]
    assert calls(db) == ["0001_a"]
    assert records(db) == before


def test_the_async_api_and_run_migrations_surface_the_same_error(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    leave_in_doubt(db, "0001_a.py")
    settings = {"uri": project.uri, "db_name": project.db_name, "cwd": project.path,
                "env_file": False}

    async def with_async_migrator() -> None:
        async with AsyncMigrator(**settings) as migrator:
            await migrator.up()

    for call in (lambda: asyncio.run(with_async_migrator()),
                 lambda: asyncio.run(arun_migrations(**settings)),
                 lambda: run_migrations(**settings),
                 lambda: run_migrations(on_lock_held="wait", **settings)):
        with pytest.raises(MigrationInDoubtError) as info:
            call()
        assert_refused(info.value, "0001_a.py")
    assert calls(db) == []


def test_a_down_whose_outcome_is_not_recorded_stays_reverting_until_resolved(
    project: Any, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project) as migrator:
        migrator.up()

    def cut(self: Any, change: Any, status: str) -> bool:
        raise RuntimeError("changelog unavailable")

    with monkeypatch.context() as patch:
        patch.setattr(changelog_module.Changelog, "finish", cut)
        with make_migrator(project) as migrator, pytest.raises(Exception) as failed:
            migrator.down()
    assert failed.value.context["phase"] == "changelog-write"
    assert calls(db, "down") == ["0001_a"]
    record = records(db)["0001_a.py"]
    assert record["status"] == "reverting" and record["intent"]["previous"] == "applied"
    with make_migrator(project) as migrator:
        with pytest.raises(MigrationInDoubtError) as info:
            migrator.down()
        assert info.value.context["direction"] == "down"
        assert [row.status for row in migrator.status()] == ["in-doubt"]
        done = migrator.resolve("0001_a.py", applied=False, reason="the data is gone")
        assert (done.status, done.previous, done.run_id) == (
            "reverted", "reverting", record["intent"]["runId"])
        assert [row.status for row in migrator.status()] == ["pending"]
    record = records(db)["0001_a.py"]
    assert record["status"] == "reverted" and "intent" not in record
    assert record["resolution"]["as"] == "pending"


def test_resolving_a_running_record_applied_writes_what_its_run_meant_to(
    project: Any, db: Any
) -> None:
    write_simple(project, "0001_a")
    leave_in_doubt(db, "0001_a.py")
    with make_migrator(project) as migrator:
        done = migrator.resolve("0001_a.py", applied=True, reason="checked: the body ran",
                                requested_by="ops")
        assert (done.status, done.resolved_as) == ("applied", "applied")
        assert migrator.up() == []
    record = records(db)["0001_a.py"]
    assert record["status"] == "applied" and "intent" not in record
    assert (record["batch"], record["checksum"]) == (7, "c" * 64)
    assert record["appliedAt"] is not None and record["firstAppliedAt"] is not None
    assert record["resolution"]["by"] == "ops"
    assert record["resolution"]["intent"]["runId"] == GONE_RUN
    assert calls(db) == []


def test_resolving_a_running_record_pending_lets_up_run_it(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    leave_in_doubt(db, "0001_a.py")
    with make_migrator(project) as migrator:
        done = migrator.resolve("0001_a.py", applied=False, reason="nothing was written")
        assert done.status == "failed"
        assert [row.status for row in migrator.status()] == ["failed"]
        assert [r.status for r in migrator.up()] == ["applied"]
    assert calls(db) == ["0001_a"]


def test_resolve_refuses_bad_input_and_writes_nothing(project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    with make_migrator(project) as migrator:
        migrator.up("0002_b.py")
    leave_in_doubt(db, "0001_a.py")
    before = records(db)
    with make_migrator(project) as migrator:
        cases: list[tuple[Any, type[Exception], str]] = [
            (lambda: migrator.resolve("0001_a.py", applied=True, reason=""),
             ConfigInvalidError, "resolve needs --reason"),
            (lambda: migrator.resolve("0001_a.py", applied=True, reason=None),  # type: ignore
             ConfigInvalidError, "resolve needs --reason"),
            (lambda: migrator.resolve("0002_b.py", applied=True, reason="x"),
             NotAppliedError, "Migration 0002_b.py is not in doubt (applied)"),
            (lambda: migrator.resolve("0003_c.py", applied=True, reason="x"),
             NotAppliedError, "Migration 0003_c.py is not in doubt (no record)"),
            (lambda: migrator.resolve({"$ne": None}, applied=True, reason="x"),  # type: ignore
             MigrationInvalidNameError, "Invalid migration name"),
        ]
        for call, kind, message in cases:
            with pytest.raises(kind) as info:
                call()
            assert info.value.message.startswith(message), info.value.message
    assert records(db) == before


def test_a_failed_body_gives_its_claim_back(project: Any, db: Any) -> None:
    """A failed up becomes ``failed`` (as before); a failed revert or forced re-run leaves the
    record applied, as it was — no claim stays behind a body that is known to have failed."""
    project.write_migration("0001_a", "def up(ctx):\n    pass\n\n"
                                      "def down(ctx):\n    raise RuntimeError('no down')\n")
    project.write_migration("0002_b", "def up(ctx):\n    raise RuntimeError('broken')\n\n"
                                      "def down(ctx):\n    pass\n")
    with make_migrator(project) as migrator:
        migrator.up("0001_a.py")
        with pytest.raises(Exception, match="broken"):
            migrator.up()
        assert records(db)["0002_b.py"]["status"] == "failed"
        applied = records(db)["0001_a.py"]
        with pytest.raises(Exception, match="no down"):
            migrator.down()
    project.write_migration("0001_a", "def up(ctx):\n    raise RuntimeError('again')\n\n"
                                      "def down(ctx):\n    pass\n")
    with make_migrator(project) as migrator, pytest.raises(Exception, match="again"):
        migrator.up("0001_a.py", force=True)
    after = records(db)
    assert after["0001_a.py"] == applied
    assert all("intent" not in r for r in after.values())


def test_a_running_record_without_its_intent_is_state_invalid(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    db[CHANGELOG].insert_one({"name": "0001_a.py", "status": "running"})
    with make_migrator(project) as migrator:
        for call in (migrator.status, migrator.up):
            with pytest.raises(StateInvalidError) as info:
                call()
            assert "is running but has no intent naming its run" in info.value.message
