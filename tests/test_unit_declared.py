"""Declared collections, pure: one definition's rules, the normalized model the converge planner
consumes, and the canonical comparison (reference collections.md §1.2–§1.4, §3.2, §7.1)."""

from __future__ import annotations

import datetime
import re
import uuid
from typing import Any

import pytest
from bson import Decimal128, Int64, ObjectId, Regex

from migronaut.declared.canonical import canonical, fill_collation_defaults, same
from migronaut.declared.definition import CollectionDefinition, validate_definition
from migronaut.declared.indexes import DeclaredIndex, default_index_name, server_key
from migronaut.declared.inline import reserved_names, validate_inline
from migronaut.declared.issues import MESSAGE, Issues, invalid_definitions
from migronaut.declared.search import DeclaredSearchIndex
from migronaut.declared.versioning import VersioningSpec

RESERVED = reserved_names(migrations_collection="_migronaut_migrations",
                          lock_collection="_migronaut_locks",
                          converge_log_collection="_migronaut_converge",
                          background_collection="_migronaut_background",
                          runs_collection="_migronaut_runs")


def check(raw: Any, *, style: str = "python", fallback: str | None = None,
          prefix: str = "", base: str = "") -> tuple[CollectionDefinition | None, list[Any]]:
    issues = Issues(prefix=prefix)
    definition = validate_definition(raw, issues, base=base, style=style,  # type: ignore[arg-type]
                                     fallback_name=fallback, reserved=RESERVED)
    return definition, issues.found


def problems(raw: Any, **kw: Any) -> dict[str, str]:
    definition, found = check(raw, **kw)
    assert definition is None, "a definition with issues must not be built"
    return {issue["path"]: issue["message"] for issue in found}


def one_index(index: dict[str, Any]) -> DeclaredIndex:
    definition, found = check({"name": "c", "indexes": [index]})
    assert found == [] and definition is not None and definition.indexes
    return definition.indexes[0]


# ------------------------------------------------------------------------- the definition


def test_a_full_definition_is_normalized() -> None:
    definition, found = check({
        "name": "users",
        "indexes": [{"key": {"email": 1}, "unique": True},
                    {"key": {"createdAt": 1}, "expireAfterSeconds": 2_592_000},
                    {"key": {"name": 1}, "collation": {"locale": "en", "strength": 2}}],
        "validator": {"$jsonSchema": {"required": ["email"]}},
        "validation_level": "moderate", "validation_action": "warn", "prune": True,
    })
    assert found == []
    assert definition == CollectionDefinition(
        name="users", source="", indexes=definition.indexes if definition else None,
        manages_validator=True, validator={"$jsonSchema": {"required": ["email"]}},
        validation_level="moderate", validation_action="warn", prune=True,
    )
    assert definition is not None and definition.indexes is not None
    assert [i.name for i in definition.indexes] == ["email_1", "createdAt_1", "name_1"]
    assert definition.search_indexes is None and definition.versioning is None


def test_the_model_is_frozen_and_detached_from_the_input() -> None:
    raw = {"name": "c", "indexes": [{"key": {"a": 1}, "partialFilterExpression": {"a": 1}}],
           "validator": {"a": {"$exists": True}}}
    definition, _ = check(raw)
    assert definition is not None and definition.indexes is not None
    raw["validator"]["a"] = 0  # type: ignore[index]
    raw["indexes"][0]["partialFilterExpression"]["a"] = 2  # type: ignore[index]
    assert definition.validator == {"a": {"$exists": True}}
    assert definition.indexes[0].options["partialFilterExpression"] == {"a": 1}
    with pytest.raises(AttributeError):
        definition.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize("validator", [None, {}])
def test_validator_none_or_empty_means_no_validator_but_managed(validator: Any) -> None:
    definition, found = check({"name": "c", "validator": validator})
    assert found == [] and definition is not None
    assert definition.manages_validator and definition.validator is None


def test_an_omitted_validator_is_unmanaged() -> None:
    definition, _ = check({"name": "c", "indexes": []})
    assert definition is not None and not definition.manages_validator
    assert definition.indexes == ()


def test_nothing_to_manage() -> None:
    assert problems({"name": "c", "prune": True}, base="collections[0]") == {
        "collections[0]": "has nothing to manage: declare indexes, search_indexes, validator "
                          "or versioning"}
    assert problems({}, style="json", fallback="b", prefix="b.json") == {
        "b.json": "has nothing to manage: declare indexes, searchIndexes, validator or "
                  "versioning"}


