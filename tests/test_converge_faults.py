"""Converge's failure paths against the dev server, with the server's own errors (collections.md
§2.3, §2.5, §2.6.3, §2.7): a failed rebuild restoring what it dropped, a collection changed
between plan and apply (``replan``), a stop between steps (exit 11), a unique conversion in place
meeting duplicates, an ``unstable`` fixed point, the lock held by another run.

Another client changes the database from a ``converge:action`` listener — the listener runs in
the converge's thread, so the change lands at a known point between two steps (no sleeps). Each
test checks the error (message, code, exit code) and that nothing was half-written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from helpers.engine import LOCKS, hold_lock, make_migrator
from migronaut import (
    ConvergeFailedError,
    LockAlreadyHeldError,
    MigronautError,
    RunAbortedError,
)

HISTORY = "_migronaut_converge"


def indexes(db: Any, name: str) -> dict[str, dict[str, Any]]:
    """The live indexes by name, without ``v`` (what a restore may legitimately renumber)."""
    return {index["name"]: {k: v for k, v in index.items() if k != "v"}
            for index in db[name].list_indexes()}


def converge_with(project: Any, collections: list[dict[str, Any]],
                  listener: Callable[[dict[str, Any]], None] | None = None,
                  **options: Any) -> tuple[Any, list[dict[str, Any]]]:
    """Converge with ``listener`` on every event; returns ``(result or error, events)``."""
    events: list[dict[str, Any]] = []

    def record(event: dict[str, Any]) -> None:
        events.append(event)
        if listener is not None:
            listener(event)

    with make_migrator(project, collections=collections) as migrator:
        migrator.on("*", record)
        try:
            return migrator.converge(**options), events
        except MigronautError as error:
            return error, events


def stop_when(migrator: Any, when: Callable[[dict[str, Any]], bool], *reason: str) -> None:
    """Call ``migrator.stop(*reason)`` from the ``converge:action`` event ``when`` matches."""
    migrator.on("converge:action", lambda event: migrator.stop(*reason) if when(event) else None)


def ended(events: list[dict[str, Any]]) -> dict[str, Any]:
    return next(event for event in events if event["event"] == "converge:end")


def test_failed_rebuild_restores_every_index_it_dropped(project: Any, db: Any) -> None:
    """A rebuild dropping two indexes (same name, and — with prune — the same key under another
    name) whose create fails over duplicates puts both back exactly; exit 27, phase ``apply``,
    the 11000 hint."""
    db.r.create_index([("x", 1)], name="a")
    db.r.create_index([("y", 1)], name="b", sparse=True)
    db.r.insert_many([{"x": 1, "y": 1}, {"x": 2, "y": 1}])
    before = indexes(db, "r")
    declared = [{"name": "r", "indexes": [{"key": {"y": 1}, "name": "a", "unique": True}]}]
    error, events = converge_with(project, declared, prune=True)

    assert isinstance(error, ConvergeFailedError), error
    assert error.code == "CONVERGE_FAILED" and error.exit_code == 27
    context = error.context
    assert context["phase"] == "apply" and context["collection"] == "r"
    assert context["target"] == "index" and context["name"] == "a"
    assert context["action"] == "recreate" and context["mongoCode"] == 11000
    assert context["restored"] is True and sorted(context["dropped"]) == ["a", "b"]
    assert "uncertain" not in context and "restoreError" not in context
    assert "duplicate" in context["hint"]
    assert error.message.startswith('Could not rebuild index "a" on r: ')
    assert error.message.endswith(f" — {context['hint']} — the dropped index was restored")
    assert indexes(db, "r") == before  # both dropped indexes are back, exactly
    assert context["converge"]["inSync"] is False and context["converge"]["changed"] == 0

    end = ended(events)
    assert end["success"] is False and end["error"].startswith("Could not rebuild")
    failed = [e for e in events if e["event"] == "converge:action" and e["status"] == "failed"]
    assert [e["name"] for e in failed] == ["a"]
    entry = db[HISTORY].find_one()
    assert entry is not None and entry["success"] is False and entry["changed"] == 0
    assert [(a["name"], a["status"]) for a in entry["actions"]] == [("a", "failed")]


def test_a_collection_changed_after_the_plan_stops_the_run_at_replan(
    project: Any, db: Any,
) -> None:
    """While the first collection converges, another client creates an index on the second
    that blocks the declared one: the re-plan introduces a conflict — phase ``replan``, the
    second collection untouched, the first one's work kept."""
    declared = [{"name": "first", "indexes": [{"key": {"a": 1}}]},
                {"name": "second", "indexes": [{"key": {"shop": 1}}]}]

    def meddle(event: dict[str, Any]) -> None:
        if (event["event"] == "converge:action" and event["collection"] == "first"
                and event["status"] == "applied" and event["target"] == "index"):
            db.second.create_index([("shop", 1)], name="by_shop", sparse=True)

    error, events = converge_with(project, declared, meddle)

    assert isinstance(error, ConvergeFailedError), error
    assert error.exit_code == 27
    assert error.context["phase"] == "replan" and error.context["collection"] == "second"
    assert error.context["introduced"] == [
        {"target": "index", "name": "shop_1", "action": "conflict",
         "reason": error.context["introduced"][0]["reason"]}]
    assert error.message == ('second changed while converging: the new plan has index "shop_1" '
                             "conflict — converge again to review the new plan")
    assert set(indexes(db, "second")) == {"_id_", "by_shop"}  # nothing written on second
    assert "a_1" in indexes(db, "first")  # what was done stays done

    result = error.context["converge"]
    statuses = {(c["name"], row["name"]): row["status"] for c in result["collections"]
                for row in c["actions"]}
    assert statuses[("first", "a_1")] == "applied"
    assert statuses[("second", "shop_1")] == "skipped"
    assert result["changed"] == 2 and result["inSync"] is False
    assert not any(e["event"] == "converge:action" and e["collection"] == "second"
                   for e in events)
    assert ended(events)["success"] is False
    entry = db[HISTORY].find_one()
    assert entry is not None and entry["success"] is False and entry["changed"] == 2
    assert "changed while converging" in entry["error"]


