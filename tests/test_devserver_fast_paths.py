"""The dev server's storage serves lookups, duplicate checks, ``_id`` ranges, counts and limited
reads from indexes: each test counts the stored documents an operation reads (the engine's
decode of a stored document) in a 2,000-document collection, where a scan would read them all.

In-process, on the engine the dev server serves (mongoeco's client in front of it); what goes
over the wire is checked against a reference in ``test_devserver_equivalence.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.markers import needs_embedded

pytestmark = needs_embedded

SIZE = 2_000
#: What a lookup may read: the document itself, and one more where mongoeco reads a document
#: again after it found it (an update reads it, then writes it).
FEW = 3


class Counted:
    """The indexed engine, counting the stored documents it decodes."""

    def __init__(self) -> None:
        from mongoeco import MongoClient

        from migronaut.devserver.mongoeco_internals import indexed_memory_engine

        self.engine = indexed_memory_engine()
        self.reads = 0
        borrow = self.engine._borrow_storage_document

        def counting(payload: Any, **options: Any) -> Any:
            self.reads += 1
            return borrow(payload, **options)

        self.engine._borrow_storage_document = counting
        self.client = MongoClient(self.engine)
        self.db = self.client.get_database("fast")

    def reading(self) -> _Reads:
        return _Reads(self)


class _Reads:
    def __init__(self, counted: Counted) -> None:
        self.counted = counted
        self.count = 0

    def __enter__(self) -> _Reads:
        self.start = self.counted.reads
        return self

    def __exit__(self, *_: object) -> None:
        self.count = self.counted.reads - self.start


@pytest.fixture
def fresh() -> Iterator[Counted]:
    """An empty engine of its own."""
    counted = Counted()
    yield counted
    counted.client.close()


@pytest.fixture(scope="module")
def counted() -> Iterator[Counted]:
    counted = Counted()
    numbers = counted.db.numbers
    numbers.insert_many([{"_id": n, "tag": n % 10, "a": n % 50, "b": n // 50} for n in range(SIZE)])
    counted.db.oids.insert_many([{"_id": ObjectId(), "n": n} for n in range(SIZE)])
    yield counted
    counted.client.close()


def test_an_insert_checks_its_id_without_reading_the_collection(counted: Counted) -> None:
    with counted.reading() as reads:
        counted.db.numbers.insert_one({"_id": SIZE + 1})
        counted.db.command({"insert": "numbers",
                            "documents": [{"_id": SIZE + 2}, {"_id": SIZE + 3}]})
        counted.db.oids.insert_one({"_id": ObjectId(), "n": -1})
    assert reads.count <= FEW


@pytest.mark.parametrize("twin", [5.0, Int64(5), Decimal128("5"), Decimal128("5.000")])
def test_a_numeric_duplicate_is_found_by_value_without_a_scan(counted: Counted, twin: Any
                                                              ) -> None:
    from mongoeco.errors import DuplicateKeyError

    with counted.reading() as reads, pytest.raises(DuplicateKeyError):
        counted.db.numbers.insert_one({"_id": twin})
    assert reads.count <= FEW
    reply = counted.db.command({"insert": "numbers", "documents": [{"_id": twin}],
                                "ordered": False})
    assert reply["n"] == 0 and reply["writeErrors"][0]["code"] == 11000


@pytest.mark.parametrize("twin", [7, 7.0, Int64(7), Decimal128("7")])
def test_a_lookup_by_id_finds_the_equal_number_and_reads_one_document(counted: Counted,
                                                                     twin: Any) -> None:
    with counted.reading() as reads:
        found = counted.db.numbers.find_one({"_id": twin})
    assert found is not None and found["_id"] == 7 and reads.count <= FEW


def test_an_id_range_sorted_on_id_reads_as_far_as_its_limit(counted: Counted) -> None:
    with counted.reading() as reads:
        ascending = list(counted.db.numbers.find({"_id": {"$gte": 100}}).sort("_id", 1).limit(10))
    assert [doc["_id"] for doc in ascending] == list(range(100, 110))
    assert reads.count <= 10 + FEW
    with counted.reading() as reads:
        descending = list(counted.db.numbers.find({"_id": {"$lt": 100.5, "$gt": 50}})
                          .sort("_id", -1).limit(5))
    assert [doc["_id"] for doc in descending] == [100, 99, 98, 97, 96]
    assert reads.count <= 5 + FEW
    first = list(counted.db.oids.find({}).sort("_id", 1).limit(3))
    with counted.reading() as reads:
        after = list(counted.db.oids.find({"_id": {"$gt": first[0]["_id"]}}).sort("_id", 1)
                     .limit(2))
    assert after == first[1:] and reads.count <= 2 + FEW


def test_a_batch_read_with_a_type_and_another_field_starts_at_its_bound(counted: Counted
                                                                       ) -> None:
    # a background batch: the match, and the partition's _id type and cursor in one condition
    # (compiled to an $and inside the $and, where the bound was once not seen: a scan from the
    # first _id)
    with counted.reading() as reads:
        found = list(counted.db.numbers.find(
            {"tag": {"$in": [None, 1]}, "_id": {"$type": ["int", "double"], "$gt": 1_500}})
            .sort("_id", 1).limit(5))
    assert [doc["_id"] for doc in found] == [1_501, 1_511, 1_521, 1_531, 1_541]
    assert reads.count <= 50 + FEW


def test_a_bounded_id_range_reads_only_its_documents(counted: Counted) -> None:
    with counted.reading() as reads:
        found = list(counted.db.numbers.find({"_id": {"$gte": 500, "$lt": 520}}))
        updated = counted.db.numbers.update_many({"_id": {"$gte": 500, "$lt": 520}},
                                                 {"$set": {"seen": True}})
    assert sorted(doc["_id"] for doc in found) == list(range(500, 520))
    assert updated.modified_count == 20
    assert reads.count <= 3 * 20 + FEW


def test_writes_by_id_read_one_document(counted: Counted) -> None:
    with counted.reading() as reads:
        counted.db.numbers.update_one({"_id": 42}, {"$inc": {"tag": 1}})
        counted.db.numbers.replace_one({"_id": 43.0}, {"tag": -1})
        counted.db.numbers.delete_one({"_id": Int64(44)})
    assert reads.count <= 3 * FEW
    assert counted.db.numbers.find_one({"_id": 44}) is None
    assert counted.db.numbers.find_one({"_id": 43})["tag"] == -1


def test_a_count_of_everything_reads_nothing(counted: Counted) -> None:
    with counted.reading() as reads:
        total = counted.db.oids.count_documents({})
        skipped = counted.db.oids.count_documents({}, skip=10, limit=5)
    assert total == counted.db.oids.count_documents({"n": {"$exists": True}})
    assert skipped == 5 and reads.count == 0


def test_an_unindexed_find_with_a_limit_stops_reading(counted: Counted) -> None:
    with counted.reading() as reads:
        found = list(counted.db.numbers.find({"tag": 3}).limit(4))
    assert len(found) == 4 and reads.count <= 4 * 10 + FEW


def test_a_count_with_a_limit_stops_at_it(counted: Counted,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The background planner's completion check, ``count_documents(match, limit=1)``: the
    candidates (storage keys) are taken lazily too, not listed for the whole collection."""
    numbers = counted.engine._storage["fast"]["numbers"]
    taken, items = [0], numbers._iter_items

    def counting() -> Iterator[Any]:
        for item in items():
            taken[0] += 1
            yield item

    monkeypatch.setattr(numbers, "_iter_items", counting, raising=False)
    with counted.reading() as reads:
        found = counted.db.numbers.count_documents({"tag": 3}, limit=1)
    assert found == 1 and reads.count <= 2 * 10 and taken[0] <= 2 * 10
    with counted.reading() as everything:
        none = counted.db.numbers.count_documents({"tag": 99}, limit=1)
    # nothing matches: without an index the count reads every document, as on mongod
    assert none == 0 and everything.count == counted.db.numbers.estimated_document_count()


