"""The ``_id`` range planner against the server: brackets found, ranges that never mix types."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from bson import Decimal128, Int64, ObjectId

from migronaut.background.planner import plan_id_ranges, scope_filter

SPEC = {"batchSize": 10, "maxParallel": 4, "partitions": {"minPartitionDocs": 10}}


def _seed_mixed(db: Any) -> list[Any]:
    ids: list[Any] = [None, *range(40), Int64(1000), 1.5, Decimal128("2000.5"),
                      *(f"s{i:02}" for i in range(30)), *(ObjectId() for _ in range(20)),
                      True, dt.datetime(2026, 1, 1, tzinfo=dt.UTC)]
    db.items.insert_many([{"_id": i, "v": 0} for i in ids])
    return ids


def _covered(db: Any, plan: Any, match: dict[str, Any]) -> list[int]:
    return [db.items.count_documents({"$and": [match, scope_filter(p["scope"])]})
            for p in plan.partitions]


def test_every_bracket_present_is_planned_and_ranges_cover_each_document_once(db: Any) -> None:
    ids = _seed_mixed(db)
    plan = plan_id_ranges(db.items, {}, SPEC)
    brackets = [p["scope"]["bracket"] for p in plan.partitions]
    assert set(brackets) == {"null", "number", "string", "objectId", "bool", "date"}
    assert sum(_covered(db, plan, {})) == len(ids)  # no gap, no overlap
    assert plan.estimate == len(ids)


@pytest.mark.parametrize(
    ("match", "expected"),
    [
        ({"_id": {"$type": "string"}}, {"string"}),
        ({"_id": {"$in": [3, "s01"]}}, {"number", "string"}),
        ({"_id": {"$in": [None, True]}}, {"null", "bool"}),
    ],
)
def test_only_brackets_holding_matching_documents_are_planned(
    db: Any, match: dict[str, Any], expected: set[str]
) -> None:
    _seed_mixed(db)
    plan = plan_id_ranges(db.items, match, SPEC)
    assert {p["scope"]["bracket"] for p in plan.partitions} == expected
    assert sum(_covered(db, plan, match)) == db.items.count_documents(match)


def test_one_id_type_costs_two_probes_not_one_per_bracket(db: Any, mongo_uri: str) -> None:
    from pymongo import MongoClient, monitoring

    db.items.insert_many([{"_id": ObjectId(), "v": 0} for _ in range(50)])
    finds: list[str] = []

    class Finds(monitoring.CommandListener):
        def started(self, event: Any) -> None:
            if event.command_name == "find":
                finds.append(event.command_name)

        def succeeded(self, event: Any) -> None:
            pass

        def failed(self, event: Any) -> None:
            pass

    client: MongoClient[dict[str, Any]] = MongoClient(mongo_uri, event_listeners=[Finds()])
    try:
        plan = plan_id_ranges(client[db.name].items, {}, SPEC)
    finally:
        client.close()
    assert [p["scope"]["bracket"] for p in plan.partitions] == ["objectId"] * len(plan.partitions)
    assert len(finds) == 2
