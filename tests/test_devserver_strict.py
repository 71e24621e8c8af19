"""The server refuses what mongod refuses, with mongod's codes — and the wire audit sees it too.

Each test sends a command a real ``mongod`` refuses, with pymongo, and checks the error code,
that nothing was written, and that the test suite's wire audit (``tests/helpers/wire_audit.py``)
found the same rule broken. Against the dev server (strict by default) the refusal comes from its
wire layer (``migronaut.devserver.wire``); with ``MIGRONAUT_TEST_URI`` the same tests run against
the real server, which is how the codes are kept honest.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import OperationFailure, WriteError

from helpers.wire_audit import AUDIT, audit_command
from migronaut.devserver.mongod_rules import check_command, check_pipeline, check_update

SEED = {"_id": 1, "plan": {"token": "t", "partitions": 3}, "a": {"c": 2}, "n": 5}


@pytest.fixture
def coll(db: Database[dict[str, Any]]) -> Collection[dict[str, Any]]:
    db.items.insert_one(dict(SEED))
    return db.items


def refused(send: Callable[[], Any]) -> tuple[int, str, list[str]]:
    """Run ``send`` expecting mongod's refusal: its code, its message, what the audit found."""
    with AUDIT.allowing() as seen, pytest.raises(OperationFailure) as caught:
        send()
    error = caught.value
    details = error.details or {}
    if isinstance(error, WriteError) or "writeErrors" in details:
        first = (details.get("writeErrors") or [details])[0]
        return int(first["code"]), str(first["errmsg"]), [f.rule for f in seen]
    return int(error.code or 0), str(details.get("errmsg", error)), [f.rule for f in seen]


def unchanged(coll: Collection[dict[str, Any]]) -> bool:
    return coll.find_one({"_id": 1}) == SEED


# ------------------------------------------------------------------- conflicting paths: 40176


def test_a_set_stage_naming_a_path_and_its_sub_path_is_40176(
    coll: Collection[dict[str, Any]]
) -> None:
    """The bug this layer was built for: ``plan`` and ``plan.at`` in one ``$set`` stage."""
    code, message, seen = refused(lambda: coll.update_one(
        {"_id": 1}, [{"$set": {"plan": {"$literal": {"token": "u"}}, "plan.at": "$$NOW"}}]))
    assert code == 40176
    assert "conflicting paths" in message and "plan" in message
    assert any("40176" in rule for rule in seen)
    assert unchanged(coll)


def test_find_one_and_update_and_aggregate_answer_40176_for_the_whole_command(
    coll: Collection[dict[str, Any]]
) -> None:
    stage = {"$set": {"coordinator": {"$literal": {"kind": "cli"}}, "coordinator.at": "$$NOW"}}
    code, _, seen = refused(lambda: coll.find_one_and_update({"_id": 1}, [stage]))
    assert code == 40176 and seen
    code, _, seen = refused(lambda: list(coll.aggregate([stage])))
    assert code == 40176 and seen
    # a nested spec counts as its leaf paths: {a: {b}} and a.b conflict
    code, _, _ = refused(lambda: list(coll.aggregate([{"$addFields": {"a": {"b": 1},
                                                                      "a.b": 2}}])))
    assert code == 40176
    assert unchanged(coll)


def test_sibling_paths_in_one_set_stage_are_fine(coll: Collection[dict[str, Any]]) -> None:
    coll.update_one({"_id": 1}, [{"$set": {"plan.at": "$$NOW", "plan.partitions": 4,
                                           "n": {"$add": ["$n", 1]}}}])
    stored = coll.find_one({"_id": 1}) or {}
    assert stored["plan"]["partitions"] == 4 and "at" in stored["plan"] and stored["n"] == 6


def test_projection_and_unset_collisions_are_31249_and_31250(
    coll: Collection[dict[str, Any]]
) -> None:
    code, message, seen = refused(lambda: list(coll.aggregate([{"$project": {"a": 1,
                                                                             "a.c": 1}}])))
    assert code == 31249 and "Path collision at a.c" in message and seen
    code, _, _ = refused(lambda: list(coll.aggregate([{"$project": {"a.c": 1, "a": 1}}])))
    assert code == 31250
    code, _, seen = refused(lambda: coll.update_one({"_id": 1}, [{"$unset": ["a", "a.c"]}]))
    assert code == 31249 and seen
    assert unchanged(coll)


# ------------------------------------------------------------------ update operator documents


def test_operators_touching_a_path_and_its_sub_path_are_40(
    coll: Collection[dict[str, Any]]
) -> None:
    code, message, seen = refused(lambda: coll.update_one(
        {"_id": 1}, {"$set": {"a": {"x": 1}}, "$inc": {"a.c": 1}}))
    assert code == 40
    assert message == "Updating the path 'a.c' would create a conflict at 'a'"
    assert any("ConflictingUpdateOperators" in rule for rule in seen)
    code, message, _ = refused(lambda: coll.update_one(
        {"_id": 1}, {"$set": {"n": 1}, "$unset": {"n": ""}}))
    assert code == 40 and "conflict at 'n'" in message
    assert unchanged(coll)