def _sampled(counted: Counted, name: str, size: int, pipeline: list[dict[str, Any]],
             *, drawn_from: str | None = None) -> list[dict[str, Any]]:
    """``pipeline`` run on collection ``name`` as the wire layer runs an aggregate that starts
    with ``{$sample: {size}}`` on ``drawn_from`` (the same collection unless named)."""
    import asyncio

    from mongoeco import AsyncMongoClient

    from migronaut.devserver.mongoeco_internals import sampling

    async def run() -> list[dict[str, Any]]:
        client = AsyncMongoClient(counted.engine)
        try:
            with sampling("fast", drawn_from or name, size):
                cursor = client.get_database("fast").get_collection(name).aggregate(pipeline)
                return list(await cursor.to_list())
        finally:
            await client.close()

    return asyncio.run(run())


def test_a_leading_sample_reads_only_the_documents_it_draws(counted: Counted) -> None:
    with counted.reading() as reads:
        drawn = _sampled(counted, "numbers", 50, [{"$sample": {"size": 50}}])
    ids = [document["_id"] for document in drawn]
    assert len(ids) == 50 == len(set(ids))
    assert set(ids) <= {document["_id"] for document in counted.db.numbers.find()}
    assert all(document == counted.db.numbers.find_one({"_id": document["_id"]})
               for document in drawn)
    assert reads.count <= 50 * 2
    with counted.reading() as after:
        rest = _sampled(counted, "numbers", 5, [
            {"$sample": {"size": 5}}, {"$match": {"_id": {"$gte": 0}}}, {"$project": {"tag": 1}}])
    assert len(rest) == 5 and all(set(document) == {"_id", "tag"} for document in rest)
    assert after.count <= 5 * 2
    total = counted.db.numbers.estimated_document_count()
    every = [document["_id"] for document in _sampled(  # more than there are: each one once
        counted, "numbers", total + 10, [{"$sample": {"size": total + 10}}])]
    assert len(every) == total == len(set(every))


