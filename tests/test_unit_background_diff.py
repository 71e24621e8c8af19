"""The stamped diff, the guard filter and local application, without a server."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import bson
import pytest
from bson import Decimal128, Int64, ObjectId, Regex
from bson.binary import Binary

from migronaut.background.lanes.diff import (
    DocumentProblem,
    apply_update_locally,
    bson_equal,
    copy_document,
    guard_filter,
    stamped_diff,
    stamper,
)

OID = ObjectId("0123456789ab0123456789ab")


def diff(
    stored: dict[str, Any],
    result: Any,
    *,
    target: int = 2,
    version_field: str = "__v",
    revision_field: str | None = "__rev",
) -> Any:
    """The diff, through both entry points (the lanes' bound ``stamper`` must agree)."""
    update = stamped_diff(
        stored,
        result,
        version_field=version_field,
        revision_field=revision_field,
        target_version=target,
    )
    assert stamper(version_field, revision_field, target)(stored, result) == update
    return update


def transformed(stored: dict[str, Any], change: Any) -> Any:
    """Run ``change`` on a deep copy, like the lanes do, and diff it."""
    doc = copy.deepcopy(stored)
    change(doc)
    return diff(stored, doc)


STORED: dict[str, Any] = {
    "_id": OID,
    "name": "Ada",
    "count": Int64(5),
    "price": Decimal128("9.990"),
    "ratio": 1.0,
    "small": 5,
    "at": dt.datetime(2024, 1, 2, 3, 4, 5, 6000),
    "tags": ["a", "b"],
    "address": {"city": "Paris", "zip": "75001"},
    "blob": Binary(b"\x01", 4),
    "pattern": Regex("^a", "i"),
    "nothing": None,
    "__v": 1,
    "__rev": 7,
}

STAMP = {"$set": {"__v": 2}, "$inc": {"__rev": 1}}


# -------------------------------------------------------------------------------- unchanged


def test_identity_transform_only_stamps() -> None:
    assert transformed(STORED, lambda doc: None) == STAMP


def test_untouched_bson_types_survive_a_round_trip_copy() -> None:
    stored = bson.decode(bson.encode(STORED))
    assert diff(stored, copy.deepcopy(stored)) == STAMP


def test_the_same_object_returned_is_unchanged() -> None:
    assert diff(STORED, STORED) == STAMP


def test_untouched_int64_decimal128_and_float_are_not_written() -> None:
    update = transformed(STORED, lambda doc: doc.__setitem__("name", "Grace"))
    assert update == {"$set": {"name": "Grace", "__v": 2}, "$inc": {"__rev": 1}}
    for key in ("count", "price", "ratio", "small", "at", "blob", "pattern"):
        assert key not in update["$set"]


# -------------------------------------------------------------------------------- changes


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("small", Int64(5)),  # int32 → int64
        ("small", 5.0),  # int32 → double
        ("small", Decimal128("5")),
        ("small", True),
        ("count", 5),  # int64 → int32
        ("ratio", 1),  # double → int
        ("ratio", 1.0000001),
        ("ratio", Decimal128("1.0")),
        ("price", Decimal128("9.99")),  # scale is part of the value
        ("blob", Binary(b"\x01", 0)),  # subtype
        ("blob", b"\x01"),
        ("pattern", Regex("^a", "")),
        ("name", b"Ada"),
        ("at", dt.datetime(2024, 1, 2, 3, 4, 5)),
    ],
)
def test_type_or_value_changes_are_set(key: str, value: Any) -> None:
    update = diff(STORED, {**STORED, key: value})
    assert update["$set"] == {key: value, "__v": 2}
    assert "$unset" not in update


def test_int_and_int64_outside_int32_are_the_same_bson() -> None:
    stored = {"_id": 1, "big": Int64(2**40), "small": Int64(7)}
    assert diff(stored, {"_id": 1, "big": 2**40, "small": Int64(7)}) == STAMP
    assert diff(stored, {"_id": 1, "big": Int64(2**40), "small": 7})["$set"] == {
        "small": 7,
        "__v": 2,
    }


def test_nan_equals_nan_and_negative_zero_differs() -> None:
    stored = {"_id": 1, "x": float("nan"), "z": 0.0}
    assert diff(stored, {"_id": 1, "x": float("nan"), "z": 0.0}) == STAMP
    assert diff(stored, {"_id": 1, "x": float("nan"), "z": -0.0})["$set"] == {"z": -0.0, "__v": 2}