def test_a_destructive_change_after_the_plan_stops_the_run_at_replan(
    project: Any, db: Any,
) -> None:
    """The second collection's index gets a different key meanwhile: its re-plan needs a
    rebuild the reviewed plan did not have — refused before touching it."""
    db.second.create_index([("shop", 1)], name="shop_1")
    declared = [{"name": "first", "indexes": [{"key": {"a": 1}}]},
                {"name": "second", "indexes": [{"key": {"shop": 1}}]}]

    def meddle(event: dict[str, Any]) -> None:
        if event["event"] == "converge:action" and event["status"] == "applied" \
                and event["collection"] == "first" and event["target"] == "index":
            db.second.drop_index("shop_1")
            db.second.create_index([("shop", -1)], name="shop_1")

    error, _ = converge_with(project, declared, meddle)

    assert isinstance(error, ConvergeFailedError), error
    assert error.context["phase"] == "replan"
    assert [(i["name"], i["action"]) for i in error.context["introduced"]] == [
        ("shop_1", "recreate")]
    assert dict(indexes(db, "second")["shop_1"]["key"]) == {"shop": -1}  # left as found


def test_a_stop_between_steps_aborts_with_what_was_done_kept(project: Any, db: Any) -> None:
    """``Migrator.stop()`` while the collection is being created: the next step never starts;
    RUN_ABORTED (exit 11) with ``context.converge``, ``converge:end`` and a history entry."""
    declared = [{"name": "orders", "indexes": [{"key": {"shop": 1}}]},
                {"name": "later", "indexes": [{"key": {"b": 1}}]}]
    events: list[dict[str, Any]] = []
    with make_migrator(project, collections=declared) as migrator:
        migrator.on("*", events.append)
        stop_when(migrator, lambda event: event["target"] == "collection"
                  and event["status"] == "applied", "deploy cancelled")
        with pytest.raises(RunAbortedError) as caught:
            migrator.converge()
    error = caught.value
    assert error.code == "RUN_ABORTED" and error.exit_code == 11
    assert error.message == "deploy cancelled"
    assert "orders" in db.list_collection_names()  # done before the stop: kept
    assert set(indexes(db, "orders")) == {"_id_"}  # the next step never ran
    assert "later" not in db.list_collection_names()
    rows = {(c["name"], row["target"], row["name"]): row["status"]
            for c in error.context["converge"]["collections"] for row in c["actions"]}
    assert rows[("orders", "collection", "orders")] == "applied"
    assert rows[("orders", "index", "shop_1")] == "skipped"
    assert rows[("later", "collection", "later")] == "skipped"
    end = ended(events)
    assert end["success"] is False and end["changed"] == 1 and end["error"] == "deploy cancelled"
    assert [e["event"] for e in events][-1] == "run:end"
    entry = db[HISTORY].find_one()
    assert entry is not None and entry["success"] is False and entry["changed"] == 1
    assert db[LOCKS].count_documents({}) == 0  # released