def test_a_sample_on_another_collection_is_mongoecos(counted: Counted) -> None:
    total = counted.db.numbers.estimated_document_count()
    with counted.reading() as reads:
        drawn = _sampled(counted, "numbers", 5, [{"$sample": {"size": 5}}], drawn_from="oids")
    assert len(drawn) == 5 and reads.count == total


def test_the_wire_layer_knows_a_leading_sample() -> None:
    from migronaut.devserver.wire import _leading_sample

    def body(pipeline: object, name: object = "c") -> dict[str, object]:
        return {"aggregate": name, "pipeline": pipeline, "cursor": {}}

    assert _leading_sample(body([{"$sample": {"size": 7}}, {"$match": {"a": 1}}])) == 7
    others = [body([{"$match": {}}, {"$sample": {"size": 7}}]), body([{"$sample": {"size": 0}}]),
              body([{"$sample": {"size": 7.0}}]), body([{"$sample": {"size": True}}]),
              body([{"$sample": {"size": 7, "x": 1}}]), body([{"$sample": 7}]), body([]),
              body([{"$sample": {"size": 7}}], name=1)]
    assert [_leading_sample(other) for other in others] == [None] * len(others)


def test_unique_indexes_are_checked_from_their_index(counted: Counted) -> None:
    from mongoeco.errors import DuplicateKeyError

    pairs = counted.db.pairs
    pairs.insert_many([{"_id": n, "a": n % 50, "b": n // 50} for n in range(SIZE)])
    pairs.create_index([("a", 1), ("b", 1)], unique=True, name="a_b")
    pairs.create_index("c", unique=True, name="c_partial",
                       partial_filter_expression={"c": {"$exists": True}})
    with counted.reading() as reads:
        with pytest.raises(DuplicateKeyError):
            pairs.insert_one({"_id": "pair", "a": 3, "b": 1})  # as _id 53 has
        pairs.insert_one({"_id": "fresh", "a": 3, "b": 999})
        pairs.insert_one({"_id": "c1", "c": 1, "a": -1, "b": -1})
        pairs.insert_one({"_id": "no c", "a": -2, "b": -2})  # outside the partial index
        with pytest.raises(DuplicateKeyError):
            pairs.insert_one({"_id": "c2", "c": 1.0, "a": -3, "b": -3})
    assert reads.count <= 5 * FEW


def test_a_compound_unique_index_sees_every_element_of_an_array(fresh: Counted) -> None:
    from mongoeco.errors import DuplicateKeyError

    tags = fresh.db.tags
    tags.create_index([("k", 1), ("t", 1)], unique=True)
    tags.insert_one({"_id": 1, "k": "x", "t": ["red", "blue"]})
    with pytest.raises(DuplicateKeyError):
        tags.insert_one({"_id": 2, "k": "x", "t": "blue"})  # the second element collides
    tags.insert_one({"_id": 3, "k": "y", "t": "blue"})
    tags.delete_one({"_id": 1})
    tags.insert_one({"_id": 2, "k": "x", "t": "blue"})  # free again once the array is gone
    assert sorted(doc["_id"] for doc in tags.find()) == [2, 3]


def test_a_unique_index_build_refuses_duplicates_and_leaves_no_index(fresh: Counted) -> None:
    from mongoeco.errors import DuplicateKeyError

    counted = fresh
    people = counted.db.people
    people.insert_many([{"_id": n, "email": f"{n}@x", "team": n % 3} for n in range(SIZE)])
    people.insert_one({"_id": "twin", "email": "7@x", "team": 1})
    with counted.reading() as reads, pytest.raises(DuplicateKeyError) as refused:
        people.create_index("email", unique=True, name="email_unique")
    assert "email_unique" in str(refused.value) and "7@x" in str(refused.value)
    assert "email_unique" not in people.index_information()
    assert reads.count <= 2 * (SIZE + 1) + FEW  # two passes (build, then entries), not pairs
    people.delete_one({"_id": "twin"})
    people.create_index("email", unique=True, name="email_unique")
    assert people.index_information()["email_unique"]["unique"] is True
    with pytest.raises(DuplicateKeyError):
        people.insert_one({"_id": "again", "email": "7@x"})
    people.create_index("email", unique=True, name="email_unique")  # the same again: a no-op
    people.create_index([("team", 1), ("email", 1)], unique=True)


def _trees(*leaves: Any) -> Any:
    """Documents and arrays (keys of any type, small) over the given leaf strategies."""
    return st.recursive(
        st.one_of(*leaves),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.dictionaries(st.one_of(st.text(max_size=2), st.integers(0, 2)), inner,
                            max_size=3)),
        max_leaves=8)


_values = _trees(st.none(), st.booleans(), st.floats(allow_nan=True), st.text(max_size=3),
                 st.integers(-(2**64), 2**64), st.builds(ObjectId), st.binary(max_size=2),
                 st.sets(st.integers(0, 2), max_size=2))


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_values)
def test_stored_values_are_checked_as_mongoeco_checks_them(counted: Counted, value: Any) -> None:
    from mongoeco.core import bson_scalars, codec

    assert codec.validate_bson_value is not bson_scalars.validate_bson_value  # ours is in place

    def outcome(check: Any) -> str:
        try:
            check(value)
        except Exception as error:  # the type and message the server would turn into a reply
            return f"{type(error).__name__}: {error}"
        return "ok"

    assert outcome(codec.validate_bson_value) == outcome(bson_scalars.validate_bson_value)


def test_count_documents_is_served_as_a_count_not_a_pipeline_over_every_document() -> None:
    from migronaut.devserver.wire import _as_count

    group = {"$group": {"_id": 1, "n": {"$sum": 1}}}
    sent = {"aggregate": "c", "pipeline": [{"$match": {"a": 1}}, {"$skip": 2}, {"$limit": 3},
                                           group], "cursor": {}, "$db": "d", "lsid": {"id": 1},
            "hint": "a_1"}
    assert _as_count(sent) == {"count": "c", "query": {"a": 1}, "skip": 2, "limit": 3,
                               "$db": "d", "lsid": {"id": 1}, "hint": "a_1"}
    assert _as_count({**sent, "pipeline": [{"$match": {}}, group]}) == {
        "count": "c", "query": {}, "$db": "d", "lsid": {"id": 1}, "hint": "a_1"}
    others = [
        {**sent, "autocommit": False},  # in a transaction mongod refuses count
        {**sent, "allowDiskUse": True},  # an option count has not
        {**sent, "pipeline": [{"$match": {}}, {"$limit": 3}, {"$skip": 2}, group]},
        {**sent, "pipeline": [{"$match": {}}, {"$group": {"_id": 1, "n": {"$sum": 2}}}]},
        {**sent, "pipeline": [{"$project": {"a": 1}}, group]},
    ]
    assert [_as_count(body) for body in others] == [None] * len(others)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.text(max_size=2), _values.filter(lambda v: not _has_set(v)),
                       max_size=4))