def test_a_nested_change_rewrites_the_whole_top_level_field() -> None:
    update = transformed(STORED, lambda doc: doc["address"].__setitem__("zip", "75002"))
    assert update["$set"] == {"address": {"city": "Paris", "zip": "75002"}, "__v": 2}
    update = transformed(STORED, lambda doc: doc["tags"].append("c"))
    assert update["$set"] == {"tags": ["a", "b", "c"], "__v": 2}


def test_nested_comparison_is_type_aware() -> None:
    stored = {"_id": 1, "a": {"n": 5, "l": [1, {"x": Int64(1)}]}}
    same = {"_id": 1, "a": {"n": 5, "l": [1, {"x": Int64(1)}]}}
    assert diff(stored, same) == STAMP
    changed = {"_id": 1, "a": {"n": 5, "l": [1, {"x": 1}]}}
    assert diff(stored, changed)["$set"]["a"] == changed["a"]
    changed = {"_id": 1, "a": {"n": 5.0, "l": [1, {"x": Int64(1)}]}}
    assert "a" in diff(stored, changed)["$set"]


def test_nested_key_order_counts_as_a_change() -> None:
    # BSON documents are ordered; MongoDB compares embedded documents in order
    reordered = {**STORED, "address": {"zip": "75001", "city": "Paris"}}
    assert diff(STORED, reordered)["$set"] == {"address": reordered["address"], "__v": 2}


def test_top_level_key_order_does_not_matter() -> None:
    reordered = dict(reversed(list(STORED.items())))
    assert diff(STORED, reordered) == STAMP


def test_tuples_and_lists_are_both_arrays() -> None:
    assert diff({"_id": 1, "t": [1, 2]}, {"_id": 1, "t": (1, 2)}) == STAMP


def test_new_keys_are_set() -> None:
    update = transformed(STORED, lambda doc: doc.__setitem__("status", "active"))
    assert update["$set"] == {"status": "active", "__v": 2}


# -------------------------------------------------------------------------------- unset


def test_absent_keys_are_unset() -> None:
    update = transformed(STORED, lambda doc: doc.pop("name"))
    assert update == {"$set": {"__v": 2}, "$unset": {"name": ""}, "$inc": {"__rev": 1}}


def test_none_is_unset_unless_already_null() -> None:
    update = diff(STORED, {**STORED, "name": None})
    assert update["$unset"] == {"name": ""}
    # an untouched stored null stays; a None for a key the document lacks writes nothing
    assert diff(STORED, {**STORED, "nothing": None, "ghost": None}) == STAMP


def test_dropping_a_stored_null_unsets_it() -> None:
    result = {k: v for k, v in STORED.items() if k != "nothing"}
    assert diff(STORED, result)["$unset"] == {"nothing": ""}


def test_several_changes_at_once() -> None:
    def change(doc: dict[str, Any]) -> None:
        doc["name"] = "Grace"
        del doc["tags"]
        doc["new"] = 1

    update = transformed(STORED, change)
    assert update == {
        "$set": {"name": "Grace", "new": 1, "__v": 2},
        "$unset": {"tags": ""},
        "$inc": {"__rev": 1},
    }


# -------------------------------------------------------------------------------- stamping


def test_version_and_revision_in_the_result_are_ignored() -> None:
    assert diff(STORED, {**STORED, "__v": 99, "__rev": 0}) == STAMP
    without = {k: v for k, v in STORED.items() if k not in ("__v", "__rev")}
    assert diff(STORED, without) == STAMP


def test_target_zero_unsets_the_version() -> None:
    update = diff(STORED, STORED, target=0)
    assert update == {"$unset": {"__v": ""}, "$inc": {"__rev": 1}}


def test_without_revisions_there_is_no_inc() -> None:
    update = diff(STORED, STORED, revision_field=None)
    # __rev is then an ordinary field: untouched, so not written
    assert update == {"$set": {"__v": 2}}
    assert diff(STORED, STORED, target=0, revision_field=None) == {"$unset": {"__v": ""}}


def test_custom_fields_are_stamped() -> None:
    stored = {"_id": 1, "sv": 1, "rv": 3, "a": 1}
    update = diff(stored, {"_id": 1, "a": 1}, version_field="sv", revision_field="rv", target=4)
    assert update == {"$set": {"sv": 4}, "$inc": {"rv": 1}}


def test_stamping_a_document_without_counters() -> None:
    assert diff({"_id": 1, "a": 1}, {"_id": 1, "a": 1}, target=1) == {
        "$set": {"__v": 1},
        "$inc": {"__rev": 1},
    }


def test_the_update_encodes_as_bson() -> None:
    update = transformed(STORED, lambda doc: doc.__setitem__("name", "Grace"))
    bson.encode(update)