def test_mixed_update_documents_are_refused(coll: Collection[dict[str, Any]]) -> None:
    # operators first: the plain key is an unknown modifier
    code, message, seen = refused(lambda: coll.update_one({"_id": 1},
                                                          {"$set": {"n": 1}, "b": 2}))
    assert code == 9 and message.startswith("Unknown modifier: b.") and seen
    # a plain key first: a replacement, whose $-prefixed top-level name is refused
    code, message, seen = refused(lambda: coll.replace_one({"_id": 1},
                                                           {"b": 2, "$set": {"n": 1}}))
    assert code == 52 and "'$set'" in message and "replacement document" in message and seen
    assert unchanged(coll)


def test_unknown_operators_and_non_document_arguments_are_9(
    coll: Collection[dict[str, Any]]
) -> None:
    code, message, seen = refused(lambda: coll.update_one({"_id": 1}, {"$sett": {"n": 1}}))
    assert code == 9 and message.startswith("Unknown modifier: $sett.") and seen
    code, message, _ = refused(lambda: coll.update_one({"_id": 1}, {"$set": 3}))
    assert code == 9 and "Modifiers operate on fields" in message
    assert unchanged(coll)


def test_empty_update_paths_are_56(coll: Collection[dict[str, Any]]) -> None:
    code, message, seen = refused(lambda: coll.update_one({"_id": 1}, {"$set": {"a..c": 1}}))
    assert code == 56 and "empty field name" in message and seen
    assert unchanged(coll)


def test_a_replacement_with_multi_and_an_empty_batch_are_refused(
    coll: Collection[dict[str, Any]], db: Database[dict[str, Any]]
) -> None:
    def multi_replacement() -> Any:
        reply = db.command("update", "items",
                           updates=[{"q": {}, "u": {"n": 0}, "multi": True}])
        if reply.get("writeErrors"):
            raise WriteError(reply["writeErrors"][0]["errmsg"],
                             reply["writeErrors"][0]["code"], reply["writeErrors"][0])
        return reply

    code, message, seen = refused(multi_replacement)
    assert code == 9 and "multi update is not supported for replacement" in message and seen
    code, message, seen = refused(lambda: db.command("update", "items", updates=[]))
    assert code == 16 and "Got 0 operations" in message and seen
    assert unchanged(coll)


def test_pipeline_updates_take_only_the_update_stages(coll: Collection[dict[str, Any]]) -> None:
    code, message, seen = refused(lambda: coll.update_one({"_id": 1}, [{"$match": {}}]))
    assert code == 72 and message == "$match is not allowed to be used within an update"
    assert seen
    assert unchanged(coll)


def test_a_value_that_needed_literal_is_an_undefined_variable(
    coll: Collection[dict[str, Any]]
) -> None:
    """A user string like ``$$x`` put in a pipeline without ``$literal`` fails on mongod."""
    code, message, seen = refused(lambda: coll.update_one(
        {"_id": 1}, [{"$set": {"label": "$$x"}}]))
    assert code == 17276 and "undefined variable: x" in message and seen
    coll.update_one({"_id": 1}, [{"$set": {"label": {"$literal": "$$x"}}}])
    assert (coll.find_one({"_id": 1}) or {})["label"] == "$$x"
    coll.update_one({"_id": 1}, [{"$set": {"doubled": {"$map": {
        "input": [1, 2], "as": "v", "in": {"$multiply": ["$$v", 2]}}}}}])
    assert (coll.find_one({"_id": 1}) or {})["doubled"] == [2, 4]


# --------------------------------------------------------------------- batches and semantics


def test_an_ordered_batch_stops_at_the_refused_statement_an_unordered_one_goes_on(
    db: Database[dict[str, Any]]
) -> None:
    db.items.insert_many([{"_id": i, "n": 0} for i in range(3)])
    statements = [
        {"q": {"_id": 0}, "u": {"$set": {"n": 1}}},
        {"q": {"_id": 1}, "u": {"$set": {"n": 1}, "$inc": {"n": 1}}},
        {"q": {"_id": 2}, "u": {"$set": {"n": 1}}},
        {"q": {"_id": 3}, "u": {"$set": {"n": 1}}, "upsert": True},
    ]
    with AUDIT.allowing():
        ordered = db.command("update", "items", updates=statements)
    assert ordered["n"] == 1 and [e["index"] for e in ordered["writeErrors"]] == [1]
    assert ordered["writeErrors"][0]["code"] == 40
    assert [d["n"] for d in db.items.find(sort=[("_id", 1)])] == [1, 0, 0]

    with AUDIT.allowing():
        unordered = db.command("update", "items", updates=statements, ordered=False)
    assert [e["index"] for e in unordered["writeErrors"]] == [1]
    assert [u["index"] for u in unordered["upserted"]] == [3]  # the client's indexes
    assert [d["n"] for d in db.items.find(sort=[("_id", 1)])] == [1, 0, 1, 1]


