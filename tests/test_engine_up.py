"""``up`` against a server: batches, named files, ``to``, out-of-order, strict drift, force."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.engine import (
    CHANGELOG,
    LOCKS,
    applied,
    calls,
    captured_logger,
    make_migrator,
    recording_body,
    records,
    write_simple,
)
from migronaut import (
    ChecksumMismatchError,
    MigrationFileNotFoundError,
    MigrationInvalidNameError,
    OutOfOrderMigrationError,
)


def test_bulk_up_applies_everything_in_name_order_in_one_batch(project: Any, db: Any) -> None:
    write_simple(project, "0003_c", "0001_a", "0002_b")
    with make_migrator(project) as migrator:
        results = migrator.up()
    assert [(r.file, r.status, r.batch) for r in results] == [
        ("0001_a.py", "applied", 1),
        ("0002_b.py", "applied", 1),
        ("0003_c.py", "applied", 1),
    ]
    assert all(isinstance(r.duration, int) and r.duration >= 0 for r in results)
    assert calls(db) == ["0001_a", "0002_b", "0003_c"]
    assert {r["batch"] for r in records(db).values()} == {1}
    assert db[LOCKS].count_documents({}) == 0  # released


def test_second_up_does_nothing_and_a_new_file_gets_the_next_batch(project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    with make_migrator(project) as migrator:
        migrator.up()
        assert migrator.up() == []
        write_simple(project, "0003_c")
        results = migrator.up()
    assert [(r.file, r.batch) for r in results] == [("0003_c.py", 2)]
    assert calls(db) == ["0001_a", "0002_b", "0003_c"]


def test_step_gives_each_file_its_own_consecutive_batch(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project) as migrator:
        migrator.up()
        write_simple(project, "0002_b", "0003_c", "0004_d")
        results = migrator.up(step=True)
    assert [(r.file, r.batch) for r in results] == [
        ("0002_b.py", 2),
        ("0003_c.py", 3),
        ("0004_d.py", 4),
    ]
    assert {n: r["batch"] for n, r in records(db).items()} == {
        "0001_a.py": 1,
        "0002_b.py": 2,
        "0003_c.py": 3,
        "0004_d.py": 4,
    }


def test_named_file_applies_only_that_file(project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b", "0003_c")
    with make_migrator(project) as migrator:
        results = migrator.up("0002_b.py")
        assert [(r.file, r.status) for r in results] == [("0002_b.py", "applied")]
        assert applied(db) == ["0002_b.py"]
        # a single-file run is exempt from the out-of-order policy
        with make_migrator(project, on_out_of_order="error") as strict_order:
            assert [r.file for r in strict_order.up("0001_a.py")] == ["0001_a.py"]


def test_named_file_must_exist(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project) as migrator:
        with pytest.raises(MigrationFileNotFoundError) as info:
            migrator.up("0009_missing.py")
        assert info.value.context["filename"] == "0009_missing.py"
        assert info.value.exit_code == 8
        with pytest.raises(MigrationInvalidNameError):
            migrator.up("../migrations/0001_a.py")
    assert db[CHANGELOG].count_documents({}) == 0
    assert calls(db) == []


def test_to_is_inclusive_and_idempotent_once_applied(project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b", "0003_c", "0004_d")
    with make_migrator(project) as migrator:
        assert [r.file for r in migrator.up(to="0002_b.py")] == ["0001_a.py", "0002_b.py"]
        assert migrator.up(to="0002_b.py") == []  # already applied → nothing
        assert migrator.up(to="0001_a.py") == []
        assert applied(db) == ["0001_a.py", "0002_b.py"]
        assert [r.file for r in migrator.up(to="0003_c.py")] == ["0003_c.py"]
        with pytest.raises(MigrationFileNotFoundError) as info:
            migrator.up(to="0099_nope.py")
        assert info.value.context["to"] == "0099_nope.py"
    assert applied(db) == ["0001_a.py", "0002_b.py", "0003_c.py"]


@pytest.fixture
def late_file(project: Any, db: Any) -> Any:
    """0002 applied, then 0001 (late-merged) and 0003 pending."""
    write_simple(project, "0002_b")
    with make_migrator(project) as migrator:
        migrator.up()
    write_simple(project, "0001_a", "0003_c")
    return project


def test_out_of_order_warn_applies_with_a_warning(late_file: Any, db: Any) -> None:
    with captured_logger() as (logger, handler), make_migrator(late_file, logger=logger) as m:
        assert [r.file for r in m.up()] == ["0001_a.py", "0003_c.py"]
    warning = next(msg for msg in handler.messages if "Out-of-order" in msg)
    assert "0001_a.py" in warning and "0002_b.py" in warning and "0003_c.py" not in warning


def test_out_of_order_error_refuses_before_anything_runs(late_file: Any, db: Any) -> None:
    with (
        make_migrator(late_file, on_out_of_order="error") as migrator,
        pytest.raises(OutOfOrderMigrationError) as info,
    ):
        migrator.up()
    assert info.value.context["names"] == ["0001_a.py"]
    assert info.value.context["newestApplied"] == "0002_b.py"
    assert info.value.exit_code == 23
    assert applied(db) == ["0002_b.py"]
    assert calls(db) == ["0002_b"]
    assert db[LOCKS].count_documents({}) == 0


def test_out_of_order_allow_is_silent(late_file: Any, db: Any) -> None:
    with (
        captured_logger() as (logger, handler),
        make_migrator(late_file, on_out_of_order="allow", logger=logger) as migrator,
    ):
        assert [r.file for r in migrator.up()] == ["0001_a.py", "0003_c.py"]
    assert not handler.has("Out-of-order")


@pytest.fixture
def drifted(project: Any, db: Any) -> Any:
    """0001 applied then edited on disk; 0002 pending."""
    write_simple(project, "0001_a")
    with make_migrator(project) as migrator:
        migrator.up()
    path = project.migrations / "0001_a.py"
    path.write_text(path.read_text() + "\n# edited after it was applied\n")
    write_simple(project, "0002_b")
    return project


@pytest.mark.parametrize("how", ["argument", "config", "env"])
def test_strict_drift_aborts_before_anything_runs(
    drifted: Any, db: Any, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kwargs: dict[str, Any] = {}
    if how == "config":
        kwargs["strict"] = True
    elif how == "env":
        monkeypatch.setenv("MIGRONAUT_STRICT", "yes")
    with make_migrator(drifted, **kwargs) as migrator, pytest.raises(ChecksumMismatchError) as info:
        migrator.up(strict=True) if how == "argument" else migrator.up()
    error = info.value
    assert error.exit_code == 4
    assert error.context["name"] == "0001_a.py"
    assert error.context["expected"] == records(db)["0001_a.py"]["checksum"]
    assert error.context["actual"] != error.context["expected"]
    assert applied(db) == ["0001_a.py"]
    assert calls(db) == ["0001_a"]  # 0002 never ran
    assert db[LOCKS].count_documents({}) == 0


def test_non_strict_bulk_up_ignores_drift(drifted: Any, db: Any) -> None:
    with captured_logger() as (logger, handler), make_migrator(drifted, logger=logger) as m:
        assert [r.file for r in m.up()] == ["0002_b.py"]
    assert not handler.has("Checksum mismatch")


def test_a_missing_applied_file_is_ignored_by_strict_checks(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project) as migrator:
        migrator.up()
    (project.migrations / "0001_a.py").unlink()
    write_simple(project, "0002_b")
    with make_migrator(project, strict=True) as migrator:
        assert [r.file for r in migrator.up()] == ["0002_b.py"]


def test_named_applied_file_is_skipped(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project) as migrator:
        migrator.up()
        events: list[dict[str, Any]] = []
        migrator.on("migration:skipped", events.append)
        results = migrator.up("0001_a.py")
    assert [r.to_dict() for r in results] == [
        {"file": "0001_a.py", "status": "skipped", "reason": "Already applied"}
    ]
    assert events[0]["reason"] == "already-applied" and events[0]["migration"] == "0001_a.py"
    assert calls(db) == ["0001_a"]


def test_named_drifted_file_is_skipped_with_a_warning_or_refused_under_strict(
    drifted: Any, db: Any
) -> None:
    with captured_logger() as (logger, handler), make_migrator(drifted, logger=logger) as m:
        results = m.up("0001_a.py")
    assert [r.status for r in results] == ["skipped"]
    assert handler.has("Checksum mismatch: 0001_a.py")
    with (
        make_migrator(drifted, strict=True) as migrator,
        pytest.raises(ChecksumMismatchError) as info,
    ):
        migrator.up("0001_a.py")
    assert info.value.context["name"] == "0001_a.py"
    assert calls(db) == ["0001_a"]


def test_force_reruns_an_applied_file_in_a_new_batch(drifted: Any, db: Any) -> None:
    before = records(db)["0001_a.py"]
    with (
        captured_logger() as (logger, handler),
        make_migrator(drifted, strict=True, logger=logger) as migrator,
    ):
        results = migrator.up("0001_a.py", force=True)
    assert [(r.file, r.status, r.batch) for r in results] == [("0001_a.py", "applied", 2)]
    assert handler.has("Forcing")
    after = records(db)["0001_a.py"]
    assert after["batch"] == 2 and after["status"] == "applied"
    assert after["firstAppliedAt"] == before["firstAppliedAt"]
    assert after["appliedAt"] >= before["appliedAt"]
    assert after["checksum"] != before["checksum"]  # the edited file's checksum is stored
    assert after["runId"] != before["runId"]
    assert calls(db) == ["0001_a", "0001_a"]
    assert db[CHANGELOG].count_documents({"name": "0001_a.py"}) == 1


def test_an_explicit_batch_label(project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    with make_migrator(project) as migrator:
        migrator.up("0001_a.py", batch=7)
        migrator.up("0002_b.py", batch=7)
        assert migrator.next_batch() == 8
    assert {r["batch"] for r in records(db).values()} == {7}


def test_up_with_an_empty_migrations_directory(project: Any, db: Any) -> None:
    # a directory that does not exist is CONFIG_INVALID (tests/test_preflight.py)
    with make_migrator(project) as migrator:
        assert migrator.up() == []
        assert migrator.status() == []


def test_migration_context(project: Any, db: Any) -> None:
    project.write_migration(
        "0001_ctx",
        """
        def up(ctx):
            ctx.db["ctx"].insert_one({
                "db": ctx.db.name,
                "same_client": ctx.db.client is ctx.client,
                "session": ctx.session is not None,
                "cancelled": ctx.cancellation.cancelled,
                "run_id": ctx.run.id,
                "direction": ctx.run.direction,
                "migration": ctx.run.migration,
                "batch": ctx.run.batch,
                "requested_by": ctx.run.requested_by,
                "reason": ctx.run.reason,
                "lock_owner": ctx.db["_migronaut_locks"].find_one()["owner"],
            })
            ctx.logger.info("hello from the migration")

        def down(ctx):
            pass
    """,
    )
    with captured_logger() as (logger, handler), make_migrator(project, logger=logger) as m:
        m.up(requested_by="ci-bot", reason="release 7")
    doc = db["ctx"].find_one({}, {"_id": 0})
    record = records(db)["0001_ctx.py"]
    assert doc == {
        "db": project.db_name,
        "same_client": True,
        "session": False,
        "cancelled": False,
        "run_id": record["runId"],
        "direction": "up",
        "migration": "0001_ctx.py",
        "batch": 1,
        "requested_by": "ci-bot",
        "reason": "release 7",
        "lock_owner": record["runId"],
    }
    line = next(r for r in handler.records if r.getMessage() == "hello from the migration")
    assert line.migration == "0001_ctx.py" and line.runId == record["runId"]  # type: ignore[attr-defined]


def test_async_migration_bodies_are_awaited(project: Any, db: Any) -> None:
    project.write_migration(
        "0001_async",
        """
        import asyncio

        async def up(ctx):
            await asyncio.sleep(0)
            await ctx.db["things"].insert_one({"m": "async"})  # async colour: AsyncDatabase

        async def down(ctx):
            await asyncio.sleep(0)
            await ctx.db["things"].delete_many({"m": "async"})
    """,
    )
    with make_migrator(project) as migrator:
        migrator.up()
        assert db["things"].count_documents({"m": "async"}) == 1
        migrator.down()
        assert db["things"].count_documents({"m": "async"}) == 0


def test_custom_collections(project: Any, db: Any) -> None:
    project.write_migration("0001_a", recording_body("0001_a"))
    with make_migrator(
        project, migrations_collection="_seeds", lock_collection="_seed_locks"
    ) as migrator:
        migrator.up()
    assert db["_seeds"].count_documents({"status": "applied"}) == 1
    assert db[CHANGELOG].count_documents({}) == 0
    assert sorted(i for i in db["_seeds"].index_information() if i != "_id_") == sorted(
        ["name_unique", "status_batch", "batch", "status_name", "status_appliedAt_name"]
    )
