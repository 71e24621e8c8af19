"""``migronaut converge`` through the CLI: the plan table, ``--check`` (exit 28), confirmation,
``--json``, ``--history`` and the refusals (collections.md §2.10)."""

from __future__ import annotations

import json
from typing import Any

from helpers.engine import hold_lock

DEFINITIONS = [{"name": "orders", "indexes": [{"key": {"shop": 1}},
                                               {"key": {"at": 1}, "expireAfterSeconds": 60}]}]


def declare(project: Any, definitions: list[dict[str, Any]] = DEFINITIONS) -> None:
    (project.path / "collections").mkdir(exist_ok=True)
    for definition in definitions:
        (project.path / "collections" / f"{definition['name']}.json").write_text(
            json.dumps(definition))
    project.write("migronaut.toml", 'collections_dir = "collections"\n')


def test_dry_run_and_check_then_converge_then_in_sync(cli: Any, project: Any, db: Any) -> None:
    declare(project)
    planned = cli("converge", "--dry-run")
    assert planned.exit_code == 0, planned.stderr
    assert "│ Collection │ Target" in planned.stdout
    assert "Would make 3 change(s) in 1 of 1 collection(s)" in planned.stdout
    assert cli("converge", "--check").exit_code == 28
    assert db.list_collection_names() == []

    applied = cli("converge")  # creates only: no confirmation needed
    assert applied.exit_code == 0, applied.stderr
    assert "Converged 3 change(s) in 1 of 1 collection(s)" in applied.stdout
    check = cli("converge", "--check", "--json")
    assert check.exit_code == 0 and check.json["inSync"] is True
    assert "✔ 1 collection(s) match their declarations" in cli("converge", "--check").stdout


def test_drops_ask_and_json_needs_yes(cli: Any, project: Any, db: Any) -> None:
    declare(project)
    assert cli("converge").exit_code == 0
    db.orders.create_index([("old", 1)], name="old_1")
    refused = cli("converge", "--prune", "--json")
    assert refused.exit_code == 6
    assert refused.json["error"]["context"]["destructive"][0]["name"] == "old_1"
    declined = cli("converge", "--prune", input="n\n")
    assert declined.exit_code == 0 and "Aborted" in declined.stdout + declined.stderr
    assert "drop" in declined.stdout and "old_1" in declined.stdout
    assert "old_1" in {index["name"] for index in db.orders.list_indexes()}
    done = cli("converge", "--prune", "-y", "--json", "--reason", "cleanup")
    assert done.exit_code == 0, done.stderr
    assert done.json["changed"] == 1 and done.json["inSync"] is True
    assert "old_1" not in {index["name"] for index in db.orders.list_indexes()}

    history = cli("converge", "--history", "--json", "--limit", "1")
    assert history.exit_code == 0 and len(history.json) == 1
    assert history.json[0]["reason"] == "cleanup" and history.json[0]["changed"] == 1
    table = cli("converge", "--history")
    assert "│ When" in table.stdout and "cleanup" in table.stdout
    assert cli("converge", "--limit", "3").exit_code == 6


def test_unique_over_duplicates_exits_27_and_restores(cli: Any, project: Any, db: Any) -> None:
    declare(project, [{"name": "u", "indexes": [{"key": {"n": 1}, "name": "n"}]}])
    assert cli("converge").exit_code == 0
    db.u.insert_many([{"n": 1}, {"n": 1}])
    declare(project, [{"name": "u", "indexes": [{"key": {"n": 1}, "name": "n",
                                                 "unique": True, "sparse": True}]}])
    failed = cli("converge", "-y", "--json", "--rebuild-unique")
    assert failed.exit_code == 27, failed.stderr
    context = failed.json["error"]["context"]
    assert context["phase"] == "apply" and context["restored"] is True
    assert "n" in {index["name"] for index in db.u.list_indexes()}


def test_conflict_exits_27_and_lock_held_exits_3(cli: Any, project: Any, db: Any) -> None:
    declare(project)
    db.orders.create_index([("shop", 1)], name="by_shop", sparse=True)
    conflict = cli("converge", "--json")
    assert conflict.exit_code == 27
    assert conflict.json["error"]["context"]["phase"] == "plan"
    assert cli("converge", "--check").exit_code == 28
    hold_lock(db)
    assert cli("converge", "--prune", "-y").exit_code == 3


def test_a_history_entry_we_did_not_write_is_state_invalid(cli: Any, project: Any,
                                                           db: Any) -> None:
    """Fail closed: a history row whose ``from`` is not the Extended JSON converge writes (or
    whose ``actions`` is not a list) stops ``--history`` with STATE_INVALID naming it."""
    import datetime as dt

    history = db["_migronaut_converge"]
    history.insert_one({"startedAt": dt.datetime(2026, 1, 2), "changed": 1,
                        "actions": [{"collection": "orders", "from": "{not json"}]})
    broken = cli("converge", "--history", "--json")
    assert broken.exit_code == 35, broken.stderr
    error = broken.json["error"]
    assert error["code"] == "STATE_INVALID"
    assert error["context"]["field"] == "actions[0].from"
    assert "is not Extended JSON" in error["message"]
    history.delete_many({})
    history.insert_one({"startedAt": dt.datetime(2026, 1, 3), "actions": "all of them"})
    human = cli("converge", "--history")
    assert human.exit_code == 35
    assert "actions is not a list" in human.stderr
    assert history.count_documents({}) == 1  # reading changed nothing