def test_unknown_keys_name_the_expected_list_and_the_other_spelling() -> None:
    found = problems({"name": "c", "indexes": [], "searchIndexes": []}, base="collections[1]")
    assert found["collections[1].searchIndexes"].startswith(
        "is not a definition key (expected one of name, indexes, search_indexes, validator, "
        "validation_level, validation_action, prune, versioning)")
    assert found["collections[1].searchIndexes"].endswith("did you mean 'search_indexes'?")
    found = problems({"indexes": [], "validation_level": "strict", "validator": {"a": 1}},
                     style="json", fallback="a", prefix="a.json")
    assert found["a.json: validation_level"].endswith("did you mean 'validationLevel'?")
    assert problems({"name": "c", "indexs": []}, base="collections[0]")[
        "collections[0].indexs"].endswith("did you mean 'indexes'?")


def test_not_a_mapping() -> None:
    assert problems(["users"], base="collections[3]") == {
        "collections[3]": "must be a mapping (got list)"}


@pytest.mark.parametrize(("name", "message"), [
    ("", "must be a non-empty string"),
    (3, "must be a non-empty string"),
    ("a$b", "must not contain '$' or NUL"),
    ("a\x00b", "must not contain '$' or NUL"),
    ("system.users", "must not start with 'system.'"),
])
def test_name_rules(name: Any, message: str) -> None:
    assert problems({"name": name, "indexes": []}, base="collections[0]") == {
        "collections[0].name": message}


def test_inline_name_is_required_and_a_file_gives_one() -> None:
    assert problems({"indexes": []}, base="collections[0]") == {
        "collections[0].name": "is required"}
    definition, _ = check({"indexes": []}, fallback="plans")
    assert definition is not None and definition.name == "plans"
    definition, _ = check({"name": "other", "indexes": []}, fallback="plans")
    assert definition is not None and definition.name == "other"


def test_a_bad_file_derived_name_asks_for_an_explicit_name() -> None:
    assert problems({"indexes": []}, fallback="system.x", prefix="system.x.json",
                    style="json") == {"system.x.json: name": (
                        "the file name gives 'system.x', which must not start with 'system.'; "
                        "set name explicitly in the definition")}


@pytest.mark.parametrize("name", sorted(RESERVED))
def test_reserved_names_are_refused(name: str) -> None:
    assert problems({"name": name, "indexes": []}, base="collections[0]") == {
        "collections[0].name": f'"{name}" is one of migronaut\'s own collections and cannot '
                               "be declared"}


def test_reserved_names_follow_the_configured_collections() -> None:
    names = reserved_names(migrations_collection="m", lock_collection="l",
                           converge_log_collection="c", background_collection="bg",
                           runs_collection="r")
    assert names == {"m", "l", "c", "c_rebuilds", "bg", "bg_partitions", "bg_watch", "r",
                     "r_logs"}


@pytest.mark.parametrize("key", ["validation_level", "validation_action"])
def test_level_and_action_need_a_validator_or_versioning(key: str) -> None:
    value = "moderate" if key == "validation_level" else "warn"
    for validator in ({}, None):
        found = problems({"name": "c", "indexes": [], "validator": validator, key: value})
        assert found == {key: "has no effect without a validator (or versioning)"}
    assert problems({"name": "c", "indexes": [], key: value}) == {
        key: "has no effect without a validator (or versioning)"}
    definition, found = check({"name": "c", "versioning": {"current": 1}, key: value})
    assert found == [] and definition is not None


def test_level_and_action_values() -> None:
    found = problems({"name": "c", "validator": {"a": 1}, "validation_level": "loose",
                      "validation_action": "ignore"})
    assert found == {"validation_level": "must be one of 'off', 'strict', 'moderate'",
                     "validation_action": "must be one of 'error', 'warn', 'errorAndLog'"}


def test_prune_must_be_a_boolean() -> None:
    assert problems({"name": "c", "indexes": [], "prune": "yes"}) == {
        "prune": "must be a boolean"}


# ------------------------------------------------------------------------- validators


def test_a_validator_with_a_function_is_refused() -> None:
    found = problems({"name": "c", "validator": {"$where": lambda doc: True}},
                     base="collections[0]")
    assert found["collections[0].validator.$where"].startswith("is a function")


def test_a_validator_that_is_not_a_mapping() -> None:
    assert problems({"name": "c", "validator": "x"}) == {
        "validator": "must be a mapping (a query document or {$jsonSchema: …}) or None"}


