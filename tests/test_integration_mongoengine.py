"""``migronaut.integrations.mongoengine`` with the real MongoEngine against the dev server:
insert stamps, a stale save/update raises the conflict with its reason, two writers racing on one
document (exactly one wins), an old document upcast on load, query-set writes bump the revision,
and the save signals still fire (reference collections §3.5)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import mongoengine
import pytest
from bson import ObjectId
from mongoengine import StringField, signals

from migronaut import versioning as v
from migronaut.errors import RevisionConflictError, ShapeVersionError
from migronaut.integrations.mongoengine import versioned_document

SHAPES = v.define_shapes({"plans": {"versioning": {"current": 2, "min": 1}}})


def add_tier(doc: dict[str, Any]) -> dict[str, Any]:
    doc["tier"] = "free"
    return doc


class Plan(versioned_document(SHAPES, "plans", {1: add_tier})):  # type: ignore[misc]
    name = StringField(required=True)
    tier = StringField(default="pro")


@pytest.fixture
def raw(mongo_uri: str, db_name: str, db: Any) -> Iterator[Any]:
    """MongoEngine connected to the test's database; the raw ``plans`` collection."""
    mongoengine.connect(db=db_name, host=mongo_uri, alias="default",
                        uuidRepresentation="standard")
    try:
        yield db.plans
    finally:
        mongoengine.disconnect(alias="default")


def conflict_of(call: Any) -> dict[str, Any]:
    with pytest.raises(RevisionConflictError) as caught:
        call()
    assert caught.value.code == "REVISION_CONFLICT" and caught.value.exit_code == 29
    return caught.value.context


def test_insert_stamps_current_and_revision_zero(raw: Any) -> None:
    plan = Plan(name="a").save()
    assert (plan.shape_version, plan.revision) == (2, 0)
    with pytest.raises(mongoengine.NotUniqueError):  # a new object is inserted, never upserted
        Plan(pk=plan.pk, name="again").save()
    Plan(name="b").save()
    assert list(raw.find({}, {"_id": 0}).sort("name", 1)) == [
        {"name": n, "tier": "pro", "__v": 2, "__rev": 0} for n in "ab"]


def test_a_loaded_document_is_saved_at_its_revision_and_a_stale_one_conflicts(
    raw: Any
) -> None:
    plan = Plan(name="a").save()
    mine, theirs = Plan.objects.get(pk=plan.pk), Plan.objects.get(pk=plan.pk)
    mine.tier = "team"
    mine.save()
    assert mine.revision == 1
    assert raw.find_one({}, {"_id": 0}) == {"name": "a", "tier": "team", "__v": 2, "__rev": 1}
    theirs.tier = "gold"
    expected = {"reason": "conflict", "expected": 0, "actual": 1, "collection": "plans"}
    assert conflict_of(theirs.save) == expected
    assert conflict_of(lambda: theirs.update(set__tier="x")) == expected
    assert mine.update(set__tier="silver") == 1  # guarded, and the document is refreshed
    assert (mine.tier, mine.revision) == ("silver", 2)
    mine.name = "b"
    mine.save()
    assert raw.find_one({}, {"_id": 0}) == {"name": "b", "tier": "silver", "__v": 2, "__rev": 3}
    raw.delete_many({})
    assert conflict_of(mine.save)["reason"] == "not-found"


