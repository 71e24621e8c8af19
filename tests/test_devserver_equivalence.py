"""Over the wire, the server keeps ``_id`` and unique keys and serves ``_id`` lookups and ranges
exactly as a straightforward reference says mongod does, on random sequences of inserts
(single, ordered and unordered batches), deletes and re-inserts, with ``_id`` values of every
type mixed (``1``, ``1.0``, ``Int64(1)`` and ``Decimal128("1")`` among them), a compound unique
index and a partial unique index.

The reference is a list of documents and :func:`tests.helpers.bson_reference.compare`. Against
the dev server this checks its indexed storage; with ``MIGRONAUT_TEST_URI`` it checks the
reference against a real server.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cmp_to_key
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo import ASCENDING, MongoClient
from pymongo.collection import Collection
from pymongo.errors import BulkWriteError, DuplicateKeyError
from tests.helpers.bson_reference import compare, ids, kind, numbers, ordered_ids

_documents = st.fixed_dictionaries(
    {"_id": ids, "a": st.integers(0, 2), "b": st.integers(0, 2)},
    optional={"p": st.one_of(numbers, st.sampled_from(["x", "y"]))},
)
_operations = st.lists(st.one_of(
    st.tuples(st.just("insert"), _documents),
    st.tuples(st.just("insert_many"), st.lists(_documents, min_size=1, max_size=4),
              st.booleans()),
    st.tuples(st.just("delete"), ids),
    st.tuples(st.just("find"), ids),
    st.tuples(st.just("range"), ordered_ids, ordered_ids, st.booleans(),
              st.sampled_from([1, -1]), st.integers(0, 4)),
    st.tuples(st.just("after"), ordered_ids, st.sampled_from([1, -1]), st.integers(1, 3)),
), min_size=1, max_size=24)


class Reference:
    """A collection as mongod keeps it: ``_id`` unique by BSON equality, ``(a, b)`` unique,
    ``p`` unique where present."""

    def __init__(self) -> None:
        self.documents: list[dict[str, Any]] = []

    def collides(self, document: dict[str, Any]) -> bool:
        for stored in self.documents:
            if compare(stored["_id"], document["_id"]) == 0:
                return True
            if stored["a"] == document["a"] and stored["b"] == document["b"]:
                return True
            if "p" in stored and "p" in document and compare(stored["p"], document["p"]) == 0:
                return True
        return False

    def insert(self, document: dict[str, Any]) -> bool:
        if self.collides(document):
            return False
        self.documents.append(document)
        return True

    def delete(self, value: Any) -> None:
        self.documents = [doc for doc in self.documents if compare(doc["_id"], value) != 0]

    def equal(self, value: Any) -> list[Any]:
        return [doc["_id"] for doc in self.documents if compare(doc["_id"], value) == 0]

    def between(self, low: Any, high: Any | None, low_inclusive: bool, direction: int,
                limit: int) -> list[Any]:
        """``{_id: {$gt(e): low, $lt: high}}`` sorted on ``_id``: comparisons match values of
        the bound's own type only, as mongod's do."""
        found = [doc["_id"] for doc in self.documents
                 if kind(doc["_id"]) == kind(low)
                 and (compare(doc["_id"], low) > 0 or (low_inclusive
                                                        and compare(doc["_id"], low) == 0))
                 and (high is None or (kind(doc["_id"]) == kind(high)
                                       and compare(doc["_id"], high) < 0))]
        found.sort(key=cmp_to_key(compare), reverse=direction < 0)
        return found[:limit] if limit else found


@pytest.fixture(scope="module")
def keys(mongo_uri: str) -> Iterator[Collection[dict[str, Any]]]:
    client: MongoClient[dict[str, Any]] = MongoClient(mongo_uri)
    name = "migronaut_test_equivalence"
    client.drop_database(name)
    yield client[name]["keys"]
    client.drop_database(name)
    client.close()


def _same(found: list[Any], expected: list[Any]) -> bool:
    """The same ``_id`` values in the same order (equal by BSON equality: the server may hand
    back ``1`` for the ``1.0`` it stored under another type only if mongod would)."""
    return len(found) == len(expected) and all(
        compare(a, b) == 0 and kind(a) == kind(b) for a, b in zip(found, expected, strict=True))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(_operations)
def test_keys_and_id_ranges_behave_as_the_reference_says(
    keys: Collection[dict[str, Any]], operations: list[Any]
) -> None:
    keys.drop()
    keys.create_index([("a", ASCENDING), ("b", ASCENDING)], unique=True, name="a_b")
    keys.create_index("p", unique=True, name="p_partial",
                      partialFilterExpression={"p": {"$exists": True}})
    reference = Reference()
    for operation in operations:
        name = operation[0]
        if name == "insert":
            document = dict(operation[1])
            expected = reference.insert(dict(document))
            try:
                keys.insert_one(document)
                inserted = True
            except DuplicateKeyError:
                inserted = False
            assert inserted == expected, (operation, reference.documents)
        elif name == "insert_many":
            documents, ordered = [dict(doc) for doc in operation[1]], operation[2]
            outcomes = []
            for document in documents:
                outcomes.append(reference.insert(dict(document)))
                if ordered and not outcomes[-1]:
                    break
            try:
                keys.insert_many(documents, ordered=ordered)
                failed: list[int] = []
            except BulkWriteError as error:
                failed = [entry["index"] for entry in error.details["writeErrors"]]
                assert all(entry["code"] == 11000 for entry in error.details["writeErrors"])
            assert failed == [i for i, ok in enumerate(outcomes) if not ok], (operation,)
        elif name == "delete":
            expected_count = len(reference.equal(operation[1]))
            reference.delete(operation[1])
            assert keys.delete_one({"_id": operation[1]}).deleted_count == expected_count
        elif name == "find":
            found = [doc["_id"] for doc in keys.find({"_id": operation[1]})]
            assert _same(found, reference.equal(operation[1])), operation
        elif name == "range":
            _, low, high, inclusive, direction, limit = operation
            condition = {"$gte" if inclusive else "$gt": low, "$lt": high}
            cursor = keys.find({"_id": condition}).sort("_id", direction).limit(limit)
            found = [doc["_id"] for doc in cursor]
            assert _same(found, reference.between(low, high, inclusive, direction, limit)), (
                operation, found)
        else:  # "after": an open range from a bound, sorted, limited
            _, low, direction, limit = operation
            cursor = keys.find({"_id": {"$gt": low}}).sort("_id", direction).limit(limit)
            found = [doc["_id"] for doc in cursor]
            assert _same(found, reference.between(low, None, False, direction, limit)), (
                operation, found)
    stored = [doc["_id"] for doc in keys.find({}, {"_id": 1})]
    assert sorted(map(repr, stored)) == sorted(repr(doc["_id"]) for doc in reference.documents)
    total = len(reference.documents)
    assert keys.count_documents({}) == total
    assert keys.count_documents({}, skip=1, limit=2) == max(0, min(total - 1, 2))
    assert keys.count_documents({"a": 1}) == sum(doc["a"] == 1 for doc in reference.documents)
    numbers = [doc for doc in reference.documents if kind(doc["_id"]) == "number"]
    assert keys.count_documents({"_id": {"$gte": 0}}) == sum(
        compare(doc["_id"], 0) >= 0 for doc in numbers)


def test_a_count_and_a_group_over_more_than_fifty_thousand_documents(
    keys: Collection[dict[str, Any]],
) -> None:
    """mongoeco refuses a pipeline holding more than 50,000 documents; mongod does not."""
    keys.drop()
    keys.insert_many([{"_id": n, "t": n % 3} for n in range(50_001)])
    assert keys.count_documents({}) == 50_001
    assert keys.count_documents({"_id": {"$gte": 50_000}}) == 1
    assert keys.count_documents({}, skip=50_000, limit=5) == 1
    groups = {doc["_id"]: doc["n"] for doc in keys.aggregate(
        [{"$group": {"_id": "$t", "n": {"$sum": 1}}}])}
    assert groups == {0: 16_667, 1: 16_667, 2: 16_667}
    keys.drop()