# -------------------------------------------------------------------------------- shape


SECRET = "s3cr3t-value"


@pytest.mark.parametrize("result", [None, [STORED], "doc", 5, (("_id", OID),)])
def test_a_result_that_is_not_a_document_is_a_shape_problem(result: Any) -> None:
    problem = diff(STORED, result)
    assert isinstance(problem, DocumentProblem)
    assert problem.reason == "shape"
    assert "not a document" in problem.message


def test_a_changed_id_is_a_shape_problem_without_leaking_it() -> None:
    stored = {"_id": SECRET, "a": 1}
    for new_id in (SECRET + "x", Int64(1), None):
        problem = diff(stored, {"_id": new_id, "a": 1})
        assert isinstance(problem, DocumentProblem)
        assert problem.reason == "shape"
        assert "_id" in problem.message
        assert SECRET not in problem.message


def test_an_id_of_another_bson_type_is_a_change() -> None:
    problem = diff({"_id": 5, "a": 1}, {"_id": Int64(5), "a": 1})
    assert isinstance(problem, DocumentProblem)


def test_a_missing_id_is_a_shape_problem() -> None:
    problem = diff(STORED, {"address": STORED["address"]})
    assert isinstance(problem, DocumentProblem)
    assert "no _id" in problem.message


@pytest.mark.parametrize(
    ("key", "text"),
    [
        ("$" + SECRET, "starts with '$'"),
        (SECRET + ".com", "contains '.'"),
        ("", "empty"),
        (SECRET + "\x00", "NUL"),
        (5, "not a string"),
    ],
)
def test_bad_top_level_keys_are_shape_problems_without_leaking(key: Any, text: str) -> None:
    problem = diff(STORED, {**STORED, key: SECRET})
    assert isinstance(problem, DocumentProblem)
    assert problem.reason == "shape"
    assert text in problem.message
    assert SECRET not in problem.message
    assert str(OID) not in problem.message


def test_nested_dots_are_left_to_the_server() -> None:
    update = diff(STORED, {**STORED, "address": {"a.b": 1}})
    assert not isinstance(update, DocumentProblem)


# -------------------------------------------------------------------------------- equality


def test_bson_equal_basics() -> None:
    assert bson_equal({"a": [1, {"b": 2}]}, {"a": [1, {"b": 2}]})
    assert not bson_equal({"a": 1, "b": 2}, {"b": 2, "a": 1})
    assert not bson_equal({"a": 1}, {"a": 1, "b": 2})
    assert not bson_equal([1, 2], [1, 2, 3])
    assert not bson_equal(1, True)
    assert not bson_equal(False, 0)
    assert bson_equal(ObjectId(str(OID)), OID)
    from collections import OrderedDict

    assert bson_equal(OrderedDict(a=1), {"a": 1})
    assert not bson_equal({"a": 1}, [("a", 1)])


# -------------------------------------------------------------------------------- guard


def test_guard_filter_uses_the_values_read() -> None:
    assert guard_filter({"_id": OID, "__v": 1, "__rev": 7}, "__v", "__rev", "revision") == {
        "_id": OID,
        "__v": 1,
        "__rev": 7,
    }


@pytest.mark.parametrize("value", ["missing", None, 0, Int64(0), 0.0])
def test_guard_filter_matches_missing_null_or_zero_counters(value: Any) -> None:
    doc: dict[str, Any] = {"_id": 1}
    if value != "missing":
        doc["__v"] = value
        doc["__rev"] = value
    assert guard_filter(doc, "__v", "__rev", "revision") == {
        "_id": 1,
        "__v": {"$in": [None, 0]},
        "__rev": {"$in": [None, 0]},
    }


def test_guard_filter_keeps_a_false_counter_as_read() -> None:
    assert guard_filter({"_id": 1, "__v": False}, "__v", None, "version-only") == {
        "_id": 1,
        "__v": False,
    }


def test_guard_filter_version_only() -> None:
    doc = {"_id": 1, "__v": 2, "__rev": 9}
    assert guard_filter(doc, "__v", "__rev", "version-only") == {"_id": 1, "__v": 2}
    assert guard_filter(doc, "__v", None, "revision") == {"_id": 1, "__v": 2}


def test_guard_filter_keeps_stored_types() -> None:
    guard = guard_filter({"_id": 1, "sv": Int64(3), "rv": Int64(2**40)}, "sv", "rv", "revision")
    assert type(guard["sv"]) is Int64
    assert guard["rv"] == 2**40


# -------------------------------------------------------------------------------- apply