def test_two_writers_race_and_exactly_one_wins(raw: Any) -> None:
    plan = Plan(name="a").save()
    copies = [Plan.objects.get(pk=plan.pk) for _ in range(6)]
    start = threading.Barrier(len(copies))
    outcomes: list[Any] = [None] * len(copies)

    def write(index: int) -> None:
        copies[index].tier = f"t{index}"
        start.wait()
        try:
            copies[index].save()
            outcomes[index] = "won"
        except RevisionConflictError as error:
            outcomes[index] = error.context["reason"]

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(copies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["conflict"] * 5 + ["won"]
    stored = raw.find_one({})
    assert (stored["__rev"], stored["tier"]) == (1, f"t{outcomes.index('won')}")


def test_an_old_document_is_upcast_on_load_and_saved_whole(raw: Any) -> None:
    legacy, future, ancient = ObjectId(), ObjectId(), ObjectId()
    raw.insert_many([{"_id": legacy, "name": "legacy", "__v": 1},
                     {"_id": future, "name": "future", "__v": 3},
                     {"_id": ancient, "name": "ancient"}])
    plan = Plan.objects.get(pk=legacy)
    assert (plan.tier, plan.shape_version, plan.revision) == ("free", 2, None)
    assert raw.find_one({"_id": legacy}) == {"_id": legacy, "name": "legacy", "__v": 1}
    plan.save()  # a legacy document without __rev is guarded as revision 0
    assert raw.find_one({"_id": legacy}) == {
        "_id": legacy, "name": "legacy", "tier": "free", "__v": 2, "__rev": 1}
    with pytest.raises(ShapeVersionError) as newer:
        Plan.objects.get(pk=future)
    assert newer.value.context["reason"] == "newer"
    with pytest.raises(ShapeVersionError) as old:
        list(Plan.objects(pk=ancient))
    assert old.value.context["reason"] == "below-min"


def test_queryset_writes_bump_the_revision_and_upserts_are_stamped(raw: Any) -> None:
    Plan(name="a").save()
    Plan(name="b").save()
    assert Plan.objects(name__in=["a", "b"]).update(set__tier="x") == 2
    Plan.objects(name="a").update_one(set__tier="y")
    Plan.objects(name="a").modify(set__tier="z")
    Plan.objects(name="c").update_one(set__tier="new", upsert=True)
    assert list(raw.find({}, {"_id": 0}).sort("name", 1)) == [
        {"name": "a", "tier": "z", "__v": 2, "__rev": 3},
        {"name": "b", "tier": "x", "__v": 2, "__rev": 1},
        {"name": "c", "tier": "new", "__v": 2, "__rev": 1}]


def test_save_signals_still_fire_on_a_guarded_save(raw: Any) -> None:
    seen: list[tuple[str, bool | None]] = []

    def pre(sender: Any, document: Any, **kw: Any) -> None:
        seen.append(("pre_save", None))

    def post(sender: Any, document: Any, created: bool, **kw: Any) -> None:
        seen.append(("post_save", created))

    signals.pre_save.connect(pre, sender=Plan)
    signals.post_save.connect(post, sender=Plan)
    try:
        plan = Plan(name="a").save()
        Plan.objects.get(pk=plan.pk).save()
    finally:
        signals.pre_save.disconnect(pre, sender=Plan)
        signals.post_save.disconnect(post, sender=Plan)
    assert seen == [("pre_save", None), ("post_save", True), ("pre_save", None),
                    ("post_save", False)]


UNGUARDED = v.define_shapes({"notes": {"versioning": {"current": 1, "min": 1,
                                                      "revision": False}}})


class Note(versioned_document(UNGUARDED, "notes")):  # type: ignore[misc]
    text = StringField()


def test_without_revisions_documents_are_stamped_and_saved_as_mongoengine_saves(
    raw: Any, db: Any
) -> None:
    note = Note(text="a").save()
    assert not hasattr(note, "revision")
    loaded = Note.objects.get(pk=note.pk)
    loaded.text = "b"
    loaded.save()
    Note.objects(pk=note.pk).update(set__text="c")
    assert list(db.notes.find({}, {"_id": 0})) == [{"text": "c", "__v": 1}]


def test_raw_updates_bump_the_revision_unless_they_write_it(raw: Any) -> None:
    """``__raw__`` operator documents and pipelines bump ``__rev`` like keyword updates — so a
    document loaded before them is stale — and a raw operator upsert is stamped on insert."""
    Plan(name="a").save()
    Plan(name="b").save()
    loaded = Plan.objects.get(name="a")
    assert Plan.objects(name__in=["a", "b"]).update(__raw__={"$set": {"tier": "x"}}) == 2
    Plan.objects(name="a").update_one(__raw__={"$set": {"tier": "y"}, "$unset": {"gone": ""}})
    Plan.objects(name="a").update(__raw__=[{"$set": {"tier": "piped"}}])
    Plan.objects(name="a").modify(__raw__={"$set": {"tier": "z"}})
    Plan.objects(name="b").update(__raw__={"$set": {"__rev": 10}})  # written: kept
    Plan.objects(name="b").update(set__revision=20, __raw__={"$set": {"tier": "kw"}})
    Plan.objects(name="c").update_one(__raw__={"$set": {"tier": "new"}}, upsert=True)
    assert list(raw.find({}, {"_id": 0}).sort("name", 1)) == [
        {"name": "a", "tier": "z", "__v": 2, "__rev": 4},
        {"name": "b", "tier": "kw", "__v": 2, "__rev": 20},
        {"name": "c", "tier": "new", "__v": 2, "__rev": 1}]

    loaded.tier = "mine"
    assert conflict_of(loaded.save)["actual"] == 4


def test_without_revisions_raw_updates_are_left_as_written(raw: Any) -> None:
    note = Note(text="a").save()
    Note.objects(pk=note.pk).update(__raw__={"$set": {"text": "b"}})
    assert list(raw.database.notes.find({}, {"_id": 0})) == [{"text": "b", "__v": 1}]


def test_queries_see_stored_shapes_so_legacy_documents_are_loaded_and_saved_whole(
    raw: Any,
) -> None:
    """The collections guide's example: ``tier="free"`` misses a version-1 document (no
    ``tier`` until the upcaster runs, in memory); a query updates the current shape, loading
    (upcast) and saving whole updates the old one."""
    raw.insert_many([{"name": "legacy", "__v": 1},
                     {"name": "now", "tier": "free", "__v": 2, "__rev": 0}])
    assert [p.name for p in Plan.objects(tier="free")] == ["now"]
    Plan.objects(tier="free", shape_version=2).update(set__tier="pro")
    for plan in Plan.objects(shape_version=1):
        plan.tier = "pro"
        plan.save()
    stored = raw.find({}, {"_id": 0, "name": 1, "tier": 1, "__v": 1}).sort("name", 1)
    assert list(stored) == [{"name": "legacy", "tier": "pro", "__v": 2},
                            {"name": "now", "tier": "pro", "__v": 2}]