def test_unsendable_values_in_a_validator() -> None:
    circular: dict[str, Any] = {}
    circular["self"] = circular
    found = problems({"name": "c", "validator": {
        "u": uuid.UUID(int=1), "big": 2**70, "loop": circular, "s": {1, 2},
        "ok": [datetime.datetime(2024, 1, 1), ObjectId(), Decimal128("1.5"), Int64(3), b"x"],
    }})
    assert found["validator.u"] == ("is a UUID, which cannot be stored as written "
                                    "(use bson.Binary.from_uuid)")
    assert found["validator.big"] == "is an integer out of the 64-bit range BSON can store"
    assert found["validator.loop.self"] == "is a circular structure"
    assert found["validator.s"] == "is a set, which cannot be stored as written"
    assert not any(path.startswith("validator.ok") for path in found)


@pytest.mark.parametrize("value", [
    re.compile("^a", re.IGNORECASE | re.MULTILINE), re.compile("^a"), Regex("^a", "im"),
    Regex("^a", "u"), Regex("^a", re.IGNORECASE),
])
def test_regex_flags_i_and_m_are_accepted(value: Any) -> None:
    definition, found = check({"name": "c", "validator": {"email": {"$regex": value}}})
    assert found == [] and definition is not None


@pytest.mark.parametrize(("value", "named"), [
    (re.compile("^a", re.DOTALL), "s (DOTALL)"),
    (re.compile("^a", re.VERBOSE), "x (VERBOSE)"),
    (re.compile("^a", re.ASCII), "a (ASCII)"),
    (Regex("^a", "is"), "s (DOTALL)"),
    (Regex("^a", "x"), "x (VERBOSE)"),
    (Regex("^a", re.DOTALL), "s (DOTALL)"),
])
def test_other_regex_flags_cannot_be_stored_as_written(value: Any, named: str) -> None:
    found = problems({"name": "c", "indexes": [
        {"key": {"e": 1}, "partialFilterExpression": {"e": value}}]})
    assert found == {"indexes[0].partialFilterExpression.e": (
        f"uses regex flag(s) {named} that cannot be stored as written (only i and m)")}


# ------------------------------------------------------------------------- indexes


@pytest.mark.parametrize(("key", "name"), [
    ({"email": 1}, "email_1"), ({"a": 1, "b": -1}, "a_1_b_-1"), ({"title": "text"}, "title_text"),
    ({"hashedField": "hashed"}, "hashedField_hashed"), ({"$**": 1}, "$**_1"),
    ({"meta.$**": 1}, "meta.$**_1"), ({"z": 1, "a": -1}, "z_1_a_-1"), ({"loc": "2dsphere"},
                                                                     "loc_2dsphere"),
    ([("email", 1), ("at", -1)], "email_1_at_-1"), ({"a": 1.0, "b": Int64(-1)}, "a_1_b_-1"),
    ({"0": 1, "a": 1}, "0_1_a_1"),
])
def test_default_index_names(key: Any, name: str) -> None:
    assert one_index({"key": key}).name == name


def test_a_declared_name_wins() -> None:
    assert one_index({"key": {"a": 1}, "name": "by_a"}).name == "by_a"


def test_text_fields_collapse_into_fts_at_the_first_text_field() -> None:
    index = one_index({"key": {"a": 1, "title": "text", "b": -1, "body": "text"},
                       "weights": {"title": 5}})
    assert index.is_text
    assert index.key == (("a", 1), ("title", "text"), ("b", -1), ("body", "text"))
    assert index.server_key == (("a", 1), ("_fts", "text"), ("_ftsx", 1), ("b", -1))
    assert index.name == "a_1_title_text_b_-1_body_text"
    assert server_key((("x", 1),)) == (("x", 1),)
    assert default_index_name((("x", 1),)) == "x_1"


def test_options_drop_false_booleans_and_background() -> None:
    index = one_index({"key": {"a": 1}, "unique": True, "sparse": False, "hidden": False,
                       "background": True, "expireAfterSeconds": 60.0, "bits": 26})
    assert dict(index.options) == {"unique": True, "expireAfterSeconds": 60, "bits": 26}
    assert index.spec() == {"key": {"a": 1}, "name": "a_1", "unique": True,
                            "expireAfterSeconds": 60, "bits": 26}
    assert not index.is_text and not index.is_version_index