def test_documents_become_internal_as_mongoeco_makes_them(counted: Counted,
                                                          document: dict[str, Any]) -> None:
    import datetime

    from mongoeco.api._async import _collection_insert
    from mongoeco.core.codec import DocumentCodec

    ours = _collection_insert.DocumentCodec
    assert ours is not DocumentCodec  # the batch insert uses the dev server's copy
    document = {**document, "at": datetime.datetime(2026, 1, 2, 3, 4, 5, 6000,
                                                     tzinfo=datetime.UTC)}

    def made_by(codec: Any) -> Any:
        try:
            made = codec.to_internal(document)
        except Exception as error:  # the refusal a client would get
            return f"{type(error).__name__}: {error}"
        return made, _types(made)

    assert made_by(ours) == made_by(DocumentCodec)


def _has_set(value: Any) -> bool:
    if isinstance(value, dict):
        return any(not isinstance(key, str) or _has_set(item) for key, item in value.items())
    if isinstance(value, list):
        return any(_has_set(item) for item in value)
    return isinstance(value, set)


def _types(value: Any) -> Any:
    if isinstance(value, dict):
        return (type(value).__name__, {key: _types(item) for key, item in value.items()})
    if isinstance(value, list):
        return (type(value).__name__, [_types(item) for item in value])
    return type(value).__name__