def test_unique_conversion_in_place_over_duplicates_rolls_back(project: Any, db: Any) -> None:
    """7.0: prepareUnique then unique; the duplicates refuse the second (359), prepareUnique
    goes back to false, exit 27 with the hint and the offending documents named."""
    ids = db.u.insert_many([{"n": 1}, {"n": 1}, {"n": 2}]).inserted_ids
    db.u.create_index([("n", 1)], name="n_1")
    before = indexes(db, "u")
    declared = [{"name": "u", "indexes": [{"key": {"n": 1}, "unique": True}]}]
    planned, _ = converge_with(project, declared, dry_run=True)
    assert [row.action for row in planned.collections[0].actions] == ["modify"]

    error, events = converge_with(project, declared)

    assert isinstance(error, ConvergeFailedError), error
    context = error.context
    assert error.exit_code == 27 and context["phase"] == "apply"
    assert context["action"] == "modify" and context["name"] == "n_1"
    assert context["mongoCode"] == 359
    assert context["hint"] == ("existing documents have duplicates for this key; the index was "
                               "left unchanged")
    assert error.message == ('Could not modify index "n_1" on u: OperationFailure: Cannot '
                             "convert the index to unique. Please resolve conflicting documents "
                             f"before running collMod again. — {context['hint']}")
    assert context["cause"] == error.message.split(": ", 1)[1].split(" — ")[0]
    assert [sorted(v["ids"]) for v in context["violations"]] == [sorted(ids[:2])]
    assert indexes(db, "u") == before  # neither unique nor prepareUnique left behind
    assert ended(events)["success"] is False
    entry = db[HISTORY].find_one()
    assert entry is not None and entry["actions"][0]["status"] == "failed"


def test_an_index_changed_right_after_its_step_is_reported_unstable(
    project: Any, db: Any,
) -> None:
    """The fixed-point check re-reads after the steps: another client hiding the index just
    built makes the re-plan show a change — reported in ``unstable``, warned, never looped."""
    declared = [{"name": "orders", "indexes": [{"key": {"shop": 1}}]}]

    def hide(event: dict[str, Any]) -> None:
        if event["event"] == "converge:action" and event["target"] == "index" \
                and event["status"] == "applied":
            db.command({"collMod": "orders", "index": {"name": "shop_1", "hidden": True}})

    result, events = converge_with(project, declared, hide)

    assert not isinstance(result, Exception), result
    assert result.changed == 2 and result.in_sync is False
    assert [{k: v for k, v in entry.items() if k != "reason"} for entry in result.unstable] \
        == [{"collection": "orders", "target": "index", "name": "shop_1", "action": "modify"}]
    end = ended(events)
    assert end["success"] is True and end["inSync"] is False
    entry = db[HISTORY].find_one()
    assert entry is not None and entry["unstable"][0]["name"] == "shop_1"
    again, _ = converge_with(project, declared, dry_run=True)
    assert again.changed == 1  # the next converge would unhide it: stable, not looping