def test_the_spec_keeps_key_order_and_is_a_fresh_copy() -> None:
    index = one_index({"key": {"z": 1, "a": -1}, "partialFilterExpression": {"z": {"$gt": 1}}})
    spec = index.spec()
    assert list(spec["key"].items()) == [("z", 1), ("a", -1)]
    spec["partialFilterExpression"]["z"] = 0
    assert index.options["partialFilterExpression"] == {"z": {"$gt": 1}}


@pytest.mark.parametrize(("index", "path", "message"), [
    ({}, "key", "is required"),
    ({"key": {}}, "key", "must name at least one field"),
    ({"key": "email"}, "key", "must be a mapping of field → direction (or a list of "
                              "(field, direction) pairs)"),
    ({"key": {"": 1}}, "key", "field names must be non-empty strings (got '')"),
    ({"key": {"a": 2}}, "key.a", "direction must be one of 1, -1, 'text', 'hashed', '2d', "
                                 "'2dsphere' (got 2)"),
    ({"key": {"a": True}}, "key.a", "direction must be one of 1, -1, 'text', 'hashed', '2d', "
                                    "'2dsphere' (got True)"),
    ({"key": [("a", 1), ("a", -1)]}, "key.a", "is listed twice"),
    ({"key": {"_id": 1}}, "key", "{_id: 1} is the index every collection has; do not declare it"),
    ({"key": {"a": 1}, "name": ""}, "name", "must be a non-empty string"),
    ({"key": {"a": 1}, "name": "_id_"}, "name",
     "_id_ is the name of the index every collection has"),
    ({"key": {"a": 1}, "unique": 1}, "unique", "must be a boolean"),
    ({"key": {"a": 1}, "sparse": "yes"}, "sparse", "must be a boolean"),
    ({"key": {"a": 1}, "hidden": None}, "hidden", "must be a boolean"),
    ({"key": {"a": 1}, "background": 1}, "background", "must be a boolean"),
    ({"key": {"a": 1}, "expireAfterSeconds": -1}, "expireAfterSeconds",
     "must be a non-negative integer (seconds; 0 is allowed)"),
    ({"key": {"a": 1}, "expireAfterSeconds": 1.5}, "expireAfterSeconds",
     "must be a non-negative integer (seconds; 0 is allowed)"),
    ({"key": {"a": 1}, "expireAfterSeconds": 2**53}, "expireAfterSeconds",
     "must be a non-negative integer (seconds; 0 is allowed)"),
    ({"key": {"a": 1}, "partialFilterExpression": []}, "partialFilterExpression",
     "must be a mapping"),
    ({"key": {"a": 1}, "storageEngine": "wt"}, "storageEngine", "must be a mapping"),
    ({"key": {"a": 1}, "collation": {"strength": 2}}, "collation",
     "must be a mapping with a non-empty string locale"),
    ({"key": {"a": 1}, "collation": {"locale": ""}}, "collation",
     "must be a mapping with a non-empty string locale"),
    ({"key": {"a": "text"}, "default_language": ""}, "default_language",
     "must be a non-empty string"),
    ({"key": {"a": "text"}, "language_override": 3}, "language_override",
     "must be a non-empty string"),
    ({"key": {"a": "text"}, "textIndexVersion": 0}, "textIndexVersion",
     "must be a positive integer"),
    ({"key": {"a": "2dsphere"}, "2dsphereIndexVersion": "3"}, "2dsphereIndexVersion",
     "must be a positive integer"),
    ({"key": {"a": "2d"}, "bits": -1}, "bits", "must be a positive integer"),
    ({"key": {"a": "2d"}, "min": float("inf")}, "min", "must be a finite number"),
    ({"key": {"a": "2d"}, "max": "9"}, "max", "must be a finite number"),
    ({"key": {"a": 1}, "weights": {"a": 2}}, "weights", "is only valid on a text index"),
    ({"key": {"a": 1}, "default_language": "fr"}, "default_language",
     "is only valid on a text index"),
    ({"key": {"a": 1}, "language_override": "l"}, "language_override",
     "is only valid on a text index"),
    ({"key": {"a": 1}, "textIndexVersion": 3}, "textIndexVersion",
     "is only valid on a text index"),
    ({"key": {"a.$**": 1}, "wildcardProjection": {"a": 1}}, "wildcardProjection",
     "is only valid with the all-fields wildcard key '$**' (not a path wildcard such as "
     "'a.$**')"),
])
def test_index_rules(index: dict[str, Any], path: str, message: str) -> None:
    assert problems({"name": "c", "indexes": [index]}, base="collections[2]") == {
        f"collections[2].indexes[0].{path}": message}


