"""The dev server answers like mongod 7.0: ``collMod``, ``listIndexes``, ``listCollections``.

Converge plans from what the server lists and changes it with ``collMod``; it reaches a
fixed point only if the dev server lists what ``mongod`` would. Each test creates something with
pymongo and compares the server's answer with the document ``mongod`` 7.0 returns, written out
in full. With ``MIGRONAUT_TEST_URI`` the same tests run against a real server.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from bson import SON
from pymongo.database import Database
from pymongo.errors import OperationFailure, WriteError

Db = Database[dict[str, Any]]

EN_STRENGTH_2 = {
    "locale": "en", "caseLevel": False, "caseFirst": "off", "strength": 2,
    "numericOrdering": False, "alternate": "non-ignorable", "maxVariable": "punct",
    "normalization": False, "backwards": False, "version": "57.1",
}
FR = dict(EN_STRENGTH_2, locale="fr", strength=3)


def collmod(db: Db, coll: str, **fields: Any) -> dict[str, Any]:
    reply = db.command(SON([("collMod", coll), *fields.items()]))
    reply.pop("$clusterTime", None)
    reply.pop("operationTime", None)
    return dict(reply)


def refused(send: Callable[[], Any]) -> tuple[int | None, str, dict[str, Any]]:
    with pytest.raises(OperationFailure) as caught:
        send()
    return caught.value.code, str(caught.value.details.get("errmsg")), caught.value.details or {}


def index(db: Db, coll: str, name: str) -> dict[str, Any]:
    found = [spec for spec in db[coll].list_indexes() if spec["name"] == name]
    assert len(found) == 1, [spec["name"] for spec in db[coll].list_indexes()]
    return found[0].to_dict()


def collection(db: Db, name: str) -> dict[str, Any]:
    (info,) = db.list_collections(filter={"name": name})
    info["info"].pop("uuid", None)
    return info


# ------------------------------------------------------------------------------ collMod


def test_collmod_validator_is_stored_listed_and_enforced(db: Db) -> None:
    db.create_collection("people")
    assert collmod(db, "people", validator={"age": {"$type": "int"}}) == {"ok": 1.0}
    with pytest.raises(WriteError) as caught:
        db.people.insert_one({"age": "old"})
    assert caught.value.code == 121
    assert collection(db, "people")["options"] == {"validator": {"age": {"$type": "int"}}}

    reply = collmod(db, "people", validationLevel="moderate", validationAction="warn")
    assert reply == {"ok": 1.0}
    db.people.insert_one({"age": "old"})  # warn: accepted
    assert collection(db, "people")["options"] == {
        "validator": {"age": {"$type": "int"}}, "validationLevel": "moderate",
        "validationAction": "warn"}

    collmod(db, "people", validator={}, validationLevel="strict", validationAction="error")
    db.people.insert_one({"age": "any"})
    assert collection(db, "people")["options"] == {
        "validationLevel": "strict", "validationAction": "error"}


def test_create_with_validator_lists_it_and_collmod_changes_it(db: Db) -> None:
    db.create_collection("c", validator={"a": {"$exists": True}}, validationAction="error")
    assert collection(db, "c")["options"] == {"validator": {"a": {"$exists": True}},
                                              "validationAction": "error"}
    collmod(db, "c", validator={"b": {"$exists": True}})
    db.c.insert_one({"b": 1})
    with pytest.raises(WriteError):
        db.c.insert_one({"a": 1})


@pytest.mark.parametrize(("fields", "code"), [
    ({"validationLevel": "sometimes"}, 2),
    ({"validationAction": "shout"}, 2),
    ({"validator": "a > 1"}, 14),
    ({"validator": {"$bogus": 1}}, 2),
    ({"nonsense": 1}, 40415),
    ({"index": {"hidden": True}}, 72),
    ({"index": {"name": "a_1", "keyPattern": {"a": 1}, "hidden": True}}, 72),
    ({"index": {"name": "a_1"}}, 72),
    ({"index": {"name": "nope_1", "hidden": True}}, 27),
    ({"index": {"keyPattern": {"zz": 1}, "hidden": True}}, 27),
    ({"index": {"name": "_id_", "hidden": True}}, 2),
    ({"index": {"name": "a_1", "unique": True}}, 72),
    ({"index": {"name": "a_1", "unique": False}}, 72),
    ({"index": {"name": "a_1_b_1", "expireAfterSeconds": 10}}, 72),
    ({"index": {"name": "a_1", "expireAfterSeconds": -1}}, 72),
])
def test_collmod_refusals(db: Db, fields: dict[str, Any], code: int) -> None:
    db.c.create_index("a")
    db.c.create_index([("a", 1), ("b", 1)])
    assert refused(lambda: collmod(db, "c", **fields))[0] == code
    assert collection(db, "c")["options"] == {}


def test_collmod_on_a_missing_collection_is_namespace_not_found(db: Db) -> None:
    code, message, _ = refused(lambda: collmod(db, "ghost", validator={}))
    assert code == 26
    assert "ns does not exist" in message


def test_collmod_index_hidden_and_ttl_reply_old_and_new(db: Db) -> None:
    db.c.create_index("at", name="at_1")
    assert collmod(db, "c", index={"name": "at_1", "hidden": True}) == {
        "hidden_old": False, "hidden_new": True, "ok": 1.0}
    assert index(db, "c", "at_1") == {"v": 2, "key": {"at": 1}, "name": "at_1", "hidden": True}
    assert collmod(db, "c", index={"keyPattern": {"at": 1}, "expireAfterSeconds": 60}) == {
        "expireAfterSeconds_new": 60, "ok": 1.0}
    assert collmod(db, "c", index={"name": "at_1", "expireAfterSeconds": 30}) == {
        "expireAfterSeconds_old": 60, "expireAfterSeconds_new": 30, "ok": 1.0}
    assert collmod(db, "c", index={"name": "at_1", "hidden": False}) == {
        "hidden_old": True, "hidden_new": False, "ok": 1.0}
    assert index(db, "c", "at_1") == {"v": 2, "key": {"at": 1}, "name": "at_1",
                                      "expireAfterSeconds": 30}


def test_collmod_unique_conversion_needs_prepare_unique_and_no_duplicates(db: Db) -> None:
    db.c.insert_many([{"_id": 1, "e": "x"}, {"_id": 2, "e": "x"}, {"_id": 3, "e": "y"}])
    db.c.create_index("e", name="e_1")
    code, message, _ = refused(
        lambda: collmod(db, "c", index={"name": "e_1", "unique": True}))
    assert (code, "prepareUnique" in message) == (72, True)

    assert collmod(db, "c", index={"name": "e_1", "prepareUnique": True}) == {
        "prepareUnique_old": False, "prepareUnique_new": True, "ok": 1.0}
    assert index(db, "c", "e_1") == {"v": 2, "key": {"e": 1}, "name": "e_1",
                                     "prepareUnique": True}
    code, _, details = refused(lambda: collmod(db, "c", index={"name": "e_1", "unique": True}))
    assert code == 359
    assert details["codeName"] == "CannotConvertIndexToUnique"
    assert [sorted(group["ids"]) for group in details["violations"]] == [[1, 2]]
    assert not index(db, "c", "e_1").get("unique")  # left unchanged

    db.c.delete_one({"_id": 2})
    assert collmod(db, "c", index={"name": "e_1", "unique": True}) == {
        "unique_new": True, "ok": 1.0}
    assert index(db, "c", "e_1")["unique"] is True
    with pytest.raises(WriteError) as caught:
        db.c.insert_one({"e": "x"})
    assert caught.value.code == 11000


# ------------------------------------------------------------------------------ listIndexes


@pytest.mark.parametrize(("keys", "options", "expected"), [
    ([("a", 1)], {}, {"key": {"a": 1}, "name": "a_1"}),
    ([("a", 1)], {"unique": True, "sparse": True},
     {"key": {"a": 1}, "name": "a_1", "unique": True, "sparse": True}),
    ([("a", -1)], {"unique": False}, {"key": {"a": -1}, "name": "a_-1", "unique": False}),
    ([("at", 1)], {"expireAfterSeconds": 3600, "hidden": True},
     {"key": {"at": 1}, "name": "at_1", "expireAfterSeconds": 3600, "hidden": True}),
    ([("p", 1)], {"partialFilterExpression": {"p": {"$gt": 5}}},
     {"key": {"p": 1}, "name": "p_1", "partialFilterExpression": {"p": {"$gt": 5}}}),
    ([("c", 1)], {"collation": {"locale": "en", "strength": 2}},
     {"key": {"c": 1}, "name": "c_1", "collation": EN_STRENGTH_2}),
    ([("c", 1)], {"collation": {"locale": "simple"}}, {"key": {"c": 1}, "name": "c_1"}),
    ([("title", "text"), ("body", "text")], {"weights": {"title": 10}},
     {"key": {"_fts": "text", "_ftsx": 1}, "name": "title_text_body_text",
      "weights": {"body": 1, "title": 10}, "default_language": "english",
      "language_override": "language", "textIndexVersion": 3}),
    ([("shop", 1), ("t", "text")], {"default_language": "french", "language_override": "lang"},
     {"key": {"shop": 1, "_fts": "text", "_ftsx": 1}, "name": "shop_1_t_text",
      "weights": {"t": 1}, "default_language": "french", "language_override": "lang",
      "textIndexVersion": 3}),
    ([("loc", "2d")], {"bits": 20, "min": -100, "max": 100},
     {"key": {"loc": "2d"}, "name": "loc_2d", "bits": 20, "min": -100, "max": 100}),
    ([("geo", "2dsphere")], {},
     {"key": {"geo": "2dsphere"}, "name": "geo_2dsphere", "2dsphereIndexVersion": 3}),
    ([("h", "hashed")], {}, {"key": {"h": "hashed"}, "name": "h_hashed"}),
    ([("$**", 1)], {"wildcardProjection": {"a": 1}},
     {"key": {"$**": 1}, "name": "$**_1", "wildcardProjection": {"a": 1}}),
])
def test_list_indexes_like_mongod(
    db: Db, keys: list[tuple[str, Any]], options: dict[str, Any], expected: dict[str, Any]
) -> None:
    name = db.c.create_index(keys, **options)
    listed = index(db, "c", name)
    assert listed == {"v": 2, **expected}
    assert list(listed["key"]) == list(expected["key"])
    assert index(db, "c", "_id_") == {"v": 2, "key": {"_id": 1}, "name": "_id_"}


def test_a_listed_text_index_can_be_created_again_as_listed(db: Db) -> None:
    """Converge restores a dropped index from its listed spec (``_fts`` key included)."""
    db.c.create_index([("title", "text")], weights={"title": 3}, name="t")
    spec = index(db, "c", "t")
    db.c.drop_index("t")
    db.command("createIndexes", "c", indexes=[{k: v for k, v in spec.items() if k != "v"}])
    assert index(db, "c", "t") == spec


def test_unknown_text_language_is_refused(db: Db) -> None:
    code, message, _ = refused(
        lambda: db.c.create_index([("x", "text")], default_language="klingon"))
    assert code == 17262
    assert "unsupported language" in message


def test_an_equivalent_index_under_another_name_is_index_options_conflict(db: Db) -> None:
    """mongod's 85: the same key (and collation, partial filter) under another name — "already
    exists with a different name" with the same options, "equivalent … different name and
    options" otherwise; the same name stays 86. Converge's rebuild hint depends on it."""
    db.c.create_index("x", name="a")
    code, message, _ = refused(lambda: db.c.create_index("x", name="b"))
    assert (code, message) == (85, "Index already exists with a different name: a")
    code, message, _ = refused(lambda: db.c.create_index("x", name="b", unique=True))
    assert code == 85
    assert message.startswith("An equivalent index already exists with a different name and "
                              "options.")
    assert refused(lambda: db.c.create_index("y", name="a"))[0] == 86
    assert [i["name"] for i in db.c.list_indexes()] == ["_id_", "a"]


