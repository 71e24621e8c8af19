"""``migronaut up --converge`` / ``--no-converge``, ``MIGRONAUT_CONVERGE_AFTER_UP`` and the
audit's ``collections`` drift check through the CLI (collections.md §2.11, §4.1–§4.2)."""

from __future__ import annotations

import json
from typing import Any

from helpers.engine import recording_body, write_simple

THINGS = {"name": "things", "indexes": [{"key": {"m": 1}, "name": "by_m"}]}


def declare(project: Any, *definitions: dict[str, Any]) -> None:
    for definition in definitions or (THINGS,):
        project.write(f"collections/{definition['name']}.json", json.dumps(definition))
    project.write("migronaut.toml", 'collections_dir = "collections"\n')


def index_names(db: Any, name: str) -> set[str]:
    return {index["name"] for index in db[name].list_indexes()} - {"_id_"}


def test_up_converge_creates_the_declared_indexes_after_the_migrations(
        cli: Any, project: Any, db: Any) -> None:
    declare(project)
    write_simple(project, "0001_a")
    result = cli("up", "--converge", "--json")
    assert result.exit_code == 0, result.stderr
    assert [row["status"] for row in result.json] == ["applied"]  # only the migration rows
    assert index_names(db, "things") == {"by_m"}
    human = cli("up", "--converge")
    assert human.exit_code == 0, human.stderr
    assert "Nothing to migrate" in human.stdout + human.stderr
    assert "already match" in human.stdout + human.stderr


def test_the_env_setting_converges_and_no_converge_overrides_it(
        cli: Any, project: Any, db: Any) -> None:
    declare(project)
    write_simple(project, "0001_a")
    env = {"MIGRONAUT_CONVERGE_AFTER_UP": "true"}
    skipped = cli("up", "--no-converge", env=env)
    assert skipped.exit_code == 0, skipped.stderr
    assert "Not supported yet" not in skipped.stderr
    assert index_names(db, "things") == set()
    converged = cli("up", env=env)
    assert converged.exit_code == 0, converged.stderr
    assert index_names(db, "things") == {"by_m"}
    assert db["_migronaut_converge"].find_one()["trigger"] == "up"


def test_a_broken_definition_file_fails_before_any_migration(
        cli: Any, project: Any, db: Any) -> None:
    declare(project)
    project.write("collections/bad.json", "{not json")
    write_simple(project, "0001_a")
    refused = cli("up", "--converge", "--json")
    assert refused.exit_code == 6
    assert refused.json["error"]["code"] == "CONFIG_INVALID"
    assert db["_migronaut_migrations"].count_documents({}) == 0
    assert "calls" not in db.list_collection_names()
    assert cli("up", "--json").exit_code == 0  # without converge the files are never read


def test_a_failed_converge_exits_27_and_the_migrations_stay_applied(
        cli: Any, project: Any, db: Any) -> None:
    declare(project, {"name": "things", "indexes": [{"key": {"k": 1}, "unique": True}]})
    project.write_migration("0001_dupes", recording_body(
        "0001_dupes", extra_up="ctx.db['things'].insert_many([{'k': 1}, {'k': 1}])"))
    failed = cli("up", "--converge", "--json")
    assert failed.exit_code == 27, failed.stderr
    error = failed.json["error"]
    assert error["code"] == "CONVERGE_FAILED"
    assert "results" not in error["context"]  # the CLI's error JSON never carries the rows
    assert error["context"]["converge"]["inSync"] is False
    assert db["_migronaut_migrations"].find_one()["status"] == "applied"
    entry = db["_migronaut_converge"].find_one()
    assert entry["trigger"] == "up" and entry["success"] is False


def test_converge_flags_are_refused_outside_a_bulk_up(cli: Any, project: Any) -> None:
    declare(project)
    write_simple(project, "0001_a")
    assert cli("up", "0001_a.py", "--converge").exit_code == 6
    assert cli("up", "--to", "0001_a.py", "--converge").exit_code == 6


def test_audit_warns_on_drift_and_passes_in_sync(cli: Any, project: Any, db: Any) -> None:
    declare(project)
    write_simple(project, "0001_a")
    assert cli("up").exit_code == 0
    drift = cli("audit", "--json")
    assert drift.exit_code == 0, drift.stderr
    (check,) = [c for c in drift.json["checks"] if c["name"] == "collections"]
    assert check["status"] == "warn" and "things" in check["detail"]
    assert drift.json["warnings"] >= 1
    names = [c["name"] for c in drift.json["checks"]]
    assert names.index("collections") < names.index("runtime")
    human = cli("audit")
    assert human.exit_code == 0 and "collections" in human.stdout
    assert cli("converge", "-y").exit_code == 0
    synced = cli("audit", "--json")
    (check,) = [c for c in synced.json["checks"] if c["name"] == "collections"]
    assert check == {"name": "collections", "status": "pass",
                     "detail": "1 collection(s) match their declarations"}


def test_audit_has_no_collections_check_without_declarations(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a")
    report = cli("audit", "--json")
    assert "collections" not in [c["name"] for c in report.json["checks"]]


def test_audit_warns_when_definitions_do_not_load(cli: Any, project: Any) -> None:
    declare(project)
    project.write("collections/bad.json", "{not json")
    report = cli("audit", "--json")
    assert report.exit_code == 0
    (check,) = [c for c in report.json["checks"] if c["name"] == "collections"]
    assert check["status"] == "warn" and "do not load" in check["detail"]