def test_the_lock_held_by_another_run_refuses_and_writes_nothing(
    project: Any, db: Any,
) -> None:
    hold_lock(db)
    error, events = converge_with(project, [{"name": "orders", "indexes": [{"key": {"s": 1}}]}])
    assert isinstance(error, LockAlreadyHeldError), error
    assert error.code == "LOCK_ALREADY_HELD" and error.exit_code == 3
    assert "orders" not in db.list_collection_names()
    assert HISTORY not in db.list_collection_names()
    assert not [e for e in events if e["event"].startswith("converge:")]
    assert db[LOCKS].find_one()["owner"] == "someone-else"  # theirs, untouched


def test_the_async_migrator_stops_between_steps_too(project: Any, db: Any) -> None:
    """``AsyncMigrator.stop()`` from a listener (the engine's worker thread): RUN_ABORTED, the
    collection created before the stop kept, its index never built, the lock released."""
    import asyncio

    from migronaut import AsyncMigrator

    async def main() -> RunAbortedError:
        async with AsyncMigrator(uri=project.uri, db_name=project.db_name, env_file=False,
                                 cwd=project.path,
                                 collections=[{"name": "orders",
                                               "indexes": [{"key": {"shop": 1}}]}]) as migrator:
            stop_when(migrator, lambda event: event["target"] == "collection"
                      and event["status"] == "applied")
            with pytest.raises(RunAbortedError) as caught:
                await migrator.converge()
            return caught.value

    error = asyncio.run(main())
    assert error.exit_code == 11 and error.message == "Run stopped by request"
    assert error.context["converge"]["changed"] == 1
    assert set(indexes(db, "orders")) == {"_id_"}
    assert db[HISTORY].count_documents({"success": False}) == 1
    assert db[LOCKS].count_documents({}) == 0


def test_a_rebuild_whose_create_meets_an_equivalent_index_restores_the_old_one(
    project: Any, db: Any,
) -> None:
    """Another client builds the new key under another name while the rebuild is announced: the
    create fails with 85 (IndexOptionsConflict), the dropped index comes back, the 85 hint."""
    db.r.create_index([("x", 1)], name="a")
    declared = [{"name": "r", "indexes": [{"key": {"y": 1}, "name": "a"}]}]

    def race(event: dict[str, Any]) -> None:
        if event["event"] == "converge:action" and event["status"] == "started" \
                and event["name"] == "a":
            db.r.create_index([("y", 1)], name="theirs")

    error, _ = converge_with(project, declared, race)

    assert isinstance(error, ConvergeFailedError), error
    context = error.context
    assert error.exit_code == 27 and context["phase"] == "apply"
    assert context["action"] == "recreate" and context["mongoCode"] == 85
    assert context["restored"] is True and context["dropped"] == ["a"]
    assert context["hint"].startswith("an equivalent index exists under another name")
    assert error.message.startswith('Could not rebuild index "a" on r: ')
    listed = indexes(db, "r")
    assert set(listed) == {"_id_", "a", "theirs"}
    assert dict(listed["a"]["key"]) == {"x": 1}  # the old index, restored


def test_a_stop_during_a_rebuild_lets_it_finish_then_stops(project: Any, db: Any) -> None:
    """A stop while a rebuild is in flight never interrupts it (drop and create both happen);
    the prune drop after it never runs."""
    db.r.create_index([("x", 1)], name="a")
    db.r.create_index([("z", 1)], name="z_1")
    declared = [{"name": "r", "indexes": [{"key": {"y": 1}, "name": "a"}]}]
    with make_migrator(project, collections=declared) as migrator:
        stop_when(migrator, lambda event: event["status"] == "started"
                  and event["action"] == "recreate")
        planned = migrator.converge(dry_run=True, prune=True)
        steps = [row.action for row in planned.collections[0].actions]
        assert steps == ["recreate", "drop"]
        with pytest.raises(RunAbortedError) as caught:
            migrator.converge(prune=True)
    listed = indexes(db, "r")
    assert dict(listed["a"]["key"]) == {"y": 1}  # rebuilt completely
    assert "z_1" in listed  # the drop after the stop never ran
    rows = {row["name"]: row["status"]
            for row in caught.value.context["converge"]["collections"][0]["actions"]}
    assert rows == {"a": "applied", "z_1": "skipped"}
    assert caught.value.context["converge"]["changed"] == 1


