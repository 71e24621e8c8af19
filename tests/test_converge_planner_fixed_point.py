"""The planner's fixed point over the wire: create each declared index exactly as the plan says
(``DeclaredIndex.spec()`` through ``createIndexes``), list it back, plan again → nothing to do
(reference collections.md §2.6.3). Runs on the dev server, or on ``MIGRONAUT_TEST_URI``."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.database import Database

from migronaut.declared.definition import validate_definition
from migronaut.declared.issues import Issues
from migronaut.declared.live import ServerCapabilities, live_collection
from migronaut.declared.plan import ConvergeResult, CreateCollection, CreateIndexes
from migronaut.declared.planner import PlanOptions, plan_collection

Db = Database[dict[str, Any]]
OPTIONS = PlanOptions(capabilities=ServerCapabilities((7, 0, 0)))

DECLARATIONS: list[dict[str, Any]] = [
    {"key": {"a": 1}},
    {"key": {"a": 1}, "unique": True, "sparse": True},
    {"key": {"a": -1}, "unique": False},
    {"key": {"at": 1}, "expireAfterSeconds": 3600, "hidden": True},
    {"key": {"p": 1}, "partialFilterExpression": {"p": {"$gt": 5}}},
    {"key": {"c": 1}, "collation": {"locale": "en", "strength": 2}},
    {"key": {"c": 1}, "collation": {"locale": "simple"}},
    {"key": {"title": "text", "body": "text"}, "weights": {"title": 10}},
    {"key": {"shop": 1, "t": "text"}, "default_language": "french", "language_override": "lang"},
    {"key": {"loc": "2d"}, "bits": 20, "min": -100, "max": 100},
    {"key": {"loc": "2d"}},
    {"key": {"geo": "2dsphere"}},
    {"key": {"h": "hashed"}},
    {"key": {"$**": 1}, "wildcardProjection": {"a": 1}},
    {"key": {"meta.$**": 1}},
    {"key": {"a": 1, "b": -1}, "name": "ab"},
]


def read(db: Db, name: str) -> Any:
    found = list(db.list_collections(filter={"name": name}))
    info = found[0] if found else None
    return live_collection(name, info, list(db[name].list_indexes()) if info else [])


def apply_creates(db: Db, steps: Any) -> None:
    """The two steps a plan from nothing holds, sent the way the executor will send them."""
    for step in steps:
        if isinstance(step, CreateCollection):
            db.create_collection(step.rows[0][1], **dict(step.options))
        else:
            assert isinstance(step, CreateIndexes)
            db.command("createIndexes", "c", indexes=[dict(spec) for spec in step.specs])


@pytest.mark.parametrize("declared", DECLARATIONS)
def test_each_declared_index_reaches_a_fixed_point(db: Db, declared: dict[str, Any]) -> None:
    issues = Issues()
    definition = validate_definition({"name": "c", "indexes": [declared]}, issues)
    assert definition is not None, issues.found
    first = plan_collection(definition, read(db, "c"), OPTIONS)
    assert [row.action for row in first.actions] == ["create", "create"]
    apply_creates(db, first.steps)
    again = plan_collection(definition, read(db, "c"), OPTIONS)
    assert [(row.target, row.action) for row in again.actions] == [("index", "unchanged")]
    assert ConvergeResult.planned([again]).in_sync


def test_validator_and_versioning_reach_a_fixed_point(db: Db) -> None:
    issues = Issues()
    definition = validate_definition({
        "name": "c", "validator": {"$jsonSchema": {"required": ["seats"],
                                                   "properties": {"seats": {"minimum": 1}}}},
        "validation_action": "warn", "versioning": {"current": 2},
        "indexes": [{"key": {"seats": 1}}]}, issues)
    assert definition is not None, issues.found
    first = plan_collection(definition, read(db, "c"), OPTIONS)
    apply_creates(db, first.steps)
    again = plan_collection(definition, read(db, "c"), OPTIONS)
    assert {row.action for row in again.actions} == {"unchanged"}
    assert [row.name for row in again.actions if row.target == "index"] == [
        "seats_1", "__v_1__id_1"]


def test_collection_default_collation_reaches_a_fixed_point(db: Db) -> None:
    db.create_collection("c", collation={"locale": "fr"})
    issues = Issues()
    definition = validate_definition({"name": "c", "indexes": [
        {"key": {"a": 1}}, {"key": {"b": 1}, "collation": {"locale": "simple"}},
        {"key": {"d": 1}, "collation": {"locale": "en"}}]}, issues)
    assert definition is not None, issues.found
    first = plan_collection(definition, read(db, "c"), OPTIONS)
    apply_creates(db, first.steps)
    again = plan_collection(definition, read(db, "c"), OPTIONS)
    assert {row.action for row in again.actions} == {"unchanged"}