def test_a_nested_document_in_a_set_stage_merges_into_the_stored_object_as_on_mongod(
    coll: Collection[dict[str, Any]]
) -> None:
    """mongod reads ``{"a": {"b": 1}}`` in a pipeline ``$set`` as sub-fields of ``a``: the
    stored object keeps its other fields (an expression such as ``$mergeObjects`` replaces)."""
    coll.update_one({"_id": 1}, [{"$set": {"a": {"b": 1}}}])
    assert (coll.find_one({"_id": 1}) or {})["a"] == {"c": 2, "b": 1}
    coll.update_one({"_id": 1}, [{"$set": {"a": {"$mergeObjects": [{"z": 1}]}}}])
    assert (coll.find_one({"_id": 1}) or {})["a"] == {"z": 1}
    coll.update_one({"_id": 1}, [{"$set": {"n": {"k": "$n"}}}])  # a scalar becomes an object
    assert (coll.find_one({"_id": 1}) or {})["n"] == {"k": 5}


@pytest.mark.skipif(bool(os.environ.get("MIGRONAUT_TEST_URI")), reason="starts a dev server")
def test_no_strict_serves_what_mongoeco_accepts() -> None:
    from migronaut.devserver import start_subprocess

    with start_subprocess(strict=False) as server:
        client: MongoClient[dict[str, Any]] = MongoClient(server.uri)
        try:
            coll = client.lenient.items
            coll.insert_one({"_id": 1})
            with AUDIT.allowing() as seen:
                coll.update_one({"_id": 1}, [{"$set": {"p": {"$literal": {"x": 1}},
                                                       "p.at": 2}}])
            assert seen  # the audit still sees it: only the server was lenient
        finally:
            client.close()


# ------------------------------------------------------------------------------ the checker


def test_the_checker_passes_what_migronaut_sends_and_names_each_rule() -> None:
    assert check_update([{"$set": {"plan": {"$mergeObjects": [{"$literal": {"t": 1}},
                                                               {"at": "$$NOW"}]}}}]) is None
    assert check_update({"$set": {"a.b": 1, "a.c": 2}, "$inc": {"d": 1}}) is None
    assert check_update({"n": 1}) is None  # a replacement
    assert check_pipeline([{"$match": {"$expr": {"$eq": ["$$NOW", "$$NOW"]}}}]) is None
    bound = [{"$set": {"x": {"$let": {"vars": {"v": 1}, "in": "$$v"}},
                       "y": {"$reduce": {"input": [], "initialValue": 0,
                                         "in": {"$add": ["$$value", "$$this"]}}}}}]
    assert check_pipeline(bound) is None
    problem = check_update("nope")
    assert problem is not None and problem.code == 9
    assert [v.index for v in check_command({"update": "c", "updates": [
        {"q": {}, "u": {"$set": {"a": 1}}}, {"q": {}, "u": {"$set": {"a": 1}, "a": 2}}]})] == [1]


def test_the_audit_holds_our_collections_to_primary_reads_and_plain_field_names() -> None:
    secondary = {"find": "_migronaut_background", "filter": {},
                 "$readPreference": {"mode": "secondaryPreferred"}}
    assert [f.rule for f in audit_command("find", secondary)] == [
        "own state read with readPreference secondaryPreferred"]
    assert audit_command("find", {**secondary, "find": "users"}) == []  # user data: their call
    stored = {"update": "_migronaut_background", "updates": [{"q": {"_id": "x"}, "u": [
        {"$set": {"spec": {"$literal": {"filter": {"status": {"$in": ["a"]}}}},
                  "history": {"$literal": [{"$oops": 1}]}}}]}]}
    rules = [f.rule for f in audit_command("update", stored)]
    # the stored query filter keeps its operators (as the original stores it); nothing else may
    assert rules == ["stores a $-prefixed field name at updates[0].u.history[0].$oops"]
    inserted = {"insert": "_migronaut_runs", "documents": [{"ok": 1}, {"a": {"$b": 1}}]}
    assert [f.rule for f in audit_command("insert", inserted)] == [
        "stores a $-prefixed field name at documents[1].a.$b"]


def test_an_unknown_command_is_command_not_found_59(db: Database[dict[str, Any]]) -> None:
    """mongod's answer to a command it does not know (``mongosh`` probes ``atlasVersion``)."""
    with pytest.raises(OperationFailure) as caught:
        db.command("noSuchCommandAnywhere")
    assert caught.value.code == 59
    assert (caught.value.details or {}).get("codeName") == "CommandNotFound"
    assert "no such command: 'noSuchCommandAnywhere'" in str(caught.value)