def test_a_document_id_is_one_key_whichever_numeric_types_it_holds(fresh: Counted) -> None:
    from mongoeco.errors import DuplicateKeyError

    ids = fresh.db.ids
    fresh.db.command({"insert": "ids", "documents": [{"_id": {"a": 1, "b": [2, "x"]}}]})
    for twin in ({"a": 1.0, "b": [Int64(2), "x"]}, {"a": Decimal128("1"), "b": [2.0, "x"]}):
        assert ids.find_one({"_id": twin}) is not None
        with pytest.raises(DuplicateKeyError):
            ids.insert_one({"_id": twin})
    ids.insert_one({"_id": {"b": [2, "x"], "a": 1}})  # field order counts
    assert ids.count_documents({}) == 2


_writes = st.lists(st.tuples(
    st.sampled_from(["set", "set", "delete", "retype", "copy", "restore", "pop"]),
    st.integers(0, 30), st.integers(0, 12)), max_size=80)


@settings(max_examples=200, deadline=None)
@given(_writes, st.sampled_from([(1, 1), (2, 1), (1, 2), (128, 32)]))
def test_the_lean_collection_behaves_as_an_insertion_ordered_dict(
    writes: list[Any], loads: tuple[int, int]
) -> None:
    """The collection the engine stores documents in (a persistent map and two indexes) against
    a plain dict: natural order, lookups, retyped keys, copies, snapshots and restores. Tiny
    chunks and groups put deletes and re-inserts across their boundaries every few writes."""
    from mongoeco.engines import memory

    from migronaut.devserver.mongoeco_internals import indexed_memory_engine

    indexed_memory_engine()
    kind = memory.MemoryCollection
    kind.index_loads, default = loads, kind.index_loads
    try:
        _writes_as_a_dict(kind(), writes)
    finally:
        kind.index_loads = default