def test_create_refusals_carry_mongods_codes(db: Db) -> None:
    """An existing name is 48, which converge's createCollection step recognises (created
    meanwhile); a validator that does not parse is 2, as in collMod."""
    db.create_collection("c")
    code, message, details = refused(lambda: db.command({"create": "c", "validator": {}}))
    assert (code, details["codeName"]) == (48, "NamespaceExists")
    assert message == f"Collection {db.name}.c already exists."
    code, message, _ = refused(lambda: db.command(
        {"create": "d", "validator": {"$jsonSchema": {"required": "email"}}}))
    assert code == 2 and "required" in message
    assert "d" not in db.list_collection_names()


def test_index_inherits_the_collection_collation(db: Db) -> None:
    db.create_collection("c", collation={"locale": "fr"})
    db.c.create_index("a")
    db.c.create_index("b", collation={"locale": "simple"})
    assert index(db, "c", "a_1") == {"v": 2, "key": {"a": 1}, "name": "a_1", "collation": FR}
    assert index(db, "c", "b_1") == {"v": 2, "key": {"b": 1}, "name": "b_1"}


# ------------------------------------------------------------------------------ listCollections


def test_list_collections_like_mongod(db: Db) -> None:
    db.create_collection("plain")
    db.create_collection("french", collation={"locale": "fr"})
    db.create_collection("v", viewOn="plain", pipeline=[{"$match": {"x": 1}}])
    db.create_collection("ts", timeseries={"timeField": "t", "metaField": "m"})
    assert collection(db, "plain") == {
        "name": "plain", "type": "collection", "options": {}, "info": {"readOnly": False},
        "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}}
    assert collection(db, "french") == {
        "name": "french", "type": "collection", "options": {"collation": FR},
        "info": {"readOnly": False},
        "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_", "collation": FR}}
    assert collection(db, "v") == {
        "name": "v", "type": "view", "info": {"readOnly": True},
        "options": {"viewOn": "plain", "pipeline": [{"$match": {"x": 1}}]}}
    assert collection(db, "ts") == {
        "name": "ts", "type": "timeseries", "info": {"readOnly": False},
        "options": {"timeseries": {"timeField": "t", "metaField": "m",
                                   "granularity": "seconds", "bucketMaxSpanSeconds": 3600}}}
    names = {entry["name"]: entry["type"]
             for entry in db.list_collections(nameOnly=True, authorizedCollections=True)}
    assert {name: names[name] for name in ("plain", "v", "ts")} == {
        "plain": "collection", "v": "view", "ts": "timeseries"}