def test_apply_update_locally_gives_the_new_document() -> None:
    update = transformed(STORED, lambda doc: (doc.pop("tags"), doc.__setitem__("name", "G")))
    after = apply_update_locally(STORED, update)
    assert after["name"] == "G"
    assert "tags" not in after
    assert after["__v"] == 2
    assert after["__rev"] == 8
    assert STORED["name"] == "Ada"  # not modified
    assert list(after)[:2] == ["_id", "name"]  # existing fields keep their place


def test_apply_update_locally_appends_new_fields_in_name_order() -> None:
    doc = {"_id": 1, "z": 0}
    update = {"$set": {"b": 1, "a": 2, "z": 3}, "$inc": {"__rev": 1}}
    assert list(apply_update_locally(doc, update).items()) == [
        ("_id", 1),
        ("z", 3),
        ("__rev", 1),
        ("a", 2),
        ("b", 1),
    ]


def test_apply_update_locally_round_trips_the_diff() -> None:
    def change(doc: dict[str, Any]) -> None:
        doc["address"]["zip"] = "1"
        doc["new"] = [1]
        del doc["ratio"]

    result = copy.deepcopy(STORED)
    change(result)
    update = diff(STORED, result)
    after = apply_update_locally(STORED, update)
    expected = {**result, "__v": 2, "__rev": 8}
    assert after == expected


def test_apply_update_locally_inc_keeps_int64_and_counts_null_as_zero() -> None:
    assert apply_update_locally({"r": Int64(4)}, {"$inc": {"r": 1}}) == {"r": Int64(5)}
    assert type(apply_update_locally({"r": Int64(4)}, {"$inc": {"r": 1}})["r"]) is Int64
    assert apply_update_locally({"r": None}, {"$inc": {"r": 1}}) == {"r": 1}


def test_apply_update_locally_unset_with_target_zero() -> None:
    update = diff(STORED, STORED, target=0)
    assert "__v" not in apply_update_locally(STORED, update)


@pytest.mark.parametrize(
    "update",
    [
        {"$push": {"a": 1}},
        {"$set": {"a.b": 1}},
        {"$inc": {"name": 1}},
    ],
)
def test_apply_update_locally_refuses_what_it_cannot_preview(update: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        apply_update_locally({"name": "x"}, update)


def test_an_untouched_legacy_dotted_key_is_not_a_problem_but_dropping_it_is() -> None:
    stored = {"_id": 1, "a.b": 1, "$legacy": 2, "x": 1}
    assert diff(stored, {**stored, "x": 2}) == {"$set": {"x": 2, "__v": 2}, "$inc": {"__rev": 1}}
    problem = diff(stored, {"_id": 1, "$legacy": 2, "x": 1})
    assert isinstance(problem, DocumentProblem)
    assert "'.'" in problem.message
    problem = diff(stored, {**stored, "a.b": 5})
    assert isinstance(problem, DocumentProblem)


# -------------------------------------------------------------------------------- copy


def test_copy_document_copies_containers_and_shares_immutable_leaves() -> None:
    stored = bson.decode(bson.encode(STORED))
    copied = copy_document(stored)
    assert copied == stored
    assert copied is not stored
    assert copied["address"] is not stored["address"]
    assert copied["tags"] is not stored["tags"]
    assert copied["count"] is stored["count"]
    assert copied["price"] is stored["price"]
    assert copied["pattern"] is not stored["pattern"]  # Regex is mutable: deep-copied
    assert copied["pattern"] == stored["pattern"]
    copied["address"]["zip"] = "0"
    copied["tags"].append("z")
    assert stored["address"]["zip"] == "75001"
    assert stored["tags"] == ["a", "b"]


def test_copy_document_copies_nested_containers_and_tuples() -> None:
    stored = {"_id": 1, "a": [{"b": [1, {"c": 2}]}], "t": (1, [2])}
    copied = copy_document(stored)
    copied["a"][0]["b"][1]["c"] = 3
    copied["t"][1].append(3)
    assert stored == {"_id": 1, "a": [{"b": [1, {"c": 2}]}], "t": (1, [2])}
    assert copied["t"] == [1, [2, 3]]


def test_a_copy_document_transform_diffs_like_a_deepcopy_one() -> None:
    def change(doc: dict[str, Any]) -> dict[str, Any]:
        doc["address"]["city"] = "Lyon"
        doc["count"] = Int64(6)
        doc.pop("ratio")
        return doc

    stored = bson.decode(bson.encode(STORED))
    assert diff(stored, change(copy_document(stored))) == diff(
        stored, change(copy.deepcopy(stored))
    )