def _writes_as_a_dict(collection: Any, writes: list[Any]) -> None:
    model: dict[Any, Any] = {}
    copies: list[tuple[Any, dict[Any, Any]]] = []
    state, state_model = collection._snapshot_state(), {}
    for step, (operation, number, other) in enumerate(writes):
        key = ("number", number) if number % 3 else ("str", str(number))
        if operation == "set":
            collection[key] = model[key] = step
        elif operation == "delete" and key in model:
            del collection[key]
            del model[key]
        elif operation == "retype" and key in model:
            replacement = ("str", f"r{other}")
            if replacement not in model:
                collection.replace_key(key, replacement)
                model = {replacement if name == key else name: value
                         for name, value in model.items()}
        elif operation == "copy":
            copies.append((collection.copy(), dict(model)))
            state, state_model = collection._snapshot_state(), dict(model)
        elif operation == "restore":
            collection._restore_state(state)
            model = dict(state_model)
        elif operation == "pop" and model:
            assert collection.popitem() == model.popitem()
        assert list(collection.items()) == list(model.items()) and len(collection) == len(model)
        assert (key in collection) == (key in model) and collection.get(key) == model.get(key)
        assert collection.ordered_keys(reversed(list(model))) == list(model)
        if model:
            last = list(model)[-1]
            assert collection.ordinal_for(last) == max(map(collection.ordinal_for, model))
    for twin, kept in copies:  # a copy keeps what it had when taken
        assert list(twin.items()) == list(kept.items())


_spec_values = _trees(st.none(), st.booleans(), st.floats(allow_nan=False), st.text(max_size=3),
                      st.integers(-(2**64), 2**64), st.datetimes(), st.builds(ObjectId),
                      st.binary(max_size=2), st.builds(Int64, st.integers(-(2**63), 2**63 - 1)),
                      st.sets(st.integers(0, 2), max_size=2))


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(
    st.dictionaries(st.sampled_from(["$set", "$inc", "$unset", "x"]), _spec_values, max_size=3),
    st.lists(st.dictionaries(st.sampled_from(["$set", "$replaceWith"]), _spec_values,
                             max_size=2), max_size=3),
    _spec_values))
def test_update_specs_become_internal_as_mongoeco_makes_them(counted: Counted,
                                                             spec: Any) -> None:
    from mongoeco.api._async import _collection_modify
    from mongoeco.core import bson_scalars
    from mongoeco.core.codec import DocumentCodec

    ours = _collection_modify.DocumentCodec
    assert ours is not DocumentCodec  # the update commands use the dev server's copy
    wrapped = {"$set": {"a": [bson_scalars.BsonInt64(5), bson_scalars.BsonInt32(2),
                              bson_scalars.BsonDouble(1.5)]}}

    def made_by(codec: Any, value: Any) -> Any:
        try:
            made = codec.to_internal(value)
        except Exception as error:  # the refusal a client would get
            return f"{type(error).__name__}: {error}"
        return made, _types(made)

    assert made_by(ours, spec) == made_by(DocumentCodec, spec)
    assert made_by(ours, wrapped) == made_by(DocumentCodec, wrapped)
    internal = DocumentCodec.to_internal({"$set": {"a": 1}})
    assert ours.to_internal(internal) is internal


def test_an_update_pipeline_is_compiled_once_per_update(
        fresh: Counted, monkeypatch: pytest.MonkeyPatch) -> None:
    from mongoeco.core.operators import UpdateEngine

    compiled: list[Any] = []
    compile_pipeline = UpdateEngine.compile_update_pipeline_plan

    def counting(spec: Any, **options: Any) -> Any:
        compiled.append(spec)
        return compile_pipeline(spec, **options)

    monkeypatch.setattr(UpdateEngine, "compile_update_pipeline_plan", staticmethod(counting))
    coll = fresh.db.pipelines
    coll.insert_one({"_id": 1, "n": 1})
    pipeline = [{"$set": {"n": {"$add": ["$n", 1]}, "tag": {"$literal": "$not-a-path"}}}]

    coll.update_one({"_id": 1}, pipeline, upsert=True)  # matched: the plan for a match
    assert len(compiled) == 1
    coll.update_one({"_id": 2}, pipeline, upsert=True)  # none matched: the upsert's plan
    assert len(compiled) == 2
    coll.update_one({"_id": 3}, [{"$set": {"other": {"$literal": 7}}}], upsert=True)
    assert len(compiled) == 3

    assert list(coll.find({}, sort=[("_id", 1)])) == [
        {"_id": 1, "n": 2, "tag": "$not-a-path"},
        {"_id": 2, "n": None, "tag": "$not-a-path"},  # a missing $n: $add gives null
        {"_id": 3, "other": 7},
    ]


