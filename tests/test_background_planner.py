"""The ``_id`` range planner against the server: brackets found, ranges that never mix types."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from bson import Decimal128, Int64, ObjectId

from migronaut.background.planning.id_ranges import plan_id_ranges, scope_filter

SPEC = {"batchSize": 10, "maxParallel": 4, "partitions": {"minPartitionDocs": 10}}
#: a count capped at 2 × 4 × 2 = 16 documents: the brackets of a larger match are probed
CAPPED = {"batchSize": 10, "maxParallel": 2, "partitions": {"minPartitionDocs": 4}}


def _seed_mixed(db: Any) -> list[Any]:
    ids: list[Any] = [None, *range(40), Int64(1000), 1.5, Decimal128("2000.5"),
                      *(f"s{i:02}" for i in range(30)), *(ObjectId() for _ in range(20)),
                      True, dt.datetime(2026, 1, 1, tzinfo=dt.UTC)]
    db.items.insert_many([{"_id": i, "v": 0} for i in ids])
    return ids


def _covered(db: Any, plan: Any, match: dict[str, Any]) -> list[int]:
    return [db.items.count_documents({"$and": [match, scope_filter(p["scope"])]})
            for p in plan.partitions]


@pytest.mark.parametrize("spec", [SPEC, CAPPED], ids=["counted", "probed"])
def test_every_bracket_present_is_planned_and_ranges_cover_each_document_once(
    db: Any, spec: dict[str, Any]
) -> None:
    ids = _seed_mixed(db)
    plan = plan_id_ranges(db.items, {}, spec)
    brackets = [p["scope"]["bracket"] for p in plan.partitions]
    assert set(brackets) == {"null", "number", "string", "objectId", "bool", "date"}
    covered = _covered(db, plan, {})
    scopes = [p["scope"] for p in plan.partitions]
    assert sum(covered) == len(ids), list(zip(covered, scopes, strict=True))
    if spec is SPEC:
        assert plan.estimate == len(ids)
    else:  # a match larger than the capped count: at least the estimate
        assert plan.at_least


@pytest.mark.parametrize(
    ("match", "expected"),
    [
        ({"_id": {"$type": "string"}}, {"string"}),
        ({"_id": {"$in": [3, "s01"]}}, {"number", "string"}),
        ({"_id": {"$in": [None, True]}}, {"null", "bool"}),
    ],
)
@pytest.mark.parametrize("spec", [SPEC, CAPPED], ids=["counted", "probed"])
def test_only_brackets_holding_matching_documents_are_planned(
    db: Any, match: dict[str, Any], expected: set[str], spec: dict[str, Any]
) -> None:
    _seed_mixed(db)
    plan = plan_id_ranges(db.items, match, spec)
    assert {p["scope"]["bracket"] for p in plan.partitions} == expected
    assert sum(_covered(db, plan, match)) == db.items.count_documents(match)


def _plan_counting(mongo_uri: str, db: Any, spec: dict[str, Any]) -> tuple[Any, list[str]]:
    """Plan ``db.items`` through a client that names every command it sends."""
    from pymongo import MongoClient, monitoring

    names: list[str] = []

    class Commands(monitoring.CommandListener):
        def started(self, event: Any) -> None:
            names.append(event.command_name)

        def succeeded(self, event: Any) -> None:
            pass

        def failed(self, event: Any) -> None:
            pass

    client: MongoClient[dict[str, Any]] = MongoClient(mongo_uri, event_listeners=[Commands()])
    try:
        client.admin.command("ping")
        names.clear()
        plan = plan_id_ranges(client[db.name].items, {}, spec)
    finally:
        client.close()
    return plan, names


def test_one_id_type_costs_two_probes_not_one_per_bracket(db: Any, mongo_uri: str) -> None:
    db.items.insert_many([{"_id": ObjectId(), "v": 0} for _ in range(50)])
    plan, commands = _plan_counting(mongo_uri, db, CAPPED)  # 50 matching, counted up to 16
    assert [p["scope"]["bracket"] for p in plan.partitions] == ["objectId"] * len(plan.partitions)
    assert commands.count("find") == 2


def test_a_match_within_the_count_is_planned_without_probes(db: Any, mongo_uri: str) -> None:
    """The count sees every matching document: its brackets come with it, no probe."""
    db.items.insert_many([{"_id": ObjectId(), "v": 0} for _ in range(50)])
    plan, commands = _plan_counting(mongo_uri, db, SPEC)  # 50 matching, counted up to 160
    assert [p["scope"]["bracket"] for p in plan.partitions] == ["objectId"] * len(plan.partitions)
    assert "find" not in commands and commands.count("aggregate") == 2  # the count, the sample


def test_sampled_ids_are_put_in_mongods_order_whatever_order_the_server_sent() -> None:
    """The split points come from the sample in BSON order, even when a server's sort of mixed
    types is wrong (the dev server puts Int64 and Decimal128 after the other types)."""
    from bson import Binary

    from migronaut.background.planning.id_ranges import in_bson_order

    numbers = [Decimal128("2000.5"), Int64(1000), 7, float("nan"), 1.5, -3, Decimal128("-1E+3")]
    assert [str(v) for v in in_bson_order("number", numbers)] == [
        "nan", "-1E+3", "-3", "1.5", "7", "1000", "2000.5"]
    assert in_bson_order("string", ["s10", "Z", "é", "z", "s02"]) == ["Z", "s02", "s10", "z", "é"]
    blobs = [Binary(b"zz", 0), b"b", Binary(b"a", 5), b"a"]
    assert in_bson_order("binData", blobs) == [b"a", b"b", Binary(b"a", 5), Binary(b"zz", 0)]
    early, late = ObjectId("000000000000000000000001"), ObjectId("ffffffffffffffffffffffff")
    assert in_bson_order("objectId", [late, early]) == [early, late]
    mixed = [dt.datetime(2026, 1, 1), dt.datetime(2026, 1, 1, tzinfo=dt.UTC)]
    assert in_bson_order("date", mixed) == mixed  # keys that cannot compare: the server's order
    assert in_bson_order("bool", [True, False]) == [True, False]  # not split: left alone


def test_a_sample_first_estimate_scales_by_the_documents_drawn_not_the_sample_aimed_at(
    db: Any,
) -> None:
    """2,000 matching documents counted up to 1,200: the draw is capped under 5 % of the
    collection (98 documents), every one of them matches, so the whole collection matches."""
    db.items.insert_many([{"_id": i, "v": 0} for i in range(2000)])
    spec = {"batchSize": 10, "maxParallel": 3, "partitions": {"minPartitionDocs": 100}}
    plan = plan_id_ranges(db.items, {}, spec)
    assert plan.method == "sample-first" and plan.at_least
    assert plan.estimate == 2000
    assert abs(sum(p["estimate"] for p in plan.partitions) - 2000) <= len(plan.partitions)


def test_a_sample_first_draw_that_times_out_is_drawn_again_at_the_sample_size(
    failpoint_uri: str, failpoint_client: Any,
) -> None:
    """A broad match counted only up to its cap (80 of 2,000 documents) draws 98 documents for
    a sample of 10; when a slow server lets that draw time out, the planner draws the sample's
    10 and still cuts ranges for every lane, instead of one partition for the whole bracket."""
    import uuid

    from pymongo import MongoClient, monitoring

    from helpers.failpoints import fail_command

    samples: list[int] = []

    class TimeOutTheFirstSample(monitoring.CommandListener):
        def started(self, event: Any) -> None:
            stages = event.command.get("pipeline") or []
            if event.command_name == "aggregate" and stages and "$sample" in stages[0]:
                samples.append(int(stages[0]["$sample"]["size"]))
                if len(samples) == 1:  # armed just before the first draw reaches the server
                    failpoint.__enter__()

        def succeeded(self, event: Any) -> None:
            pass

        def failed(self, event: Any) -> None:
            pass

    failpoint = fail_command(failpoint_client, ["aggregate"], times=1, error_code=50)
    name = f"t_{uuid.uuid4().hex[:12]}"
    spec = {"batchSize": 10, "maxParallel": 2,
            "partitions": {"minPartitionDocs": 10, "sampleSize": 10}}
    try:
        failpoint_client[name].items.insert_many([{"_id": i, "v": 0} for i in range(2000)])
        with MongoClient(failpoint_uri, event_listeners=[TimeOutTheFirstSample()]) as client:
            plan = plan_id_ranges(client[name].items, {}, spec)
    finally:
        failpoint.__exit__(None, None, None)
        failpoint_client.drop_database(name)
    assert samples == [98, 10]
    assert plan.method == "sample-first" and plan.degraded is None
    assert len(plan.partitions) > 1