def test_races_the_server_settles_are_not_failures(project: Any, db: Any) -> None:
    """A collection created by someone else between plan and apply (48) gets the validator by
    ``collMod``; an index someone else dropped first (27) counts as dropped."""
    validator = {"$jsonSchema": {"required": ["sku"]}}
    db.old.create_index([("gone", 1)], name="gone_1")
    declared = [{"name": "items", "validator": validator, "indexes": [{"key": {"sku": 1}}]},
                {"name": "old", "prune": True, "indexes": []}]

    def race(event: dict[str, Any]) -> None:
        if event["event"] == "converge:start":
            db.create_collection("items")
        if event["event"] == "converge:action" and event["status"] == "started" \
                and event["action"] == "drop":
            db.old.drop_index("gone_1")

    result, events = converge_with(project, declared, race)

    assert not isinstance(result, Exception), result
    assert result.in_sync and result.changed == 4 and result.unstable is None
    listed = db.command("listCollections", filter={"name": "items"})["cursor"]["firstBatch"]
    assert listed[0]["options"]["validator"] == validator
    assert set(indexes(db, "items")) == {"_id_", "sku_1"}
    assert set(indexes(db, "old")) == {"_id_"}
    assert not [e for e in events if e["event"] == "converge:action" and e["status"] == "failed"]


def test_a_validator_the_server_refuses_fails_its_step_and_writes_nothing(
    project: Any, db: Any,
) -> None:
    """The server parses the validator (BadValue, 2): on a new collection the create step fails
    and nothing exists; on an existing one the collMod fails and the old validator stays."""
    bad = {"$jsonSchema": {"required": "email"}}
    error, _ = converge_with(project, [{"name": "fresh", "validator": bad}])
    assert isinstance(error, ConvergeFailedError), error
    assert (error.context["phase"], error.context["target"], error.context["mongoCode"]) == (
        "apply", "collection", 2)
    assert error.message.startswith("Could not create the collection on fresh: OperationFailure: ")
    assert "fresh" not in db.list_collection_names()

    kept = {"$jsonSchema": {"required": ["email"]}}
    db.create_collection("old", validator=kept)
    error, _ = converge_with(project, [{"name": "old", "validator": bad}])
    assert isinstance(error, ConvergeFailedError), error
    assert (error.context["target"], error.context["action"], error.context["mongoCode"]) == (
        "validator", "modify", 2)
    assert error.message.startswith("Could not modify the validator on old: ")
    listed = db.command("listCollections", filter={"name": "old"})["cursor"]["firstBatch"]
    assert listed[0]["options"]["validator"] == kept


def test_a_huge_duplicate_report_is_cut_and_says_so() -> None:
    """A 359 over a large collection lists every duplicate group; the error keeps enough to find
    them (50 groups of 20 ids) and says it was cut, instead of megabytes of ``_id``s."""
    from pymongo.errors import OperationFailure

    from migronaut.commands.converge_apply import (
        MAX_VIOLATION_GROUPS,
        MAX_VIOLATION_IDS,
        _violations,
    )

    few = OperationFailure("dup", 359, {"violations": [{"ids": [1, 2]}, {"ids": [3, 4]}]})
    assert _violations(few) == ([{"ids": [1, 2]}, {"ids": [3, 4]}], False)
    many = OperationFailure("dup", 359, {"violations": [
        {"ids": list(range(group * 100, group * 100 + 30))} for group in range(80)]})
    groups, truncated = _violations(many)
    assert truncated
    assert len(groups) == MAX_VIOLATION_GROUPS
    assert all(len(group["ids"]) == MAX_VIOLATION_IDS for group in groups)
    assert groups[0]["ids"][:3] == [0, 1, 2]
    assert _violations(OperationFailure("other", 11000, {})) == ([], False)
