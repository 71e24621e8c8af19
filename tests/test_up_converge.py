"""Converge after ``up`` through the API against the dev server (collections.md §2.11, §1.1):
same run and lock, after the migrations, even with nothing pending; definitions resolved before
the lock; a failed converge leaves the migrations applied and recorded."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from helpers.engine import (
    LOCKS,
    Events,
    captured_logger,
    hold_lock,
    make_migrator,
    recording_body,
    write_simple,
)
from migronaut import (
    ConfigInvalidError,
    ConvergeFailedError,
    LockAlreadyHeldError,
    MigrationInvalidExportError,
    run_migrations,
)

HISTORY = "_migronaut_converge"
THINGS: dict[str, Any] = {"name": "things", "indexes": [{"key": {"m": 1}, "name": "by_m"}]}


def index_names(db: Any, name: str) -> set[str]:
    return {index["name"] for index in db[name].list_indexes()} - {"_id_"}


def test_up_converges_after_the_migrations_in_the_same_run(project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    with make_migrator(project, collections=[THINGS]) as migrator:
        events = Events(migrator)
        results = migrator.up(converge=True)
    assert [(r.file, r.status) for r in results] == [("0001_a.py", "applied"),
                                                     ("0002_b.py", "applied")]
    assert index_names(db, "things") == {"by_m"}
    names = [n for n in events.names if n.startswith(("run:", "converge:", "migration:"))
             and n not in ("migration:log", "converge:action")]
    assert names[0] == "run:start" and names[-3:] == ["converge:start", "converge:end",
                                                      "run:end"]
    assert names.index("converge:start") > max(i for i, n in enumerate(names)
                                               if n.startswith("migration:"))
    assert len({e["runId"] for e in events.items if e["event"] != "migration:log"}) == 1
    (start,) = events.of("converge:start")
    assert start["trigger"] == "up"
    (end,) = events.of("run:end")
    assert end["command"] == "up" and end["applied"] == 2 and end["success"] is True
    (entry,) = db[HISTORY].find()
    assert entry["trigger"] == "up" and entry["success"] is True and entry["changed"] == 1


def test_converges_even_when_nothing_is_pending(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project, collections=[THINGS], converge_after_up=True) as migrator:
        migrator.up()
        assert index_names(db, "things") == {"by_m"}
        db.things.drop_index("by_m")
        assert migrator.up() == []
    assert index_names(db, "things") == {"by_m"}  # the drift was repaired by a no-op up
    assert db[HISTORY].count_documents({"trigger": "up"}) == 2


def test_a_broken_definition_file_fails_up_before_any_migration(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    project.write("collections/bad.json", '{"indexes": [{"key": {"a": 1}, "uniqe": true}]}')
    with make_migrator(project, collections_dir="collections") as migrator:
        with pytest.raises(ConfigInvalidError) as raised:
            migrator.up(converge=True)
        assert "bad.json" in str(raised.value.context)
        assert db["_migronaut_migrations"].count_documents({}) == 0
        assert "calls" not in db.list_collection_names()
        assert "_migronaut_locks" not in db.list_collection_names() or \
            db["_migronaut_locks"].count_documents({}) == 0
        # a plain up never reads collections_dir: the broken file does not block it
        assert [r.status for r in migrator.up()] == ["applied"]


def test_a_failed_converge_keeps_the_migrations_applied(project: Any, db: Any) -> None:
    project.write_migration("0001_dupes", recording_body(
        "0001_dupes", extra_up="ctx.db['things'].insert_many([{'k': 1}, {'k': 1}])"))
    unique = {"name": "things", "indexes": [{"key": {"k": 1}, "unique": True}]}
    with make_migrator(project, collections=[unique]) as migrator:
        events = Events(migrator)
        with pytest.raises(ConvergeFailedError) as raised:
            migrator.up(converge=True)
    error = raised.value
    assert error.code == "CONVERGE_FAILED" and error.exit_code == 27
    assert error.context["phase"] == "apply"
    assert error.context["results"] == [{"file": "0001_dupes.py", "status": "applied",
                                         "duration": error.context["results"][0]["duration"],
                                         "batch": 1}]
    assert error.context["converge"]["inSync"] is False
    assert db["_migronaut_migrations"].find_one({"name": "0001_dupes.py"})["status"] == "applied"
    (entry,) = db[HISTORY].find()
    assert entry["trigger"] == "up" and entry["success"] is False
    (end,) = events.of("run:end")
    assert end["success"] is False and end["applied"] == 1
    (converge_end,) = events.of("converge:end")
    assert converge_end["success"] is False


def test_explicit_false_overrides_the_config_and_partial_ups_skip(project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b", "0003_c")
    with captured_logger() as (logger, handler), make_migrator(
            project, collections=[THINGS], converge_after_up=True, logger=logger) as migrator:
        assert migrator.converges_after_up() is True
        migrator.up(converge=False)
    assert "things" in db.list_collection_names() and index_names(db, "things") == set()
    db["_migronaut_migrations"].delete_many({})
    with captured_logger() as (logger, handler), make_migrator(
            project, collections=[THINGS], converge_after_up=True, logger=logger) as migrator:
        migrator.up(to="0001_a.py")
        migrator.up("0002_b.py")
        assert index_names(db, "things") == set()
        assert any("up --to" in r.getMessage() for r in handler.records)
        migrator.dry_run("up")
        assert any("converge --dry-run" in r.getMessage() for r in handler.records
                   if r.levelno == logging.INFO)
    assert db[HISTORY].count_documents({}) == 0


@pytest.mark.parametrize(("args", "options"), [
    (("0001_a.py",), {"converge": True}),
    ((), {"to": "0001_a.py", "converge": True}),
    ((), {"converge": "yes"}),
])
def test_converge_is_refused_outside_a_bulk_up(project: Any, args: tuple[str, ...],
                                               options: dict[str, Any]) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project, collections=[THINGS]) as migrator, \
            pytest.raises(ConfigInvalidError):
        migrator.up(*args, **options)


def test_converges_after_up_needs_a_declaration(project: Any) -> None:
    with make_migrator(project, converge_after_up=True) as migrator:
        assert migrator.converges_after_up() is False
    with make_migrator(project, collections=[THINGS]) as migrator:
        assert migrator.converges_after_up() is False


def test_run_migrations_reports_the_converge(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    summary = run_migrations(uri=project.uri, db_name=project.db_name, env_file=False,
                             cwd=project.path, collections=[THINGS], converge_after_up=True)
    assert summary.converge is not None and summary.converge.in_sync
    assert summary.to_dict()["converge"]["changed"] == 1
    assert index_names(db, "things") == {"by_m"}
    plain = run_migrations(uri=project.uri, db_name=project.db_name, env_file=False,
                           cwd=project.path)
    assert plain.converge is None and "converge" not in plain.to_dict()


def test_definitions_survive_only_a_refusal_for_a_held_lock(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    project.write("collections/things.json", '{"indexes": [{"key": {"m": 1}, "name": "by_m"}]}')
    with make_migrator(project, collections_dir="collections") as migrator:
        hold_lock(db)
        with pytest.raises(LockAlreadyHeldError):
            migrator.up(converge=True)
        db[LOCKS].delete_many({})
        # a lock-wait retry reuses what the refused attempt loaded: the broken file is not read
        project.write("collections/things.json", "{broken")
        assert [r.status for r in migrator.up(converge=True)] == ["applied"]
        assert index_names(db, "things") == {"by_m"}
        with pytest.raises(ConfigInvalidError):  # a run that got past the lock forgot them
            migrator.up(converge=True)


def test_the_async_migrator_converges_after_up(project: Any, db: Any) -> None:
    from migronaut import AsyncMigrator

    write_simple(project, "0001_a")

    async def main() -> list[Any]:
        async with AsyncMigrator(uri=project.uri, db_name=project.db_name, env_file=False,
                                 cwd=project.path, collections=[THINGS]) as migrator:
            assert migrator.converges_after_up() is False
            return await migrator.up(converge=True)

    assert [r.status for r in asyncio.run(main())] == ["applied"]
    assert index_names(db, "things") == {"by_m"}


BACKGROUND_ON_PLANS = '''
def migrate(doc, ctx):
    doc["tier"] = "free"
    return doc


background = {"collection": "plans", "from": 1, "to": %d, "migrate": migrate%s}
'''


def test_a_background_spec_takes_its_fields_from_the_declared_versioning(
        project: Any, db: Any) -> None:
    plans = {"name": "plans", "versioning": {"current": 2, "field": "shape",
                                             "revision": False}}
    project.write_migration("0001_plans_v2", BACKGROUND_ON_PLANS % (2, ""))
    with make_migrator(project, collections=[plans]) as migrator, \
            pytest.raises(MigrationInvalidExportError) as raised:
        migrator.up()  # revision: False in the declaration needs occ "version-only"
    assert "version-only" in raised.value.message
    (project.migrations / "0001_plans_v2.py").unlink()
    project.write_migration("0002_plans_v2", BACKGROUND_ON_PLANS % (2, ', "occ": "version-only"'))
    with make_migrator(project, collections=[plans]) as migrator:
        migrator.up()
        state = migrator.background.state("0002_plans_v2.py")
    assert state is not None
    assert state["spec"]["field"] == "shape"
    assert state["spec"].get("revisionField") is None


def test_a_background_spec_may_not_pass_the_declared_current(project: Any, db: Any) -> None:
    plans = {"name": "plans", "versioning": {"current": 2}}
    project.write_migration("0001_plans_v3", BACKGROUND_ON_PLANS % (3, ""))
    with make_migrator(project, collections=[plans]) as migrator, \
            pytest.raises(MigrationInvalidExportError) as raised:
        migrator.up()
    assert "raise current first" in str(raised.value.context)
    assert db["_migronaut_migrations"].count_documents({}) == 0