def test_unknown_index_options_are_refused_in_a_file_with_its_path() -> None:
    found = problems({"indexes": [{"key": {"a": 1}, "uniqe": True}]}, style="json",
                     fallback="bad", prefix="bad.json")
    assert list(found) == ["bad.json: indexes[0].uniqe"]
    assert found["bad.json: indexes[0].uniqe"].startswith(
        "is not a supported index option (expected key, name, unique, sparse, hidden, "
        "expireAfterSeconds, partialFilterExpression, collation")
    assert found["bad.json: indexes[0].uniqe"].endswith(" — did you mean 'unique'?")


@pytest.mark.parametrize(("typo", "meant"), [
    ("uniqe", "unique"), ("expireAfterSecond", "expireAfterSeconds"),
    ("partial_filter_expression", "partialFilterExpression"), ("sparce", "sparse"),
])
def test_a_typo_in_an_index_option_suggests_the_option(typo: str, meant: str) -> None:
    found = problems({"name": "c", "indexes": [{"key": {"a": 1}, typo: 1}]})
    assert found[f"indexes[0].{typo}"].endswith(f" — did you mean '{meant}'?")


def test_an_unknown_index_option_far_from_every_option_suggests_nothing() -> None:
    found = problems({"name": "c", "indexes": [{"key": {"a": 1}, "zzz": 1}]})
    assert "did you mean" not in found["indexes[0].zzz"]


def test_wildcard_projection_with_the_all_fields_wildcard_is_fine() -> None:
    index = one_index({"key": {"$**": 1, "other": 1}, "wildcardProjection": {"a": 0}})
    assert index.options["wildcardProjection"] == {"a": 0}


def test_not_a_list_of_indexes() -> None:
    assert problems({"name": "c", "indexes": {"key": {"a": 1}}}) == {
        "indexes": "must be a list of index definitions"}
    assert problems({"name": "c", "indexes": ["a_1"]}) == {
        "indexes[0]": "must be a mapping with a key (and options)"}


def test_every_issue_is_gathered() -> None:
    found = problems({"name": "system.c", "indexes": [{"key": {"a": 3}}, {"uniqe": 1}],
                      "validator": "x", "prune": 1}, base="collections[0]")
    assert set(found) == {"collections[0].name", "collections[0].indexes[0].key.a",
                          "collections[0].indexes[1].uniqe", "collections[0].indexes[1].key",
                          "collections[0].validator", "collections[0].prune"}


# ------------------------------------------------------------------------- clashes


def clashes(*indexes: dict[str, Any]) -> dict[str, str]:
    return problems({"name": "c", "indexes": list(indexes)}, base="collections[0]")


def test_two_indexes_with_one_name() -> None:
    assert clashes({"key": {"a": 1}}, {"key": {"b": 1}, "name": "a_1"}) == {
        "collections[0].indexes[1]": 'has the same name "a_1" as collections[0].indexes[0]'}


def test_two_text_indexes() -> None:
    assert clashes({"key": {"a": "text"}}, {"key": {"b": "text"}}) == {
        "collections[0].indexes[1]": "is a second text index (collections[0].indexes[0] is "
                                     "one; a collection holds at most one)"}


def test_the_same_signature_under_two_names() -> None:
    same_index = "declares the same index as collections[0].indexes[0] (same key, partial " \
                 "filter and collation)"
    assert clashes({"key": {"a": 1}}, {"key": {"a": 1}, "name": "x", "unique": True}) == {
        "collections[0].indexes[1]": same_index}
    assert clashes({"key": {"e": 1}, "collation": {"locale": "en"}},
                   {"key": {"e": 1}, "name": "x",
                    "collation": {"locale": "en", "strength": 3, "caseLevel": False}}) == {
        "collections[0].indexes[1]": same_index}
    assert clashes({"key": {"e": 1}, "partialFilterExpression": {"a": {"$gt": 1}}},
                   {"key": {"e": 1.0}, "name": "x",
                    "partialFilterExpression": {"a": {"$gt": Int64(1)}}}) == {
        "collections[0].indexes[1]": same_index}


@pytest.mark.parametrize("other", [
    {"key": {"a": 1}, "name": "x", "collation": {"locale": "en", "strength": 2}},
    {"key": {"a": 1}, "name": "x", "collation": {"locale": "simple"}},
    {"key": {"a": 1}, "name": "x", "partialFilterExpression": {"a": {"$exists": True}}},
    {"key": {"a": -1}},
])
def test_a_different_collation_or_filter_is_another_index(other: dict[str, Any]) -> None:
    definition, found = check({"name": "c", "indexes": [{"key": {"a": 1}}, other]})
    assert found == [] and definition is not None


