"""``Migrator.converge`` against the dev server (collections.md §2): create from nothing, fixed
point, in-place changes, rebuilds, a failed unique rebuild restoring the old index, prune,
refused conflicts, history, events and the lock."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.engine import LOCKS, hold_lock, make_migrator
from migronaut import ConvergeFailedError, LockAlreadyHeldError, MigrationBlockedError

HISTORY = "_migronaut_converge"

USERS: dict[str, Any] = {
    "name": "users",
    "validator": {"$jsonSchema": {"required": ["email"]}},
    "indexes": [
        {"key": {"email": 1}, "unique": True},
        {"key": {"at": 1}, "expireAfterSeconds": 3600},
        {"key": {"title": "text", "body": "text"}, "weights": {"title": 10}},
        {"key": {"loc": "2dsphere"}},
        {"key": {"a": 1, "b": -1}, "name": "ab"},
    ],
}
ORDERS: dict[str, Any] = {"name": "orders", "indexes": [{"key": {"shop": 1}}]}


def converge(project: Any, collections: list[dict[str, Any]], **options: Any) -> Any:
    with make_migrator(project, collections=collections) as migrator:
        return migrator.converge(**options)


def index_names(db: Any, name: str) -> set[str]:
    return {index["name"] for index in db[name].list_indexes()} - {"_id_"}


def test_creates_from_nothing_then_is_a_fixed_point(project: Any, db: Any) -> None:
    planned = converge(project, [USERS, ORDERS], dry_run=True)
    assert planned.dry_run and not planned.in_sync
    assert planned.changed == 2 + 5 + 2  # users: collection, validator, five indexes; orders
    assert db.list_collection_names() == []  # a dry run writes nothing

    result = converge(project, [USERS, ORDERS])
    assert result.in_sync and result.changed == 9 and result.unstable is None
    rows = result.to_dict()["collections"][0]["actions"]
    assert {row["status"] for row in rows} == {"applied"}
    assert all("durationMs" in row for row in rows)
    assert index_names(db, "users") == {"email_1", "at_1", "title_text_body_text", "loc_2dsphere",
                                        "ab"}
    assert index_names(db, "orders") == {"shop_1"}
    options = db.command("listCollections", filter={"name": "users"})["cursor"]["firstBatch"][0]
    assert options["options"]["validator"] == USERS["validator"]

    again = converge(project, [USERS, ORDERS], dry_run=True)
    assert again.in_sync and again.changed == 0
    assert converge(project, [USERS, ORDERS]).changed == 0
    assert db[HISTORY].count_documents({}) == 1  # an idle converge is not recorded


def test_changes_in_place_and_rebuilds(project: Any, db: Any) -> None:
    converge(project, [USERS])
    changed = {**USERS, "indexes": [
        {"key": {"email": 1}, "unique": True},
        {"key": {"at": 1}, "expireAfterSeconds": 60},  # in place (collMod)
        {"key": {"title": "text", "body": "text"}, "weights": {"title": 10}},
        {"key": {"loc": "2dsphere"}},
        {"key": {"a": 1, "b": 1}, "name": "ab"},  # rebuild: the key changed
    ]}
    plan = converge(project, [changed], dry_run=True)
    actions = {row.name: row.action for row in plan.collections[0].actions}
    assert actions["at_1"] == "modify" and actions["ab"] == "recreate"
    result = converge(project, [changed])
    assert result.in_sync and result.changed == 2
    listed = {index["name"]: index for index in db.users.list_indexes()}
    assert listed["at_1"]["expireAfterSeconds"] == 60
    assert dict(listed["ab"]["key"]) == {"a": 1, "b": 1}
    assert converge(project, [changed], dry_run=True).in_sync


def test_unique_rebuild_over_duplicates_restores_the_old_index(project: Any, db: Any) -> None:
    converge(project, [{"name": "u", "indexes": [{"key": {"n": 1}, "name": "n"}]}])
    db.u.insert_many([{"n": 1}, {"n": 1}])
    unique = [{"name": "u", "indexes": [{"key": {"n": 1}, "name": "n", "sparse": True,
                                        "unique": True}]}]
    with pytest.raises(ConvergeFailedError) as caught:
        converge(project, unique)
    error = caught.value
    assert error.exit_code == 27
    assert error.context["phase"] == "apply" and error.context["restored"] is True
    assert error.context["mongoCode"] == 11000 and "duplicate" in error.context["hint"]
    assert "Could not rebuild index \"n\" on u" in error.message
    listed = {index["name"]: index for index in db.u.list_indexes()}
    assert "unique" not in listed["n"] and "sparse" not in listed["n"]  # the old one is back
    assert error.context["converge"]["inSync"] is False
    entry = db[HISTORY].find_one({"success": False})
    assert entry is not None and entry["actions"][0]["status"] == "failed"


def test_prune_drops_undeclared_indexes_and_conflicts_refuse_before_any_write(
    project: Any, db: Any,
) -> None:
    db.orders.create_index([("old", 1)], name="old_1")
    db.orders.create_index([("shop", 1)], name="by_shop", sparse=True)  # blocks shop_1
    with pytest.raises(ConvergeFailedError) as caught:
        converge(project, [USERS, ORDERS])
    error = caught.value
    assert error.context["phase"] == "plan"
    assert error.context["conflicts"][0]["collection"] == "orders"
    assert error.message.startswith("Converge refused: 1 conflict(s) — orders index \"shop_1\"")
    assert "users" not in db.list_collection_names()  # refused before the first write

    result = converge(project, [ORDERS], prune=True)
    assert result.in_sync
    assert index_names(db, "orders") == {"shop_1"}


def test_history_events_and_ordered(project: Any, db: Any) -> None:
    events: list[dict[str, Any]] = []
    with make_migrator(project, collections=[ORDERS]) as migrator:
        migrator.on("*", events.append)
        migrator.converge(reason="deploy 42", requested_by="ci")
        history = migrator.converge_history(limit=5)
    names = [event["event"] for event in events]
    assert names[0] == "run:start" and names[-1] == "run:end"
    assert names.index("converge:start") < names.index("converge:action") \
        < names.index("converge:end")
    assert len({event["runId"] for event in events}) == 1
    actions = [event for event in events if event["event"] == "converge:action"]
    assert [a["status"] for a in actions] == ["started", "applied", "started", "applied"]
    end = next(event for event in events if event["event"] == "converge:end")
    assert end["success"] and end["changed"] == 2 and end["counts"] == {"create": 2}
    assert history[0]["reason"] == "deploy 42" and history[0]["requestedBy"] == "ci"
    assert history[0]["trigger"] == "converge" and "_id" not in history[0]
    assert [a["target"] for a in history[0]["actions"]] == ["collection", "index"]
    assert "startedAt" in index_names(db, HISTORY)

    (project.path / "migrations").mkdir(exist_ok=True)
    (project.path / "migrations" / "0001_a.py").write_text("def up(ctx):\n    pass\n")
    with pytest.raises(MigrationBlockedError) as blocked:
        converge(project, [ORDERS], ordered=True)
    assert blocked.value.context["blockedBy"] == ["0001_a.py"]


def test_lock_held_refuses_but_a_dry_run_still_plans(project: Any, db: Any) -> None:
    hold_lock(db)
    with pytest.raises(LockAlreadyHeldError):
        converge(project, [ORDERS])
    assert "orders" not in db.list_collection_names()
    assert converge(project, [ORDERS], dry_run=True).changed == 2
    assert db[LOCKS].count_documents({}) == 1


def test_options_are_checked_before_connecting(project: Any) -> None:
    from migronaut import ConfigInvalidError

    with pytest.raises(ConfigInvalidError, match="prune must be a boolean"):
        converge(project, [ORDERS], prune="yes")
    with pytest.raises(ConfigInvalidError):
        converge(project, [ORDERS], dry_run=True, wait_for_search_indexes=True)
    empty = converge(project, [])
    assert empty.in_sync and empty.changed == 0 and empty.collections == ()
