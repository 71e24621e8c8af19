"""``down``, ``redo``, ``dry_run``, ``status`` and ``pending`` against a server."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from helpers.engine import (
    CHANGELOG,
    LOCKS,
    Events,
    applied,
    calls,
    make_migrator,
    records,
    write_simple,
)
from migronaut import (
    ConfigInvalidError,
    IrreversibleMigrationError,
    NotAppliedError,
    pending_migrations,
)


@pytest.fixture
def two_batches(project: Any, db: Any) -> Any:
    """Batch 1: 0001, 0002; batch 2: 0003, 0004; 0005 pending."""
    write_simple(project, "0001_a", "0002_b")
    with make_migrator(project) as migrator:
        migrator.up()
        write_simple(project, "0003_c", "0004_d")
        migrator.up()
    write_simple(project, "0005_e")
    db["calls"].delete_many({})
    return project


def test_down_reverts_the_last_batch_newest_name_first(two_batches: Any, db: Any) -> None:
    with make_migrator(two_batches) as migrator:
        results = migrator.down()
    assert [(r.file, r.status) for r in results] == [
        ("0004_d.py", "reverted"),
        ("0003_c.py", "reverted"),
    ]
    assert calls(db, "down") == ["0004_d", "0003_c"]
    assert applied(db) == ["0001_a.py", "0002_b.py"]
    assert {records(db)[n]["status"] for n in ("0003_c.py", "0004_d.py")} == {"reverted"}
    assert db["things"].count_documents({"m": {"$in": ["0003_c", "0004_d"]}}) == 0


def test_down_file(two_batches: Any, db: Any) -> None:
    with make_migrator(two_batches) as migrator:
        assert [r.file for r in migrator.down("0002_b.py")] == ["0002_b.py"]
    assert applied(db) == ["0001_a.py", "0003_c.py", "0004_d.py"]


@pytest.mark.parametrize("name", ["0005_e.py", "0009_nowhere.py"])
def test_down_file_that_is_not_applied(two_batches: Any, db: Any, name: str) -> None:
    with make_migrator(two_batches) as migrator, pytest.raises(NotAppliedError) as info:
        migrator.down(name)
    assert info.value.context["filename"] == name and info.value.exit_code == 9
    assert calls(db) == []


def test_down_batch(two_batches: Any, db: Any) -> None:
    with make_migrator(two_batches) as migrator:
        assert [r.file for r in migrator.down(batch=1)] == ["0002_b.py", "0001_a.py"]
        assert migrator.down(batch=1) == []  # nothing applied in batch 1 any more
    assert applied(db) == ["0003_c.py", "0004_d.py"]


def test_down_to_is_exclusive(two_batches: Any, db: Any) -> None:
    with make_migrator(two_batches) as migrator:
        results = migrator.down(to="0002_b.py")
        assert [r.file for r in results] == ["0004_d.py", "0003_c.py"]
        assert applied(db) == ["0001_a.py", "0002_b.py"]
        with pytest.raises(NotAppliedError) as info:
            migrator.down(to="0004_d.py")
        assert info.value.context == {"to": "0004_d.py", "results": []}


def test_down_steps_follows_applied_at_and_preserves_that_order(two_batches: Any, db: Any) -> None:
    # Applied order by time, deliberately unlike name order: 0001, 0004, 0002, 0003.
    base = dt.datetime(2026, 1, 1)
    for minute, name in enumerate(["0001_a.py", "0004_d.py", "0002_b.py", "0003_c.py"]):
        db[CHANGELOG].update_one(
            {"name": name}, {"$set": {"appliedAt": base + dt.timedelta(minutes=minute)}}
        )
    with make_migrator(two_batches) as migrator:
        results = migrator.down(steps=3)
    assert [r.file for r in results] == ["0003_c.py", "0002_b.py", "0004_d.py"]
    assert calls(db, "down") == ["0003_c", "0002_b", "0004_d"]
    assert applied(db) == ["0001_a.py"]  # batches are ignored by --steps


def test_down_steps_ties_break_on_name_descending(two_batches: Any, db: Any) -> None:
    same = dt.datetime(2026, 1, 1)
    db[CHANGELOG].update_many({}, {"$set": {"appliedAt": same}})
    with make_migrator(two_batches) as migrator:
        assert [r.file for r in migrator.down(steps=2)] == ["0004_d.py", "0003_c.py"]


def test_nothing_to_rollback(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project) as migrator:
        assert migrator.down() == []
        assert migrator.redo() == []
    assert db[CHANGELOG].count_documents({}) == 0


@pytest.mark.parametrize(
    "kwargs", [{"steps": 0}, {"batch": -1}, {"steps": 1, "batch": 1}, {"file": "a.py", "to": "b"}]
)
def test_bad_down_options_are_refused_before_anything(
    two_batches: Any, db: Any, kwargs: dict[str, Any]
) -> None:
    with make_migrator(two_batches) as migrator:
        events = Events(migrator)
        with pytest.raises(ConfigInvalidError):
            migrator.down(**kwargs)
    assert events.items == []
    assert calls(db) == []


@pytest.mark.parametrize("origin", ["baseline", "migrate-mongo"])
def test_forward_only_records_refuse_the_whole_rollback(
    two_batches: Any, db: Any, origin: str
) -> None:
    db[CHANGELOG].update_one({"name": "0003_c.py"}, {"$set": {"origin": origin}})
    before = records(db)
    with make_migrator(two_batches) as migrator:
        events = Events(migrator)
        for attempt in (
            lambda: migrator.down(),
            lambda: migrator.down(steps=4),
            lambda: migrator.down("0003_c.py"),
            lambda: migrator.redo("0003_c.py"),
            lambda: migrator.dry_run("down"),
        ):
            with pytest.raises(IrreversibleMigrationError) as info:
                attempt()
            assert info.value.context["names"] == ["0003_c.py"]
            assert info.value.exit_code == 13
    assert records(db) == before  # nothing touched, 0004 (same batch) still applied
    assert calls(db) == []
    assert "migration:start" not in events.names
    assert db[LOCKS].count_documents({}) == 0


def test_forward_only_records_outside_the_selection_do_not_block(two_batches: Any, db: Any) -> None:
    db[CHANGELOG].update_one({"name": "0001_a.py"}, {"$set": {"origin": "baseline"}})
    with make_migrator(two_batches) as migrator:
        assert [r.file for r in migrator.down()] == ["0004_d.py", "0003_c.py"]


def test_redo_reverts_and_reapplies_the_newest_in_a_new_batch(two_batches: Any, db: Any) -> None:
    newest = dt.datetime(2030, 1, 1)
    db[CHANGELOG].update_one({"name": "0002_b.py"}, {"$set": {"appliedAt": newest}})
    before = records(db)["0002_b.py"]
    with make_migrator(two_batches) as migrator:
        results = migrator.redo()
    assert [(r.file, r.status) for r in results] == [
        ("0002_b.py", "reverted"),
        ("0002_b.py", "applied"),
    ]
    assert results[1].batch == 3
    after = records(db)["0002_b.py"]
    assert after["status"] == "applied" and after["batch"] == 3
    assert after["firstAppliedAt"] == before["firstAppliedAt"]
    assert "revertedAt" not in after
    assert calls(db) == ["0002_b", "0002_b"]
    assert [c["dir"] for c in db["calls"].find().sort("_id", 1)] == ["down", "up"]


def test_redo_file_and_redo_of_unapplied_file(two_batches: Any, db: Any) -> None:
    with make_migrator(two_batches) as migrator:
        assert [r.status for r in migrator.redo("0001_a.py")] == ["reverted", "applied"]
        with pytest.raises(NotAppliedError):
            migrator.redo("0005_e.py")


def test_redo_holds_one_lock_across_both_halves(two_batches: Any, db: Any) -> None:
    with make_migrator(two_batches) as migrator:
        events = Events(migrator)
        migrator.redo()
    assert events.names.count("lock:acquired") == 1
    assert events.names.count("lock:released") == 1
    assert events.of("run:start")[0]["command"] == "redo"


# ----------------------------------------------------------------------- read-only paths


def snapshot(db: Any) -> dict[str, list[dict[str, Any]]]:
    return {name: list(db[name].find()) for name in sorted(db.list_collection_names())}


def test_dry_run_previews_without_lock_writes_or_events(two_batches: Any, db: Any) -> None:
    write_simple(two_batches, "0006_f")
    before = snapshot(db)
    with make_migrator(two_batches) as migrator:
        events = Events(migrator)
        up_rows = migrator.dry_run("up")
        assert [r.file for r in up_rows] == ["0005_e.py", "0006_f.py"]
        assert all(r.status == "pending" and len(r.checksum or "") == 64 for r in up_rows)
        assert up_rows[0].checksum == migrator.checksum("0005_e.py")
        assert [r.file for r in migrator.dry_run("up", to="0005_e.py")] == ["0005_e.py"]
        assert [r.file for r in migrator.dry_run("up", "0006_f.py")] == ["0006_f.py"]
        assert [r.file for r in migrator.dry_run("down")] == ["0004_d.py", "0003_c.py"]
        assert [r.file for r in migrator.dry_run("down", steps=1)] == ["0004_d.py"]
        assert [r.file for r in migrator.dry_run("down", batch=1)] == ["0002_b.py", "0001_a.py"]
        assert [r.file for r in migrator.dry_run("down", to="0001_a.py")] == [
            "0004_d.py",
            "0003_c.py",
            "0002_b.py",
        ]
        down_rows = migrator.dry_run("down")
        assert all(r.status == "applied" and r.batch == 2 for r in down_rows)
        with pytest.raises(NotAppliedError):
            migrator.dry_run("down", "0005_e.py")
        with pytest.raises(ConfigInvalidError):
            migrator.dry_run("sideways")  # type: ignore[arg-type]
    assert events.items == []
    assert snapshot(db) == before
    assert calls(db) == []


def test_dry_run_up_applies_the_out_of_order_policy(project: Any, db: Any) -> None:
    write_simple(project, "0002_b")
    with make_migrator(project) as migrator:
        migrator.up()
    write_simple(project, "0001_a")
    from migronaut import OutOfOrderMigrationError

    with (
        make_migrator(project, on_out_of_order="error") as migrator,
        pytest.raises(OutOfOrderMigrationError),
    ):
        migrator.dry_run("up")


def test_status_rows(two_batches: Any, db: Any) -> None:
    with make_migrator(two_batches) as migrator:
        migrator.down()  # 0003, 0004 reverted
        (two_batches.migrations / "0001_a.py").write_text("# edited\n")
        rows = {r.file: r for r in migrator.status()}
        assert list(rows) == ["0001_a.py", "0002_b.py", "0003_c.py", "0004_d.py", "0005_e.py"]
        assert rows["0001_a.py"].status == "applied" and rows["0001_a.py"].checksum_ok is False
        assert rows["0002_b.py"].checksum_ok is True and rows["0002_b.py"].batch == 1
        assert rows["0002_b.py"].applied_at is not None
        assert rows["0003_c.py"].status == "pending" and rows["0003_c.py"].reverted_at is not None
        assert rows["0005_e.py"].status == "pending" and rows["0005_e.py"].checksum_ok is None
        assert rows["0002_b.py"].description == "Migration 0002_b."
        assert [r.file for r in migrator.status("applied")] == ["0001_a.py", "0002_b.py"]
        assert [r.file for r in migrator.pending()] == ["0003_c.py", "0004_d.py", "0005_e.py"]
        assert all(r.checksum_ok is None for r in migrator.status(checksums=False))
        with pytest.raises(ConfigInvalidError):
            migrator.status("everything")  # type: ignore[arg-type]


def test_pending_migrations_probe(two_batches: Any, db: Any) -> None:
    db[CHANGELOG].insert_one(
        {"name": "0006_failed.py", "status": "failed", "batch": 3, "error": "boom"}
    )
    write_simple(two_batches, "0006_failed")
    before = snapshot(db)
    rows = pending_migrations(
        uri=two_batches.uri, db_name=two_batches.db_name, cwd=two_batches.path, env_file=False
    )
    assert [(r.file, r.status) for r in rows] == [
        ("0005_e.py", "pending"),
        ("0006_failed.py", "failed"),
    ]
    assert snapshot(db) == before