def test_simple_and_no_collation_are_kept_apart() -> None:
    definition, found = check({"name": "c", "indexes": [
        {"key": {"a": 1}, "collation": {"locale": "simple"}, "name": "s"},
        {"key": {"a": 1}, "collation": {"locale": "fr"}, "name": "f"}]})
    assert found == [] and definition is not None


# ------------------------------------------------------------------------- versioning


def test_versioning_defaults_resolve() -> None:
    definition, found = check({"name": "c", "versioning": {"current": 2}})
    assert found == [] and definition is not None
    assert definition.versioning == VersioningSpec(current=2, min=1, field="__v", revision=True,
                                                   revision_field="__rev", index=True)
    definition, _ = check({"versioning": {"current": 3, "min": 0, "revision": False,
                                          "field": "v", "index": False}}, fallback="p")
    assert definition is not None and definition.versioning == VersioningSpec(
        current=3, min=0, field="v", revision=False, revision_field=None, index=False)


def test_versioning_keys_follow_the_file_style() -> None:
    definition, found = check({"versioning": {"current": 1, "revisionField": "rev"}},
                              style="json", fallback="p", prefix="p.json")
    assert found == [] and definition is not None
    assert definition.versioning is not None and definition.versioning.revision_field == "rev"
    definition, found = check({"name": "p", "versioning": {"current": 1,
                                                            "revision_field": "rev"}})
    assert found == [] and definition is not None
    assert problems({"name": "p", "versioning": {"current": 1, "revisionField": "r"}})[
        "versioning.revisionField"].startswith("is not a versioning key")


@pytest.mark.parametrize(("block", "path", "message"), [
    ({}, "current", "is required: an integer ≥ 1 (the version new documents are written at)"),
    ({"current": 0}, "current",
     "is required: an integer ≥ 1 (the version new documents are written at)"),
    ({"current": True}, "current",
     "is required: an integer ≥ 1 (the version new documents are written at)"),
    ({"current": 2, "min": 3}, "min", "must be an integer from 0 to current"),
    ({"current": 2, "min": -1}, "min", "must be an integer from 0 to current"),
    ({"current": 1, "field": "$v"}, "field", "must not start with '$' or contain '.' or NUL"),
    ({"current": 1, "field": "a.b"}, "field", "must not start with '$' or contain '.' or NUL"),
    ({"current": 1, "field": "_id"}, "field", "must not be _id"),
    ({"current": 1, "field": "x" * 65}, "field", "must be at most 64 characters"),
    ({"current": 1, "field": ""}, "field", "must be a non-empty string"),
    ({"current": 1, "revision": "yes"}, "revision", "must be a boolean"),
    ({"current": 1, "revision": False, "revision_field": "r"}, "revision_field",
     "is set but revision is false"),
    ({"current": 1, "revision_field": "__v"}, "revision_field", 'must differ from field ("__v")'),
    ({"current": 1, "index": 1}, "index", "must be a boolean"),
    ({"current": 1, "curent": 2}, "curent",
     "is not a versioning key (expected current, min, field, revision, revision_field, index)"
     " — did you mean 'current'?"),
])
def test_versioning_rules(block: dict[str, Any], path: str, message: str) -> None:
    assert problems({"name": "c", "versioning": block}) == {f"versioning.{path}": message}


def test_versioning_must_be_a_mapping() -> None:
    assert problems({"name": "c", "versioning": 2}) == {
        "versioning": "must be a mapping with at least current"}


def test_versioning_and_the_validator() -> None:
    assert problems({"name": "c", "versioning": {"current": 1}, "validator": None}) == {
        "validator": "cannot be None on a versioned collection (it would remove the version "
                     "rules); leave validator out or declare your own rules"}
    found = problems({"name": "c", "versioning": {"current": 1}, "validator": {
        "__v": {"$gte": 1}, "$jsonSchema": {"required": ["email", "__rev"],
                                            "properties": {"__v": {"bsonType": "int"}}}}})
    assert found == {
        "validator.__v": "is managed by versioning; remove this rule",
        "validator.$jsonSchema.required": 'lists "__rev", which versioning manages; remove it',
        "validator.$jsonSchema.properties.__v": "is managed by versioning; remove this rule",
    }
    assert problems({"name": "c", "versioning": {"current": 1},
                     "validator": {"$jsonSchema": []}}) == {
        "validator.$jsonSchema": "must be a mapping"}
    assert problems({"name": "c", "versioning": {"current": 1},
                     "validator": {"$jsonSchema": {"required": "email"}}}) == {
        "validator.$jsonSchema.required": "must be a list"}


