"""``migronaut.versioning`` against the dev server: every guarded writer's success and each
conflict reason, two writers racing on one document, ``retry_on_conflict`` over real
conflicts, the async variants, and the upcaster's step driving a real background migration
(reference collections §3.4, §3.7)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from pymongo import AsyncMongoClient, ReturnDocument

from migronaut import versioning as v
from migronaut.errors import ConfigInvalidError, RevisionConflictError

WRITERS = {
    "update": lambda coll, f, rev, **kw: v.update_with_revision(
        coll, f, rev, {"$set": {"x": rev}}, **kw),
    "replace": lambda coll, f, rev, **kw: v.replace_with_revision(
        coll, f, rev, {"x": rev, "__v": 1}, **kw),
    "find_one_and_update": lambda coll, f, rev, **kw: v.find_one_and_update_with_revision(
        coll, f, rev, [{"$set": {"x": rev}}], **kw),
}


def reason_of(call: Any) -> dict[str, Any]:
    with pytest.raises(RevisionConflictError) as caught:
        call()
    assert caught.value.exit_code == 29 and caught.value.code == "REVISION_CONFLICT"
    return caught.value.context


@pytest.mark.parametrize("kind", list(WRITERS))
def test_each_writer_applies_at_the_expected_revision_and_names_each_miss(
    db: Any, kind: str
) -> None:
    write = WRITERS[kind]
    coll = db.orders
    coll.insert_many([{"_id": 1, "__v": 1}, {"_id": 2, "__v": 1, "__rev": 5}])
    first = write(coll, {"_id": 1}, 0)  # a legacy document without __rev is at revision 0
    if kind == "find_one_and_update":
        assert first == {"_id": 1, "__v": 1, "__rev": 1, "x": 0}
    else:
        assert (first.revision, first.matched_count, first.modified_count) == (1, 1, 1)
    assert coll.find_one({"_id": 1}) == {"_id": 1, "__v": 1, "__rev": 1, "x": 0}
    write(coll, {"_id": 2}, 5)
    assert coll.find_one({"_id": 2})["__rev"] == 6

    stale = reason_of(lambda: write(coll, {"_id": 1}, 0))
    assert stale == {"reason": "conflict", "expected": 0, "actual": 1, "collection": "orders"}
    assert reason_of(lambda: write(coll, {"_id": 3}, 0)) == {
        "reason": "not-found", "expected": 0, "collection": "orders"}
    assert reason_of(lambda: write(coll, {"_id": 1}, 0, verify=False))["reason"] == "unknown"
    # the re-read uses the caller's whole filter: a document it does not match is not found
    missing = reason_of(lambda: write(coll, {"_id": 1, "x": {"$type": "string"}}, 1))
    assert missing["reason"] == "not-found"
    assert coll.find_one({"_id": 1}) == {"_id": 1, "__v": 1, "__rev": 1, "x": 0}


@pytest.mark.parametrize("kind", list(WRITERS))
@pytest.mark.parametrize(("stored", "expected"), [
    ([0, 5], 5), ([0, 5], 0), ([None], 0), ([], 0), ([[3]], 3), ([3.0], 3),
])
def test_an_array_revision_is_refused_and_left_as_it_is(
    db: Any, kind: str, stored: Any, expected: int
) -> None:
    """A query on a field matches an array holding the value: ``__rev: [0, 5]`` used to pass the
    guard for 5 (and become 6 — or a raw WriteError, ``$inc`` of an array), ``[None]`` for 0.
    An array is no revision: the write is refused as ``invalid`` naming the field, and nothing
    is written."""
    write = WRITERS[kind]
    coll = db.orders
    coll.insert_one({"_id": 1, "__v": 1, "__rev": stored})
    context = reason_of(lambda: write(coll, {"_id": 1}, expected))
    assert context == {"reason": "invalid", "expected": expected, "field": "__rev",
                       "type": "list", "collection": "orders"}
    assert coll.find_one({"_id": 1}) == {"_id": 1, "__v": 1, "__rev": stored}
    with pytest.raises(RevisionConflictError, match=r"Revision conflict on orders: expected "
                       r"revision \d+, the document's '__rev' holds a list, not a "
                       r"non-negative integer revision"):
        write(coll, {"_id": 1}, expected)


def test_a_shape_version_filter_never_matches_an_array(db: Any) -> None:
    shapes = v.define_shapes({"orders": {"versioning": {"current": 2, "min": 1}}})
    db.orders.insert_many([{"_id": 1, "__v": [1, 2]}, {"_id": 2, "__v": [None]},
                           {"_id": 3, "__v": 2}, {"_id": 4}])
    assert [d["_id"] for d in db.orders.find(shapes.version_filter("orders", 2))] == [3]
    assert [d["_id"] for d in db.orders.find(shapes.version_filter("orders", 0))] == [4]


def test_a_miss_at_the_same_revision_is_unknown(db: Any) -> None:
    """The write missed but the re-read finds the document at the expected revision (it moved
    in between, or the filters differ): the writer does not claim a reason it cannot know."""
    db.orders.insert_one({"_id": 1, "__rev": 2})

    class Racy:
        """Reports a miss although the document is at the expected revision."""

        name = "orders"

        def update_one(self, *args: Any, **kwargs: Any) -> Any:
            return type("R", (), {"acknowledged": True, "matched_count": 0,
                                  "modified_count": 0})()

        def with_options(self, **kwargs: Any) -> Any:
            return db.orders.with_options(**kwargs)

    context = reason_of(lambda: v.update_with_revision(Racy(), {"_id": 1}, 2, {"$set": {}}))
    assert context == {"reason": "unknown", "expected": 2, "collection": "orders"}


def test_versions_are_set_unset_and_kept_as_asked(db: Any) -> None:
    coll = db.orders
    coll.insert_one({"_id": 1, "__v": 1, "a": 1})
    v.update_with_revision(coll, {"_id": 1}, 0, {"$set": {"a": 2}}, version=2)
    assert coll.find_one({"_id": 1}) == {"_id": 1, "__v": 2, "a": 2, "__rev": 1}
    v.update_with_revision(coll, {"_id": 1}, 1, [{"$set": {"a": 3}}], version=3)
    assert coll.find_one({"_id": 1}) == {"_id": 1, "__v": 3, "a": 3, "__rev": 2}
    v.update_with_revision(coll, {"_id": 1}, 2, [{"$set": {"a": 4}}], version=0)
    assert coll.find_one({"_id": 1}) == {"_id": 1, "a": 4, "__rev": 3}
    v.update_with_revision(coll, {"_id": 1}, 3, {"$set": {"a": 5}}, version=4)
    v.update_with_revision(coll, {"_id": 1}, 4, {"$set": {"a": 6}}, version=0)
    assert coll.find_one({"_id": 1}) == {"_id": 1, "a": 6, "__rev": 5}
    v.replace_with_revision(coll, {"_id": 1}, 5, {"b": 1, "__rev": 0}, version=3)
    assert coll.find_one({"_id": 1}) == {"_id": 1, "b": 1, "__rev": 6, "__v": 3}
    v.replace_with_revision(coll, {"_id": 1}, 6, {"b": 2})  # no version: the doc becomes v0
    assert coll.find_one({"_id": 1}) == {"_id": 1, "b": 2, "__rev": 7}


def test_driver_options_pass_through_and_return_document_is_honoured(db: Any) -> None:
    coll = db.orders
    coll.insert_one({"_id": 1, "items": [{"n": 1}, {"n": 2}], "sv": 1, "rv": 3})
    before = v.find_one_and_update_with_revision(
        coll, {"_id": 1}, 3, {"$set": {"items.$[i].n": 9}}, array_filters=[{"i.n": 2}],
        field="sv", revision_field="rv", version=2, return_document=ReturnDocument.BEFORE,
        projection={"_id": 0, "rv": 1})
    assert before == {"rv": 3}
    assert coll.find_one({"_id": 1}) == {"_id": 1, "items": [{"n": 1}, {"n": 9}], "sv": 2,
                                         "rv": 4}
    with pytest.raises(TypeError):
        v.update_with_revision(coll, {"_id": 1}, 4, {"$set": {"a": 1}}, no_such_option=1)
    assert coll.find_one({"_id": 1})["rv"] == 4


def test_unacknowledged_collections_are_refused_before_sending(db: Any) -> None:
    from pymongo import WriteConcern

    coll = db.orders.with_options(write_concern=WriteConcern(w=0))
    with pytest.raises(ConfigInvalidError, match="w: 0"):
        v.update_with_revision(coll, {"_id": 1}, 0, {"$set": {"a": 1}})
    assert db.orders.count_documents({}) == 0


def test_two_writers_racing_on_one_document_exactly_one_wins(db: Any) -> None:
    """Both read revision 0, both write guarded at the same moment: one applies, the other
    gets ``conflict`` with the winner's revision — every round."""
    coll = db.orders
    for round_ in range(15):
        coll.insert_one({"_id": round_, "__v": 1, "__rev": 0})
        barrier = threading.Barrier(2)
        outcomes: dict[str, Any] = {}

        def writer(name: str, round_: int = round_, barrier: threading.Barrier = barrier,
                   outcomes: dict[str, Any] = outcomes) -> None:
            expected = v.revision_of(coll.find_one({"_id": round_}))
            barrier.wait()
            try:
                outcomes[name] = v.update_with_revision(coll, {"_id": round_}, expected,
                                                        {"$set": {"by": name}})
            except RevisionConflictError as error:
                outcomes[name] = error

        threads = [threading.Thread(target=writer, args=(name,)) for name in ("a", "b")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        winners = [n for n, o in outcomes.items() if isinstance(o, v.RevisionResult)]
        losers = [o for o in outcomes.values() if isinstance(o, RevisionConflictError)]
        assert len(winners) == 1 and len(losers) == 1, outcomes
        assert losers[0].context == {"reason": "conflict", "expected": 0, "actual": 1,
                                     "collection": "orders"}
        assert coll.find_one({"_id": round_}) == {"_id": round_, "__v": 1, "__rev": 1,
                                                  "by": winners[0]}


def test_retry_on_conflict_rereads_and_lands_every_increment(db: Any) -> None:
    """Four threads each add 1 ten times through read → guarded write → retry: no increment
    is lost, and the revision counts every write."""
    coll = db.counters
    coll.insert_one({"_id": "c", "value": 0})

    def add_one(attempt: int) -> Any:
        doc = coll.find_one({"_id": "c"})
        return v.replace_with_revision(coll, {"_id": "c"}, v.revision_of(doc),
                                       {"value": doc["value"] + 1})

    def worker() -> None:
        for _ in range(10):
            v.retry_on_conflict(add_one, attempts=100, backoff=lambda attempt: attempt)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert coll.find_one({"_id": "c"}) == {"_id": "c", "value": 40, "__rev": 40}


def test_shapes_stamp_inserts_and_upserts_and_bump_unguarded_writes(db: Any) -> None:
    shapes = v.define_shapes({"orders": {"versioning": {"current": 2, "min": 1}}})
    coll = db.orders
    coll.insert_many(shapes.on_insert("orders", [{"_id": 1}, {"_id": 2, "__v": 1}]))
    coll.update_one({"_id": 3}, shapes.stamp_upsert("orders", {"$set": {"a": 1}}), upsert=True)
    coll.update_one({"_id": 1}, shapes.stamp_upsert("orders", {"$set": {"a": 1}}), upsert=True)
    coll.update_many({}, v.bump_revision([{"$set": {"seen": True}}]))
    assert list(coll.find({}, sort=[("_id", 1)])) == [
        {"_id": 1, "__v": 2, "__rev": 2, "a": 1, "seen": True},
        {"_id": 2, "__v": 1, "__rev": 1, "seen": True},
        {"_id": 3, "__v": 2, "__rev": 2, "a": 1, "seen": True}]
    occ = shapes.occ("orders")
    occ.update_with_revision(coll, {"_id": 2}, 1, {"$set": {"b": 1}}, version=2)
    assert coll.count_documents(shapes.version_filter("orders", 2)) == 3


def test_async_writers_over_an_async_collection(mongo_uri: str, db_name: str) -> None:
    async def main() -> dict[str, Any]:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_uri)
        try:
            coll = client[db_name].orders
            await coll.insert_one({"_id": 1, "__v": 1})
            result = await v.aupdate_with_revision(coll, {"_id": 1}, 0, {"$set": {"a": 1}})
            assert result.revision == 1
            await v.areplace_with_revision(coll, {"_id": 1}, 1, {"a": 2, "__v": 1})
            doc = await v.afind_one_and_update_with_revision(coll, {"_id": 1}, 2,
                                                             {"$set": {"a": 3}}, version=2)
            assert doc == {"_id": 1, "a": 3, "__v": 2, "__rev": 3}
            with pytest.raises(RevisionConflictError) as caught:
                await v.aupdate_with_revision(coll, {"_id": 1}, 2, {"$set": {"a": 4}})
            assert caught.value.context["reason"] == "conflict"
            with pytest.raises(RevisionConflictError) as caught:
                await v.afind_one_and_update_with_revision(coll, {"_id": 9}, 0, {"$set": {}})
            assert caught.value.context["reason"] == "not-found"
            occ = v.define_shapes({"orders": {"versioning": {"current": 2}}}).occ("orders")

            async def bump(attempt: int) -> Any:
                found = await coll.find_one({"_id": 1})
                if attempt == 1:
                    await coll.update_one({"_id": 1}, v.bump_revision({"$set": {"x": 1}}))
                return await occ.aupdate_with_revision(coll, {"_id": 1}, v.revision_of(found),
                                                       {"$set": {"a": attempt}})

            await v.aretry_on_conflict(bump, backoff=lambda attempt: 0)
            final = await coll.find_one({"_id": 1})
            assert final is not None
            return final
        finally:
            await client.close()

    assert asyncio.run(main()) == {"_id": 1, "a": 2, "__v": 2, "__rev": 5, "x": 1}


def test_upcaster_step_is_a_background_migrations_migrate(project: Any, cli: Any,
                                                          db: Any) -> None:
    """Eager upgrade (§3.6): the upcaster's step, imported in a background migration file,
    rewrites the stored documents; the engine sets the version and bumps the revision."""
    db.plans.insert_many([{"_id": i, "name": f"p{i}", "__v": 1, "__rev": 0} for i in range(30)])
    db.plans.create_index([("__v", 1), ("_id", 1)])
    project.write_migration("0001_plans_v2", '''
from migronaut import versioning

PLANS = {"versioning": {"current": 2, "min": 1}}


def add_tier(doc):
    doc["tier"] = "free"
    return doc


upcaster = versioning.upcaster(PLANS, {1: add_tier})

background = {
    "collection": "plans",
    "from": 1,
    "to": 2,
    "migrate": upcaster.step(1),
    "batch_size": 10,
    "pause_ms": 0,
    "adaptive": False,
}
''')
    assert cli("up").exit_code == 0
    run = cli("background", "run", "0001_plans_v2.py")
    assert run.exit_code == 0, run.stderr
    assert db.plans.count_documents({"__v": 2, "__rev": 1, "tier": "free"}) == 30