def test_the_upsert_plan_of_a_pipeline_is_mongoecos() -> None:
    from mongoeco.api import operations
    from mongoeco.compat import MONGODB_DIALECT_70
    from mongoeco.core.operators import UpdateEngine
    from mongoeco.errors import OperationFailure
    from mongoeco.types import PlanningMode

    from migronaut.devserver.mongoeco_internals import indexed_memory_engine

    indexed_memory_engine()  # the hooks are in place
    pipeline = [{"$set": {"n": {"$ifNull": ["$n", {"$literal": 5}]}, "at": "$$NOW"}},
                {"$unset": "gone"}]
    options: dict[str, Any] = {"dialect": MONGODB_DIALECT_70, "selector_filter": {"_id": 1},
                               "collation": None, "array_filters": None, "variables": None}

    plan, upsert = operations._compile_update_plans(
        pipeline, planning_mode=PlanningMode.STRICT, **options)
    theirs = UpdateEngine.compile_update_plan(pipeline, is_upsert_insert=True, **options)
    assert upsert.context == theirs.context and upsert.context.is_upsert_insert
    assert not plan.context.is_upsert_insert
    for document in ({"_id": 1}, {"_id": 1, "n": 2, "gone": True}):
        ours, mongoecos = dict(document), dict(document)
        assert upsert.apply(ours) == theirs.apply(mongoecos)
        assert {k: v for k, v in ours.items() if k != "at"} == {
            k: v for k, v in mongoecos.items() if k != "at"}
    refused = [{"$set": {"a": {"$nope": 1}}}]
    with pytest.raises(OperationFailure) as ours_error:
        operations._compile_update_plans(refused, planning_mode=PlanningMode.STRICT, **options)
    with pytest.raises(OperationFailure) as their_error:
        UpdateEngine.compile_update_plan(refused, **options)
    assert (ours_error.value.code, str(ours_error.value)) == (
        their_error.value.code, str(their_error.value))
    assert operations._compile_update_plans(
        refused, planning_mode=PlanningMode.RELAXED, **options) == (None, None)
    with pytest.raises(OperationFailure):
        operations._compile_update_plans(
            pipeline, planning_mode=PlanningMode.STRICT, **{**options, "array_filters": [{"x": 1}]})


_index_paths = st.lists(st.sampled_from(["a", "b", "a.b", "a.c", "b.a.c", "c.0", "0"]),
                        min_size=2, max_size=3, unique=True)
_index_leaves = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(-2, 2),
                          st.text(max_size=2), st.builds(ObjectId),
                          st.builds(Int64, st.integers(0, 2)),
                          st.builds(Decimal128, st.sampled_from(["1", "1.0", "0.5"])),
                          st.datetimes())
_index_documents = st.recursive(
    _index_leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(["a", "b", "c", "0"]), inner,
                                            max_size=3)),
    max_leaves=10).map(lambda value: value if isinstance(value, dict) else {"a": value})


@settings(max_examples=500, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_index_documents, _index_paths)
def test_a_compound_index_keys_a_document_as_mongoeco_does(fresh: Counted,
                                                           document: dict[str, Any],
                                                           fields: list[str]) -> None:
    from mongoeco.engines.memory import MemoryEngine

    engine = fresh.engine
    assert engine._index_keys(document, fields) == MemoryEngine._unique_index_keys(
        engine, document, fields)
