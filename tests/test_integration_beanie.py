"""``migronaut.integrations.beanie`` with the real Beanie against the dev server: insert stamps,
a stale save/replace/update raises the conflict with its reason, two writers racing on one
document (exactly one wins), an old document upcast on load, and a new document with its own id
inserted rather than guarded (reference collections §3.5)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from beanie import PydanticObjectId, init_beanie
from pymongo import AsyncMongoClient

from migronaut import versioning as v
from migronaut.errors import RevisionConflictError, ShapeVersionError
from migronaut.integrations.beanie import versioned_document

IDS = [PydanticObjectId() for _ in range(4)]
SHAPES = v.define_shapes({"plans": {"versioning": {"current": 2, "min": 1}}})


def add_tier(doc: dict[str, Any]) -> dict[str, Any]:
    doc["tier"] = "free"
    return doc


class Plan(versioned_document(SHAPES, "plans", {1: add_tier})):  # type: ignore[misc]
    name: str
    tier: str = "pro"


UNGUARDED = v.define_shapes({"notes": {"versioning": {"current": 1, "min": 1,
                                                      "revision": False}}})


class Note(versioned_document(UNGUARDED, "notes")):  # type: ignore[misc]
    text: str


Body = Callable[[Any], Awaitable[None]]


def run(mongo_uri: str, db_name: str, body: Body) -> None:
    async def main() -> None:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_uri)
        try:
            await init_beanie(database=client[db_name], document_models=[Plan, Note])
            await body(client[db_name].plans)
        finally:
            await client.close()

    asyncio.run(main())


def test_insert_stamps_current_and_revision_zero(mongo_uri: str, db_name: str) -> None:
    async def body(raw: Any) -> None:
        plan = await Plan(name="a").insert()
        assert (plan.shape_version, plan.revision) == (2, 0)
        await Plan(name="b").save()
        await Plan.insert_many([Plan(name="c"), Plan(name="d")])
        stored = await raw.find({}, {"_id": 0}).sort("name", 1).to_list()
        assert stored == [{"name": n, "tier": "pro", "__v": 2, "__rev": 0} for n in "abcd"]

    run(mongo_uri, db_name, body)


def test_a_loaded_document_is_saved_at_its_revision_and_a_stale_one_conflicts(
    mongo_uri: str, db_name: str
) -> None:
    async def body(raw: Any) -> None:
        plan = await Plan(name="a").insert()
        mine = await Plan.get(plan.id)
        theirs = await Plan.get(plan.id)
        assert mine is not None and theirs is not None
        mine.tier = "team"
        await mine.save()
        assert mine.revision == 1
        assert await raw.find_one({}, {"_id": 0}) == {
            "name": "a", "tier": "team", "__v": 2, "__rev": 1}
        theirs.tier = "gold"
        for write in (theirs.save, theirs.replace, lambda: theirs.set({Plan.tier: "x"})):
            with pytest.raises(RevisionConflictError) as caught:
                await write()
            assert caught.value.context == {"reason": "conflict", "expected": 0, "actual": 1,
                                            "collection": "plans"}
        await mine.set({Plan.tier: "silver"})  # a guarded update refreshes the document
        assert (mine.tier, mine.revision) == ("silver", 2)
        assert (await raw.find_one({}))["__rev"] == 2
        await raw.delete_many({})
        with pytest.raises(RevisionConflictError) as gone:
            await mine.save()
        assert gone.value.context["reason"] == "not-found"

    run(mongo_uri, db_name, body)


def test_two_writers_race_and_exactly_one_wins(mongo_uri: str, db_name: str) -> None:
    async def body(raw: Any) -> None:
        plan = await Plan(name="a").insert()
        copies = [await Plan.get(plan.id) for _ in range(6)]
        for index, copy in enumerate(copies):
            copy.tier = f"t{index}"  # type: ignore[union-attr]
        results = await asyncio.gather(*(c.save() for c in copies),  # type: ignore[union-attr]
                                       return_exceptions=True)
        winners = [r for r in results if not isinstance(r, BaseException)]
        losers = [r for r in results if isinstance(r, RevisionConflictError)]
        assert (len(winners), len(losers)) == (1, 5)
        assert {e.context["reason"] for e in losers} == {"conflict"}
        stored = await raw.find_one({})
        assert (stored["__rev"], stored["tier"]) == (1, winners[0].tier)

    run(mongo_uri, db_name, body)


def test_an_old_document_is_upcast_on_load_and_saved_whole(mongo_uri: str,
                                                            db_name: str) -> None:
    async def body(raw: Any) -> None:
        await raw.insert_many([{"_id": IDS[1], "name": "legacy", "__v": 1},
                               {"_id": IDS[2], "name": "future", "__v": 3},
                               {"_id": IDS[3], "name": "ancient"}])
        plan = await Plan.get(IDS[1])
        assert plan is not None and (plan.tier, plan.shape_version, plan.revision) == (
            "free", 2, None)
        assert await raw.find_one({"_id": IDS[1]}) == {"_id": IDS[1], "name": "legacy", "__v": 1}
        await plan.save()  # a legacy document without __rev is guarded as revision 0
        assert await raw.find_one({"_id": IDS[1]}) == {
            "_id": IDS[1], "name": "legacy", "tier": "free", "__v": 2, "__rev": 1}
        with pytest.raises(ShapeVersionError) as newer:
            await Plan.get(IDS[2])
        assert newer.value.context["reason"] == "newer"
        with pytest.raises(ShapeVersionError) as old:
            await Plan.get(IDS[3])
        assert old.value.context["reason"] == "below-min"

    run(mongo_uri, db_name, body)


def test_a_new_document_with_its_own_id_is_inserted_not_guarded(mongo_uri: str,
                                                                db_name: str) -> None:
    async def body(raw: Any) -> None:
        await Plan(id=IDS[0], name="own").save()
        assert await raw.find_one({"_id": IDS[0]}) == {
            "_id": IDS[0], "name": "own", "tier": "pro", "__v": 2, "__rev": 0}

    run(mongo_uri, db_name, body)


def test_without_revisions_documents_are_stamped_and_saved_as_beanie_saves(
    mongo_uri: str, db_name: str
) -> None:
    async def body(raw: Any) -> None:
        note = await Note(text="a").insert()
        assert "revision" not in Note.model_fields
        loaded = await Note.get(note.id)
        assert loaded is not None
        loaded.text = "b"
        await loaded.save()
        await loaded.set({Note.text: "c"})
        assert await raw.database.notes.find({}, {"_id": 0}).to_list() == [
            {"text": "c", "__v": 1}]

    run(mongo_uri, db_name, body)


def revisions(stored: list[dict[str, Any]]) -> dict[str, Any]:
    return {doc["name"]: doc.get("__rev") for doc in stored}


def test_query_level_updates_bump_the_revision(mongo_uri: str, db_name: str) -> None:
    """``find(...).update``, ``update_many``, ``set``, ``inc``, ``find_one(...).update`` and
    ``update_all`` bump ``__rev`` of every document they change — so a document loaded before
    them is stale — unless the update writes the revision itself."""
    async def body(raw: Any) -> None:
        await Plan.insert_many([Plan(name="a"), Plan(name="b"), Plan(name="c")])
        loaded = await Plan.find_one(Plan.name == "a")
        assert loaded is not None and loaded.revision == 0

        await Plan.find(Plan.name != "c").update({"$set": {"tier": "team"}})
        await Plan.find(Plan.name == "a").update_many({"$set": {"tier": "gold"}})
        await Plan.find(Plan.name == "a").set({Plan.tier: "silver"})
        await Plan.find_one(Plan.name == "b").update({"$set": {"tier": "x"}})
        await Plan.update_all({"$set": {"seen": True}})
        stored = await raw.find({}).to_list()
        assert revisions(stored) == {"a": 4, "b": 3, "c": 1}
        assert {doc["name"]: doc["tier"] for doc in stored} == {
            "a": "silver", "b": "x", "c": "pro"}

        loaded.tier = "mine"
        with pytest.raises(RevisionConflictError) as caught:
            await loaded.save()  # loaded at 0, bumped by the query updates meanwhile
        assert caught.value.context["actual"] == 4

        await Plan.find(Plan.name == "c").update({"$set": {"__rev": 10}})  # written: kept
        await Plan.find(Plan.name == "c").update([{"$set": {"tier": "piped"}}])  # pipeline
        stored = await raw.find({"name": "c"}).to_list()
        assert (stored[0]["__rev"], stored[0]["tier"]) == (11, "piped")

    run(mongo_uri, db_name, body)


def test_query_level_upserts_stamp_the_version_and_bulk_writers_bump(
    mongo_uri: str, db_name: str
) -> None:
    async def body(raw: Any) -> None:
        from beanie import BulkWriter

        await Plan.find(Plan.name == "new").upsert(
            {"$set": {"tier": "t"}}, on_insert=Plan(name="new"))  # inserts on_insert, stamped
        await Plan.find_one(Plan.name == "raw").update(
            {"$set": {"tier": "r"}}, upsert=True)  # the server inserts
        assert await raw.find({}, {"_id": 0}).sort("name", 1).to_list() == [
            {"name": "new", "tier": "pro", "__v": 2, "__rev": 0},
            {"name": "raw", "tier": "r", "__v": 2, "__rev": 1}]

        async with BulkWriter() as writer:
            await Plan.find(Plan.name == "new").update({"$set": {"tier": "bulk"}},
                                                       bulk_writer=writer)
            await Plan.find_one(Plan.name == "raw").update({"$set": {"tier": "bulk"}},
                                                           bulk_writer=writer)
        assert revisions(await raw.find({}).to_list()) == {"new": 1, "raw": 2}

    run(mongo_uri, db_name, body)


def test_without_revisions_query_updates_are_left_as_written(mongo_uri: str,
                                                             db_name: str) -> None:
    async def body(raw: Any) -> None:
        await Note(text="a").insert()
        await Note.find(Note.text == "a").update({"$set": {"text": "b"}})
        assert await raw.database.notes.find({}, {"_id": 0}).to_list() == [
            {"text": "b", "__v": 1}]

    run(mongo_uri, db_name, body)


def test_queries_see_stored_shapes_so_legacy_documents_are_loaded_and_saved_whole(
    mongo_uri: str, db_name: str
) -> None:
    """The collections guide's example: a query on ``tier`` misses a version-1 document (it
    has no ``tier`` until the upcaster runs, in memory); the current shape is updated by a
    query, the old one by loading (upcast) and saving whole."""

    async def body(raw: Any) -> None:
        await raw.insert_many([{"_id": IDS[0], "name": "legacy", "__v": 1},
                               {"_id": IDS[1], "name": "now", "tier": "free", "__v": 2,
                                "__rev": 0}])
        assert [p.name for p in await Plan.find(Plan.tier == "free").to_list()] == ["now"]
        await Plan.find(Plan.tier == "free", Plan.shape_version == 2).set({Plan.tier: "pro"})
        async for plan in Plan.find(Plan.shape_version == 1):
            plan.tier = "pro"
            await plan.save()
        stored = await raw.find({}, {"_id": 0, "name": 1, "tier": 1, "__v": 1}).to_list()
        assert sorted(stored, key=lambda d: d["name"]) == [
            {"name": "legacy", "tier": "pro", "__v": 2}, {"name": "now", "tier": "pro", "__v": 2}]

    run(mongo_uri, db_name, body)