def test_the_version_index_is_not_declared_twice() -> None:
    assert problems({"name": "c", "versioning": {"current": 1},
                     "indexes": [{"key": {"a": 1}}, {"key": {"__v": 1, "_id": 1}}]}) == {
        "indexes[1].key": "is the version index versioning declares; remove it or set "
                          "versioning.index to false"}
    definition, found = check({"name": "c", "versioning": {"current": 1, "index": False},
                               "indexes": [{"key": {"__v": 1, "_id": 1}}]})
    assert found == [] and definition is not None


# ------------------------------------------------------------------------- search indexes


def test_search_indexes_are_normalized() -> None:
    definition, found = check({"searchIndexes": [
        {"definition": {"mappings": {"dynamic": True}}},
        {"name": "vec", "type": "vectorSearch", "definition": {"fields": [
            {"type": "vector", "path": "embedding", "numDimensions": 3,
             "similarity": "cosine"}, {"type": "filter", "path": "tenant"}]}},
    ]}, style="json", fallback="plans", prefix="plans.json")
    assert found == [] and definition is not None
    assert definition.search_indexes == (
        DeclaredSearchIndex("default", "search", {"mappings": {"dynamic": True}}),
        DeclaredSearchIndex("vec", "vectorSearch", {"fields": [
            {"type": "vector", "path": "embedding", "numDimensions": 3,
             "similarity": "cosine"}, {"type": "filter", "path": "tenant"}]}),
    )
    definition, found = check({"name": "c", "search_indexes": []})
    assert found == [] and definition is not None and definition.search_indexes == ()


@pytest.mark.parametrize(("index", "path", "message"), [
    ("x", "", "must be a mapping with a definition (and optionally name, type)"),
    ({"definition": {"mappings": {}}, "analyzer": "x"}, ".analyzer",
     "is not a search index key (expected name, type, definition)"),
    ({"name": "", "definition": {"mappings": {}}}, ".name", "must be a non-empty string"),
    ({"type": "vector", "definition": {"mappings": {}}}, ".type",
     "must be 'search' or 'vectorSearch'"),
    ({}, ".definition", "is required and must be a mapping (Atlas's index definition)"),
    ({"definition": {}}, ".definition.mappings",
     "is required for a search index (e.g. {dynamic: true})"),
    ({"definition": {"mappings": []}}, ".definition.mappings", "must be a mapping"),
    ({"definition": {"fields": []}}, ".definition",
     "has fields but no mappings: a vector index needs type: 'vectorSearch'"),
    ({"type": "vectorSearch", "definition": {"mappings": {}}}, ".definition",
     "has mappings but no fields: for a search index leave type out or set type: 'search'"),
    ({"type": "vectorSearch", "definition": {"fields": []}}, ".definition.fields",
     "must be a non-empty list of field definitions"),
    ({"type": "vectorSearch", "definition": {"fields": ["x"]}}, ".definition.fields[0]",
     "must be a mapping with type and path"),
    ({"type": "vectorSearch", "definition": {"fields": [{"path": "a"}]}},
     ".definition.fields[0].type", "must be a non-empty string"),
    ({"type": "vectorSearch", "definition": {"fields": [{"type": "vector"}]}},
     ".definition.fields[0].path", "must be a non-empty string"),
    ({"type": "vectorSearch", "definition": {"fields": [{"type": "vector", "path": "a"},
                                                        {"type": "vector", "path": "a"}]}},
     ".definition.fields[1]", "repeats searchIndexes[0].definition.fields[0] (same type and "
                              "path)"),
    ({"type": "vectorSearch", "definition": {"fields": [{"type": "vector", "path": "a"},
                                                        {"type": "autoEmbed", "path": "b"}]}},
     ".definition.fields", "mixes vector and autoEmbed fields; one index holds one kind"),
    ({"definition": {"mappings": {"fields": {"f": lambda: 1}}}},
     ".definition.mappings.fields.f",
     "is a function — a definition holds data only (a function cannot be sent as written)"),
])
def test_search_index_rules(index: Any, path: str, message: str) -> None:
    assert problems({"searchIndexes": [index]}, style="json", fallback="c") == {
        f"searchIndexes[0]{path}": message}


