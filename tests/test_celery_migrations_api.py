"""The Migrator options a queue needs to split one run into single-file runs (reference core
§11.7): ``up(file, ordered=True)``, ``down(file, ordered=True)``, a shared ``batch``, a planned
``checksum`` — and ``plan_sequence``, the plan a producer sends as one job per migration."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest

from migronaut import (
    AsyncMigrator,
    BackgroundPendingError,
    ChecksumMismatchError,
    ConfigInvalidError,
    MigrationBlockedError,
    MigrationFileNotFoundError,
    Migrator,
    OutOfOrderMigrationError,
)

A, B, C = "20240101000000_a.py", "20240102000000_b.py", "20240103000000_c.py"


def _write(project: Any, *names: str, fail: str | None = None) -> None:
    for name in names:
        body = "raise RuntimeError('boom')" if name == fail else "pass"
        project.write_migration(name, f"""\
            def up(ctx):
                ctx.db.marks.insert_one({{"name": {name!r}}})
                {body}

            def down(ctx):
                ctx.db.marks.delete_one({{"name": {name!r}}})
            """)


def _records(db: Any) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in db["_migronaut_migrations"].find({}, {"_id": 0})}


def _subset(context: dict[str, Any]) -> dict[str, Any]:
    return {k: context[k] for k in ("name", "direction", "blockedBy", "failed")}


def _sha(project: Any, name: str) -> str:
    return hashlib.sha256((project.migrations / name).read_bytes()).hexdigest()


def test_ordered_single_file_runs_share_one_batch(project: Any, db: Any) -> None:
    _write(project, A, B, C)
    with Migrator(cwd=project.path) as migrator:
        batch = migrator.next_batch()
        for name in (A, B, C):
            rows = migrator.up(name, ordered=True, batch=batch, checksum=_sha(project, name))
            assert [(r.file, r.status, r.batch) for r in rows] == [(name, "applied", batch)]
        assert migrator.next_batch() == batch + 1
        # the three single-file runs form one rollback unit, like a bulk up
        assert [r.file for r in migrator.down()] == [C, B, A]
    assert {r["status"] for r in _records(db).values()} == {"reverted"}


def test_ordered_up_refuses_while_an_earlier_file_is_pending(project: Any, db: Any) -> None:
    _write(project, A, B, C, fail=A)
    with Migrator(cwd=project.path) as migrator:
        with pytest.raises(MigrationBlockedError) as blocked:
            migrator.up(C, ordered=True)
        assert blocked.value.context["blockedBy"] == [A, B]
        assert blocked.value.context["failed"] == []
        assert blocked.value.exit_code == 24
        assert _records(db) == {}  # nothing half-written
        with pytest.raises(Exception, match="boom"):
            migrator.up(A, ordered=True)
        with pytest.raises(MigrationBlockedError) as blocked:
            migrator.up(B, ordered=True)
        assert _subset(blocked.value.context) == {"name": B, "direction": "up",
                                                  "blockedBy": [A], "failed": [A]}
        assert db.marks.count_documents({"name": B}) == 0
        # unordered, a single-file run is exempt (reference core §11.9)
        assert migrator.up(B)[0].status == "applied"


def test_ordered_up_applies_the_out_of_order_rule_of_a_bulk_up(project: Any, db: Any) -> None:
    _write(project, A, C)
    with Migrator(cwd=project.path, on_out_of_order="error") as migrator:
        migrator.up()
        _write(project, B)  # merged late: sorts before the newest applied one
        with pytest.raises(OutOfOrderMigrationError) as late:
            migrator.up(B, ordered=True)
        assert (late.value.context["names"], late.value.context["newestApplied"]) == ([B], C)
        assert B not in _records(db)
        assert migrator.up(B)[0].status == "applied"  # unordered: exempt


def test_ordered_up_of_an_applied_file_skips_it(project: Any) -> None:
    _write(project, A, B)
    with Migrator(cwd=project.path) as migrator:
        migrator.up()
        assert [r.status for r in migrator.up(A, ordered=True)] == ["skipped"]


def test_ordered_up_of_a_file_outside_the_sequence_is_not_found(project: Any) -> None:
    _write(project, A)
    project.write("migrations/notes.txt", "x")
    with Migrator(cwd=project.path) as migrator, pytest.raises(MigrationFileNotFoundError):
        migrator.up("notes.txt", ordered=True)


def test_a_planned_checksum_pins_the_file(project: Any, db: Any) -> None:
    _write(project, A)
    planned = "0" * 64
    with Migrator(cwd=project.path) as migrator, \
            pytest.raises(ChecksumMismatchError) as caught:
        migrator.up(A, ordered=True, checksum=planned)
    assert {k: caught.value.context[k] for k in ("name", "expected", "actual", "planned")} == {
        "name": A, "expected": planned, "actual": _sha(project, A), "planned": True}
    assert (caught.value.code, caught.value.exit_code) == ("CHECKSUM_MISMATCH", 4)
    assert _records(db) == {} and db.marks.count_documents({}) == 0


@pytest.mark.parametrize(("options", "words"), [
    ({"ordered": True}, "ordered requires a migration file"),
    ({"ordered": "yes", "file": A}, "ordered must be a boolean"),
    ({"checksum": "a" * 64}, "checksum requires a migration file"),
    ({"checksum": "XYZ", "file": A}, "64 lower-case hex"),
])
def test_bad_sequencing_options_are_config_invalid(project: Any, db: Any,
                                                   options: dict[str, Any], words: str) -> None:
    _write(project, A)
    file = options.pop("file", None)
    with Migrator(cwd=project.path) as migrator, pytest.raises(ConfigInvalidError) as caught:
        migrator.up(file, **options)
    assert words in caught.value.message
    assert caught.value.exit_code == 6
    assert _records(db) == {}


def test_ordered_down_reverts_only_the_newest_applied(project: Any, db: Any) -> None:
    _write(project, A, B)
    with Migrator(cwd=project.path) as migrator:
        migrator.up(A)
        migrator.up(B)
        with pytest.raises(MigrationBlockedError) as blocked:
            migrator.down(A, ordered=True)
        assert _subset(blocked.value.context) == {"name": A, "direction": "down",
                                                  "blockedBy": [B], "failed": []}
        assert _records(db)[A]["status"] == "applied"
        assert [r.file for r in migrator.down(B, ordered=True)] == [B]
        assert [r.file for r in migrator.down(A, ordered=True)] == [A]
        with pytest.raises(ConfigInvalidError, match="ordered requires a migration file"):
            migrator.down(ordered=True)


def test_plan_sequence_lists_what_a_bulk_up_would_run(project: Any, db: Any) -> None:
    _write(project, A, B, C)
    with Migrator(cwd=project.path) as migrator:
        migrator.up(A)
        plan = migrator.plan_sequence()
        assert [(r.migration, r.checksum) for r in plan.runs] == [
            (B, _sha(project, B)), (C, _sha(project, C))]
        assert plan.batch == migrator.next_batch() and plan.waiting is None
        assert [r.migration for r in migrator.plan_sequence(to=B).runs] == [B]
        assert migrator.plan_sequence(A).runs == []
        with pytest.raises(MigrationBlockedError):
            migrator.plan_sequence(C)
    assert set(_records(db)) == {A}  # read-only


def test_plan_sequence_marks_an_unchanged_failed_file(project: Any) -> None:
    _write(project, A, fail=A)
    with Migrator(cwd=project.path) as migrator:
        with pytest.raises(Exception, match="boom"):
            migrator.up()
        assert [r.failed for r in migrator.plan_sequence().runs] == [True]
        _write(project, A)  # fixed
        assert [r.failed for r in migrator.plan_sequence().runs] == [False]


def test_plan_sequence_stops_before_a_migration_waiting_for_background(project: Any) -> None:
    _write(project, A)
    project.write_migration(B, """\
        requires = ["20240101500000_bg.py"]

        def up(ctx):
            pass

        def down(ctx):
            pass
        """)
    with Migrator(cwd=project.path) as migrator:
        plan = migrator.plan_sequence()
        assert [r.migration for r in plan.runs] == [A]
        assert plan.waiting == {"migration": B, "waitsFor": [
            {"migration": "20240101500000_bg.py", "status": "unregistered"}]}
        migrator.up(A)
        with pytest.raises(BackgroundPendingError) as pending:
            migrator.plan_sequence(B)
        assert pending.value.context["migration"] == B


def test_the_async_migrator_takes_the_same_options(project: Any, db: Any) -> None:
    _write(project, A, B)

    async def scenario() -> None:
        async with AsyncMigrator(cwd=project.path) as migrator:
            plan = await migrator.plan_sequence()
            for run in plan.runs:
                await migrator.up(run.migration, ordered=True, batch=plan.batch,
                                  checksum=run.checksum)
            with pytest.raises(MigrationBlockedError):
                await migrator.down(A, ordered=True)
            await migrator.down(B, ordered=True)

    asyncio.run(scenario())
    records = _records(db)
    assert (records[A]["status"], records[B]["status"]) == ("applied", "reverted")
    assert records[A]["batch"] == records[B]["batch"]


def test_the_cli_reverts_a_batch_built_from_single_file_runs(project: Any, db: Any,
                                                              cli: Any) -> None:
    _write(project, A, B, C)
    with Migrator(cwd=project.path) as migrator:
        migrator.up(A)
        batch = migrator.next_batch()
        for name in (B, C):
            migrator.up(name, ordered=True, batch=batch)
    result = cli("down", "--batch", str(batch), "--json")
    assert result.exit_code == 0, result.stderr
    assert [row["file"] for row in result.json] == [C, B]
    assert {n: r["status"] for n, r in _records(db).items()} == {
        A: "applied", B: "reverted", C: "reverted"}