def test_search_index_names_are_unique_and_unnamed_is_default() -> None:
    assert problems({"name": "c", "search_indexes": [
        {"definition": {"mappings": {}}}, {"name": "default", "definition": {"mappings": {}}},
    ]}) == {"search_indexes[1].name": '"default" is already the name of search_indexes[0] '
                                      "(an index without a name is named 'default')"}
    assert problems({"name": "c", "search_indexes": "x"}) == {
        "search_indexes": "must be a list of search index definitions"}


# ------------------------------------------------------------------------- inline lists


def test_inline_definitions_gather_everything_and_refuse_duplicates() -> None:
    issues = Issues()
    found = validate_inline([
        {"name": "a", "indexes": []}, {"name": "b", "indexes": [{"key": {"x": 1},
                                                                   "uniqe": True}]},
        {"name": "a", "validator": {}}, "junk",
    ], issues, RESERVED)
    assert [d.name for d in found] == ["a"]
    assert [d.source for d in found] == ["collections[0]"]
    paths = [issue["path"] for issue in issues.found]
    assert paths == ["collections[1].indexes[0].uniqe", "collections[2].name", "collections[3]"]
    assert issues.found[1]["message"] == '"a" is already declared in collections[0]'
    error = invalid_definitions(issues)
    assert error.code == "CONFIG_INVALID" and error.exit_code == 6
    assert MESSAGE == "Invalid collection definition(s)"
    assert error.message == ("Invalid collection definition(s): collections[1].indexes[0].uniqe"
                             ": " + issues.found[0]["message"] + " (and 2 more)")
    assert error.context["issues"] == issues.found


def test_inline_must_be_a_list() -> None:
    issues = Issues()
    assert validate_inline({"users": {}}, issues, RESERVED) == []
    assert issues.found == [{"path": "collections",
                             "message": "must be a list of collection definitions"}]


# ------------------------------------------------------------------------- canonical


@pytest.mark.parametrize(("left", "right"), [
    ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
    (1, Int64(1)), (1, 1.0), (0, -0.0), (Int64(2**60), 2**60), (2.0**60, 2**60),
    ({"x": [1, {"b": 1, "a": 2}]}, {"x": [1.0, {"a": 2, "b": 1}]}),
    (float("nan"), float("nan")),
    (datetime.datetime(2024, 1, 2, 3, 4, 5, 678999), datetime.datetime(
        2024, 1, 2, 4, 4, 5, 678000, tzinfo=datetime.timezone(datetime.timedelta(hours=1)))),
    (re.compile("^a", re.M | re.I), Regex("^a", "mi")),
    (re.compile("^a"), Regex("^a", "u")),
    (ObjectId("65a000000000000000000000"), ObjectId("65a000000000000000000000")),
    (Decimal128("1.50"), Decimal128("1.50")),
    ((1, 2), [1, 2]),
])
def test_canonical_equal(left: Any, right: Any) -> None:
    assert canonical(left) == canonical(right) and same(left, right)


@pytest.mark.parametrize(("left", "right"), [
    (["a", "b"], ["b", "a"]),
    (1, True), (1, "1"), (1.5, 1), (float("inf"), float("-inf")), (float("nan"), None),
    (2**53 + 1, float(2**53)),
    (re.compile("^a", re.I), re.compile("^a")),
    (ObjectId("65a000000000000000000000"), "65a000000000000000000000"),
    (Decimal128("1.5"), 1.5),
    (datetime.datetime(2024, 1, 1), "2024-01-01T00:00:00.000Z"),
    ({"a": None}, {}),
])
def test_canonical_different(left: Any, right: Any) -> None:
    assert canonical(left) != canonical(right) and not same(left, right)


def test_canonical_tags() -> None:
    assert canonical({"n": float("-inf"), "d": datetime.datetime(2024, 1, 1),
                      "l": 2**60, "r": re.compile("x", re.M | re.I)}) == (
        '{"d":{"$date":"2024-01-01T00:00:00.000Z"},"l":{"$long":"1152921504606846976"},'
        '"n":{"$number":"-Infinity"},"r":{"$regex":{"flags":"im","pattern":"x"}}}')


def test_collation_defaults() -> None:
    assert fill_collation_defaults({"locale": "en"}) == {
        "locale": "en", "strength": 3, "caseLevel": False, "numericOrdering": False}
    assert fill_collation_defaults({"locale": "en", "strength": 2})["strength"] == 2  # type: ignore[index]
    assert fill_collation_defaults({"locale": "simple"}) == {"locale": "simple"}
    assert fill_collation_defaults(None) is None
