"""The converge planner, pure: definition + live listings → rows and steps (reference
collections.md §2.4, §2.6, §1.5, §3.3, §7.5). The live side is written as ``mongod`` 7.0 (and the
dev server) lists it — the shapes of tests/test_devserver_collmod.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from bson import Int64

from migronaut.declared.definition import CollectionDefinition, validate_definition
from migronaut.declared.index_compare import collation_matches, compare_index
from migronaut.declared.issues import Issues
from migronaut.declared.live import (
    LiveCollection,
    ServerCapabilities,
    VersionFloor,
    live_collection,
    live_index,
)
from migronaut.declared.plan import (
    CollectionPlan,
    CollModIndex,
    CollModValidator,
    ConvergeResult,
    ConvertUnique,
    CreateCollection,
    CreateIndexes,
    CreateSearchIndexes,
    DropIndex,
    DropSearchIndex,
    Rebuild,
    UpdateSearchIndex,
)
from migronaut.declared.planner import PlanOptions, floor_to_probe, plan_collection
from migronaut.declared.search_plan import SearchAvailability

V7 = ServerCapabilities((7, 0, 2))
EN_STRENGTH_2 = {
    "locale": "en", "caseLevel": False, "caseFirst": "off", "strength": 2,
    "numericOrdering": False, "alternate": "non-ignorable", "maxVariable": "punct",
    "normalization": False, "backwards": False, "version": "57.1",
}
EN = dict(EN_STRENGTH_2, strength=3)
FR = dict(EN_STRENGTH_2, locale="fr", strength=3)
ID = {"v": 2, "key": {"_id": 1}, "name": "_id_"}


def define(**raw: Any) -> CollectionDefinition:
    raw.setdefault("name", "c")
    issues = Issues()
    definition = validate_definition(raw, issues)
    assert definition is not None, issues.found
    return definition


def live(*indexes: dict[str, Any], options: dict[str, Any] | None = None,
         type_: str = "collection", **facts: Any) -> LiveCollection:
    info = {"name": "c", "type": type_, "options": options or {}}
    listed = [ID, *({"v": 2, **index} for index in indexes)]
    return live_collection("c", info, listed, **facts)


MISSING = live_collection("c", None)


def plan(definition: CollectionDefinition, state: LiveCollection, **options: Any
         ) -> CollectionPlan:
    options.setdefault("capabilities", V7)
    return plan_collection(definition, state, PlanOptions(**options))


def rows(result: CollectionPlan) -> list[tuple[str, str, str]]:
    return [(row.target, row.name, row.action) for row in result.actions]


# (declaration, what mongod 7.0 lists after creating it) for every index kind.
KINDS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"key": {"a": 1}}, {"key": {"a": 1}, "name": "a_1"}),
    ({"key": {"a": 1}, "unique": True, "sparse": True},
     {"key": {"a": 1}, "name": "a_1", "unique": True, "sparse": True}),
    ({"key": {"a": -1}, "unique": False}, {"key": {"a": -1}, "name": "a_-1", "unique": False}),
    ({"key": {"at": 1}, "expireAfterSeconds": 3600, "hidden": True},
     {"key": {"at": 1}, "name": "at_1", "expireAfterSeconds": 3600, "hidden": True}),
    ({"key": {"p": 1}, "partialFilterExpression": {"p": {"$gt": 5}}},
     {"key": {"p": 1}, "name": "p_1", "partialFilterExpression": {"p": {"$gt": 5}}}),
    ({"key": {"c": 1}, "collation": {"locale": "en", "strength": 2}},
     {"key": {"c": 1}, "name": "c_1", "collation": EN_STRENGTH_2}),
    ({"key": {"c": 1}, "collation": {"locale": "simple"}}, {"key": {"c": 1}, "name": "c_1"}),
    ({"key": {"title": "text", "body": "text"}, "weights": {"title": 10}},
     {"key": {"_fts": "text", "_ftsx": 1}, "name": "title_text_body_text",
      "weights": {"body": 1, "title": 10}, "default_language": "english",
      "language_override": "language", "textIndexVersion": 3}),
    ({"key": {"shop": 1, "t": "text"}, "default_language": "french", "language_override": "lang"},
     {"key": {"shop": 1, "_fts": "text", "_ftsx": 1}, "name": "shop_1_t_text",
      "weights": {"t": 1}, "default_language": "french", "language_override": "lang",
      "textIndexVersion": 3}),
    ({"key": {"loc": "2d"}, "bits": 20, "min": -100, "max": 100},
     {"key": {"loc": "2d"}, "name": "loc_2d", "bits": 20, "min": -100, "max": 100}),
    ({"key": {"loc": "2d"}}, {"key": {"loc": "2d"}, "name": "loc_2d", "bits": 26,
                               "min": -180.0, "max": 180.0}),
    ({"key": {"geo": "2dsphere"}},
     {"key": {"geo": "2dsphere"}, "name": "geo_2dsphere", "2dsphereIndexVersion": 3}),
    ({"key": {"h": "hashed"}}, {"key": {"h": "hashed"}, "name": "h_hashed"}),
    ({"key": {"$**": 1}, "wildcardProjection": {"a": 1}},
     {"key": {"$**": 1}, "name": "$**_1", "wildcardProjection": {"a": 1}}),
    ({"key": {"meta.$**": 1}}, {"key": {"meta.$**": 1}, "name": "meta.$**_1"}),
    ({"key": {"a": 1, "b": -1}, "name": "ab"}, {"key": {"a": 1.0, "b": Int64(-1)}, "name": "ab"}),
]


@pytest.mark.parametrize(("declared", "listed"), KINDS)
def test_every_index_kind_is_created_from_nothing(declared: dict[str, Any],
                                                  listed: dict[str, Any]) -> None:
    result = plan(define(indexes=[declared]), MISSING)
    assert rows(result) == [("collection", "c", "create"), ("index", listed["name"], "create")]
    create, batch = result.steps
    assert create == CreateCollection(rows=(("collection", "c"),))
    assert isinstance(batch, CreateIndexes)
    assert batch.rows == (("index", listed["name"]),)
    (spec,) = batch.specs
    assert spec["name"] == listed["name"] and "background" not in spec
    assert result.row("index", listed["name"]).to == spec


@pytest.mark.parametrize(("declared", "listed"), KINDS)
def test_every_index_kind_is_in_sync_with_its_listing(declared: dict[str, Any],
                                                      listed: dict[str, Any]) -> None:
    result = plan(define(indexes=[declared]), live(listed))
    assert rows(result) == [("index", listed["name"], "unchanged")]
    assert result.steps == ()
    assert ConvergeResult.planned([result]).in_sync


def test_in_sync_on_a_server_of_unknown_version() -> None:
    result = plan(define(indexes=[KINDS[1][0]]), live(KINDS[1][1]),
                  capabilities=ServerCapabilities())
    assert rows(result) == [("index", "a_1", "unchanged")]


# ---------------------------------------------------------------------------- collection


@pytest.mark.parametrize("kind", ["view", "timeseries"])
def test_a_view_or_time_series_is_one_conflict(kind: str) -> None:
    result = plan(define(indexes=[{"key": {"a": 1}}], validator={"a": {"$exists": True}}),
                  live(type_=kind))
    assert rows(result) == [("collection", "c", "conflict")]
    assert result.actions[0].reason == f"is a {kind}, not a regular collection"
    assert result.steps == ()


def test_missing_collection_with_nothing_to_hold_is_not_created() -> None:
    assert plan(define(indexes=[], validator=None), MISSING).actions == ()


def test_missing_collection_is_created_with_the_validator_options_only() -> None:
    validator = {"$jsonSchema": {"required": ["email"]}}
    result = plan(define(validator=validator, validation_action="warn",
                         indexes=[{"key": {"email": 1}, "unique": True}]), MISSING)
    assert rows(result) == [("collection", "c", "create"), ("validator", "c", "create"),
                            ("index", "email_1", "create")]
    wanted = {"validator": validator, "validationLevel": "strict", "validationAction": "warn"}
    assert result.row("validator", "c").to == wanted
    assert result.steps[0] == CreateCollection(
        rows=(("collection", "c"), ("validator", "c")), options=wanted)
    assert isinstance(result.steps[1], CreateIndexes)
    assert len(result.steps) == 2


def test_clustered_index_and_id_are_never_listed() -> None:
    clustered = {"key": {"_id": 1}, "name": "_id_clustered", "unique": True, "clustered": True}
    state = live(clustered)
    assert state.indexes == ()
    result = plan(define(indexes=[]), state, prune=True)
    assert result.actions == () and result.steps == ()


def test_the_collection_default_collation_is_respected() -> None:
    french = {"collation": FR}  # listCollections lists it expanded
    result = plan(define(indexes=[{"key": {"a": 1}}, {"key": {"b": 1},
                                                       "collation": {"locale": "simple"}}]),
                  live({"key": {"a": 1}, "name": "a_1", "collation": FR},
                       {"key": {"b": 1}, "name": "b_1"}, options=french))
    assert rows(result) == [("index", "a_1", "unchanged"), ("index", "b_1", "unchanged")]
    # Without the default, an index listed with the French collation differs.
    result = plan(define(indexes=[{"key": {"a": 1}}]),
                  live({"key": {"a": 1}, "name": "a_1", "collation": FR}))
    assert rows(result) == [("index", "a_1", "recreate")]
    assert result.actions[0].reason == "collation"


def test_collation_rules() -> None:
    assert collation_matches({"locale": "en"}, EN, None)
    assert not collation_matches({"locale": "en"}, EN_STRENGTH_2, None)
    assert collation_matches({"locale": "en", "strength": 2}, EN_STRENGTH_2, None)
    assert collation_matches({"locale": "en"}, {"locale": "en"}, None)  # universal defaults
    assert not collation_matches({"locale": "en", "caseFirst": "upper"}, EN, None)
    assert not collation_matches({"locale": "simple"}, EN, None)
    assert collation_matches({"locale": "simple"}, None, FR)
    assert not collation_matches(None, EN, None)
    assert collation_matches(None, FR, FR) and not collation_matches(None, None, FR)


# ------------------------------------------------------------------------------ validator


def test_validator_cases() -> None:
    rule = {"a": {"$exists": True}}
    listed = {"validator": rule}
    assert rows(plan(define(validator=rule), live(options=listed))) == [
        ("validator", "c", "unchanged")]
    assert rows(plan(define(validator=None), live())) == [("validator", "c", "unchanged")]
    assert rows(plan(define(validator={}), live(options={"validationLevel": "strict"}))) == [
        ("validator", "c", "unchanged")]

    dropped = plan(define(validator=None), live(options=listed))
    assert rows(dropped) == [("validator", "c", "drop")]
    assert dropped.actions[0].from_ == {"validator": rule, "validationLevel": "strict",
                                        "validationAction": "error"}
    assert dropped.steps == (CollModValidator(rows=(("validator", "c"),),
                                              fields={"validator": {}}),)

    created = plan(define(validator=rule), live())
    assert rows(created) == [("validator", "c", "create")]
    triple = {"validator": rule, "validationLevel": "strict", "validationAction": "error"}
    assert created.steps == (CollModValidator(rows=(("validator", "c"),), fields=triple),)

    modified = plan(define(validator={"b": {"$exists": True}}, validation_level="moderate"),
                    live(options=listed))
    assert rows(modified) == [("validator", "c", "modify")]
    assert modified.actions[0].reason == "validator, validationLevel"
    assert isinstance(modified.steps[0], CollModValidator)
    assert modified.steps[0].fields["validationLevel"] == "moderate"


def test_validator_compared_canonically_and_with_level_defaults() -> None:
    declared = define(validator={"$jsonSchema": {"properties": {"n": {"minimum": 1}},
                                                 "required": ["n"]}}, validation_level="strict")
    listed = {"validator": {"$jsonSchema": {"required": ["n"],
                                            "properties": {"n": {"minimum": 1.0}}}},
              "validationLevel": "strict", "validationAction": "error"}
    assert rows(plan(declared, live(options=listed))) == [("validator", "c", "unchanged")]
    swapped = define(validator={"$jsonSchema": {"required": ["n", "m"]}})
    listed = {"validator": {"$jsonSchema": {"required": ["m", "n"]}}}
    assert rows(plan(swapped, live(options=listed))) == [("validator", "c", "modify")]


def test_unmanaged_validator_has_no_row() -> None:
    assert rows(plan(define(indexes=[]), live(options={"validator": {"a": 1}}))) == []


# ------------------------------------------------------------------------------- changes


def test_in_place_hidden_and_ttl() -> None:
    result = plan(define(indexes=[{"key": {"at": 1}, "hidden": True,
                                   "expireAfterSeconds": 30}]),
                  live({"key": {"at": 1}, "name": "at_1", "expireAfterSeconds": 60}))
    assert rows(result) == [("index", "at_1", "modify")]
    row = result.actions[0]
    assert row.reason == "hidden, expireAfterSeconds"
    assert row.from_ == {"key": {"at": 1}, "name": "at_1", "expireAfterSeconds": 60}
    assert row.to == {"key": {"at": 1}, "name": "at_1", "hidden": True,
                      "expireAfterSeconds": 30}
    assert result.steps == (CollModIndex(rows=(("index", "at_1"),), name="at_1",
                                         changes={"hidden": True, "expireAfterSeconds": 30}),)


def test_unhide_in_place() -> None:
    result = plan(define(indexes=[{"key": {"a": 1}}]),
                  live({"key": {"a": 1}, "name": "a_1", "hidden": True}))
    assert result.steps == (CollModIndex(rows=(("index", "a_1"),), name="a_1",
                                         changes={"hidden": False}),)


@pytest.mark.parametrize(("version", "action"), [((5, 1, 0), "modify"), ((5, 0, 9), "recreate"),
                                                 (None, "recreate")])
def test_adding_a_ttl_needs_5_1(version: tuple[int, int, int] | None, action: str) -> None:
    result = plan(define(indexes=[{"key": {"at": 1}, "expireAfterSeconds": 10}]),
                  live({"key": {"at": 1}, "name": "at_1"}),
                  capabilities=ServerCapabilities(version))
    assert rows(result) == [("index", "at_1", action)]


def test_adding_a_ttl_to_a_compound_index_rebuilds() -> None:
    result = plan(define(indexes=[{"key": {"a": 1, "b": 1}, "expireAfterSeconds": 10}]),
                  live({"key": {"a": 1, "b": 1}, "name": "a_1_b_1"}))
    assert rows(result) == [("index", "a_1_b_1", "recreate")]


def test_removing_a_ttl_rebuilds() -> None:
    result = plan(define(indexes=[{"key": {"at": 1}}]),
                  live({"key": {"at": 1}, "name": "at_1", "expireAfterSeconds": 60}))
    assert rows(result) == [("index", "at_1", "recreate")]
    assert result.actions[0].reason == "expireAfterSeconds"
    (step,) = result.steps
    assert isinstance(step, Rebuild) and not step.group
    assert step.dropped_names == ("at_1",)
    assert step.drops[0] == {"key": {"at": 1}, "name": "at_1", "expireAfterSeconds": 60}
    assert step.creates == ({"key": {"at": 1}, "name": "at_1"},)


def test_becoming_unique_in_place_on_7_0_with_other_changes_after() -> None:
    result = plan(define(indexes=[{"key": {"e": 1}, "unique": True, "hidden": True}]),
                  live({"key": {"e": 1}, "name": "e_1"}))
    assert rows(result) == [("index", "e_1", "modify")]
    assert result.actions[0].reason == "unique, hidden"
    assert result.steps == (ConvertUnique(rows=(("index", "e_1"),), name="e_1",
                                          changes={"hidden": True}),)


@pytest.mark.parametrize("version", [(6, 0, 5), None])
def test_becoming_unique_before_7_0_rebuilds(version: tuple[int, int, int] | None) -> None:
    result = plan(define(indexes=[{"key": {"e": 1}, "unique": True}]),
                  live({"key": {"e": 1}, "name": "e_1"}),
                  capabilities=ServerCapabilities(version))
    assert rows(result) == [("index", "e_1", "recreate")]  # non-unique dropped: no guard


def test_unique_to_non_unique_rebuild_is_allowed() -> None:
    result = plan(define(indexes=[{"key": {"e": 1}}]),
                  live({"key": {"e": 1}, "name": "e_1", "unique": True}))
    assert rows(result) == [("index", "e_1", "recreate")]
    assert result.actions[0].reason == "unique"


def test_one_rebuild_diff_makes_every_change_a_rebuild() -> None:
    result = plan(define(indexes=[{"key": {"a": 1}, "sparse": True, "hidden": True}]),
                  live({"key": {"a": 1}, "name": "a_1"}))
    assert rows(result) == [("index", "a_1", "recreate")]
    assert result.actions[0].reason == "sparse, hidden"


@pytest.mark.parametrize(("declared", "listed", "reason"), [
    ({"key": {"a": 1}, "name": "x"}, {"key": {"a": -1}, "name": "x"}, "key"),
    ({"key": {"a": 1, "b": 1}, "name": "x"}, {"key": {"b": 1, "a": 1}, "name": "x"}, "key"),
    ({"key": {"a": 1}, "name": "x"}, {"key": {"a": "hashed"}, "name": "x"}, "key"),
    ({"key": {"a": 1}, "partialFilterExpression": {"a": {"$gt": 1}}},
     {"key": {"a": 1}, "name": "a_1", "partialFilterExpression": {"a": {"$gt": 2}}},
     "partialFilterExpression"),
    ({"key": {"$**": 1}, "wildcardProjection": {"a": 1}},
     {"key": {"$**": 1}, "name": "$**_1", "wildcardProjection": {"b": 1}}, "wildcardProjection"),
    ({"key": {"t": "text"}, "weights": {"t": 5}},
     {"key": {"_fts": "text", "_ftsx": 1}, "name": "t_text", "weights": {"t": 1},
      "default_language": "english", "language_override": "language", "textIndexVersion": 3},
     "weights"),
    ({"key": {"t": "text"}, "default_language": "french"},
     {"key": {"_fts": "text", "_ftsx": 1}, "name": "t_text", "weights": {"t": 1},
      "default_language": "english", "language_override": "language", "textIndexVersion": 3},
     "default_language"),
    ({"key": {"t": "text"}},
     {"key": {"_fts": "text", "_ftsx": 1}, "name": "t_text", "weights": {"t": 1},
      "default_language": "english", "language_override": "idioma", "textIndexVersion": 3},
     "language_override"),
    ({"key": {"t": "text"}, "textIndexVersion": 2},
     {"key": {"_fts": "text", "_ftsx": 1}, "name": "t_text", "weights": {"t": 1},
      "default_language": "english", "language_override": "language", "textIndexVersion": 3},
     "textIndexVersion"),
    ({"key": {"loc": "2d"}, "bits": 20},
     {"key": {"loc": "2d"}, "name": "loc_2d", "bits": 26, "min": -180.0, "max": 180.0}, "bits"),
    ({"key": {"c": 1}, "collation": {"locale": "en"}},
     {"key": {"c": 1}, "name": "c_1", "collation": EN_STRENGTH_2}, "collation"),
])
def test_rebuild_diffs(declared: dict[str, Any], listed: dict[str, Any], reason: str) -> None:
    result = plan(define(indexes=[declared]), live(listed))
    assert rows(result) == [("index", listed["name"], "recreate")]
    assert result.actions[0].reason == reason
    assert isinstance(result.steps[0], Rebuild)


def test_live_boolean_options_stored_as_one_count_as_true() -> None:
    index = live_index({"v": 2, "key": {"a": 1}, "name": "a_1", "unique": 1, "sparse": 0,
                        "background": True, "ns": "db.c"})
    assert index is not None
    assert dict(index.options) == {"unique": True}
    assert index.value() == {"key": {"a": 1}, "name": "a_1", "unique": 1, "sparse": 0}
    comparison = compare_index(define(indexes=[{"key": {"a": 1}, "unique": True}]).indexes[0],  # type: ignore[index]
                               index, None, V7)
    assert comparison.diffs == ()


# ------------------------------------------------------------------------ unique guard


def test_unique_to_unique_rebuild_is_a_conflict_without_rebuild_unique() -> None:
    declared = define(indexes=[{"key": {"e": 1}, "unique": True, "sparse": True}])
    state = live({"key": {"e": 1}, "name": "e_1", "unique": True})
    refused = plan(declared, state)
    assert rows(refused) == [("index", "e_1", "conflict")]
    assert refused.actions[0].reason.startswith("sparse; rebuilding drops a unique index")  # type: ignore[union-attr]
    assert "--rebuild-unique" in refused.actions[0].reason  # type: ignore[operator]
    assert refused.steps == ()
    assert not ConvergeResult.planned([refused]).in_sync
    allowed = plan(declared, state, rebuild_unique=True)
    assert rows(allowed) == [("index", "e_1", "recreate")]


# ------------------------------------------------------------------- names and blockers


def test_identical_index_under_another_name_is_accepted() -> None:
    result = plan(define(indexes=[{"key": {"a": 1}, "name": "by_a"}]),
                  live({"key": {"a": 1}, "name": "a_1"}))
    assert rows(result) == [("index", "by_a", "unchanged")]
    row = result.actions[0]
    assert (row.reason, row.live_name) == ('exists as "a_1"', "a_1")
    assert result.steps == ()


def test_identical_index_under_another_name_with_prune_is_a_rename() -> None:
    result = plan(define(indexes=[{"key": {"a": 1}, "name": "by_a"}], prune=True),
                  live({"key": {"a": 1}, "name": "a_1"}))
    assert rows(result) == [("index", "by_a", "recreate")]
    row = result.actions[0]
    assert (row.reason, row.live_name) == ("name", "a_1")
    assert row.from_ == {"key": {"a": 1}, "name": "a_1"}
    (step,) = result.steps
    assert isinstance(step, Rebuild)
    assert step.dropped_names == ("a_1",)
    assert step.creates == ({"key": {"a": 1}, "name": "by_a"},)


def test_same_key_different_spec_under_another_name_is_a_conflict() -> None:
    result = plan(define(indexes=[{"key": {"a": 1}, "name": "by_a", "sparse": True}]),
                  live({"key": {"a": 1}, "name": "a_1"}))
    assert rows(result) == [("index", "by_a", "conflict")]
    assert result.actions[0].live_name == "a_1"
    assert "covers the same key" in str(result.actions[0].reason)
    assert "prune" in str(result.actions[0].reason)
    replaced = plan(define(indexes=[{"key": {"a": 1}, "name": "by_a", "sparse": True}]),
                    live({"key": {"a": 1}, "name": "a_1"}), prune=True)
    assert rows(replaced) == [("index", "by_a", "recreate")]
    assert replaced.actions[0].reason == 'replaces "a_1"'


def test_a_second_text_index_blocks() -> None:
    text = {"key": {"_fts": "text", "_ftsx": 1}, "name": "old", "weights": {"x": 1},
            "default_language": "english", "language_override": "language",
            "textIndexVersion": 3}
    result = plan(define(indexes=[{"key": {"y": "text"}}]), live(text))
    assert rows(result) == [("index", "y_text", "conflict")]
    result = plan(define(indexes=[{"key": {"y": "text"}}]), live(text), prune=True)
    assert rows(result) == [("index", "y_text", "recreate")]
    assert result.actions[0].reason == 'replaces "old"'


def test_same_name_change_that_also_replaces_a_blocker() -> None:
    result = plan(define(indexes=[{"key": {"a": 1}, "name": "x"}], prune=True),
                  live({"key": {"b": 1}, "name": "x"}, {"key": {"a": 1}, "name": "a_1"}))
    assert rows(result) == [("index", "x", "recreate")]
    assert result.actions[0].reason == 'key; replaces "a_1"'
    (step,) = result.steps
    assert isinstance(step, Rebuild) and step.dropped_names == ("x", "a_1")


def test_different_partial_filter_or_collation_is_not_a_blocker() -> None:
    result = plan(define(indexes=[{"key": {"a": 1}, "name": "x",
                                   "collation": {"locale": "en", "strength": 2}}]),
                  live({"key": {"a": 1}, "name": "a_1"}))
    assert rows(result) == [("index", "x", "create"), ("index", "a_1", "keep")]


def test_swapped_keys_become_one_group_rebuild() -> None:
    result = plan(define(indexes=[{"key": {"a": 1}, "name": "x"},
                                  {"key": {"b": 1}, "name": "y"}]),
                  live({"key": {"b": 1}, "name": "x"}, {"key": {"a": 1}, "name": "y"}))
    assert rows(result) == [("index", "x", "recreate"), ("index", "y", "recreate")]
    (step,) = result.steps
    assert isinstance(step, Rebuild) and step.group
    assert step.rows == (("index", "x"), ("index", "y"))
    assert step.dropped_names == ("x", "y")
    assert [spec["name"] for spec in step.creates] == ["x", "y"]


def test_create_colliding_with_a_rebuild_drop_joins_its_group() -> None:
    result = plan(define(indexes=[{"key": {"b": 1}, "name": "x"},
                                  {"key": {"a": 1}, "name": "new"},
                                  {"key": {"z": 1}}]),
                  live({"key": {"a": 1}, "name": "x"}))
    assert rows(result) == [("index", "x", "recreate"), ("index", "new", "create"),
                            ("index", "z_1", "create")]
    batch, group = result.steps
    assert batch == CreateIndexes(rows=(("index", "z_1"),),
                                  specs=({"key": {"z": 1}, "name": "z_1"},))
    assert isinstance(group, Rebuild) and group.group
    assert group.rows == (("index", "x"), ("index", "new"))


# --------------------------------------------------------------------------------- prune


def test_undeclared_indexes_are_kept_without_prune_and_dropped_with_it() -> None:
    state = live({"key": {"a": 1}, "name": "a_1"}, {"key": {"old": 1}, "name": "old_1"})
    kept = plan(define(indexes=[{"key": {"a": 1}}]), state)
    assert rows(kept) == [("index", "a_1", "unchanged"), ("index", "old_1", "keep")]
    assert kept.actions[1].reason == "not declared"
    assert kept.actions[1].from_ == {"key": {"old": 1}, "name": "old_1"}
    assert ConvergeResult.planned([kept]).in_sync  # keep never counts against in sync
    pruned = plan(define(indexes=[{"key": {"a": 1}}]), state, prune=True)
    assert rows(pruned) == [("index", "a_1", "unchanged"), ("index", "old_1", "drop")]
    assert pruned.steps == (DropIndex(rows=(("index", "old_1"),), name="old_1"),)


def test_the_definition_prune_wins_over_the_call() -> None:
    state = live({"key": {"old": 1}, "name": "old_1"})
    assert rows(plan(define(indexes=[], prune=False), state, prune=True)) == [
        ("index", "old_1", "keep")]
    assert rows(plan(define(indexes=[], prune=True), state, prune=False)) == [
        ("index", "old_1", "drop")]


def test_prune_never_drops_the_shard_key_index() -> None:
    state = live({"key": {"region": 1, "at": 1}, "name": "region_1_at_1"},
                 {"key": {"at": 1}, "name": "at_1"}, shard_key={"region": 1})
    result = plan(define(indexes=[]), state, prune=True)
    assert rows(result) == [("index", "region_1_at_1", "keep"), ("index", "at_1", "drop")]
    assert result.actions[0].reason == "backs the shard key"


# ---------------------------------------------------------------------------- ordering


def test_steps_run_in_the_reference_order() -> None:
    definition = define(
        validator={"a": {"$exists": True}}, prune=True,
        indexes=[{"key": {"new": 1}}, {"key": {"h": 1}, "hidden": True},
                 {"key": {"r": 1}, "sparse": True}],
        search_indexes=[{"definition": {"mappings": {"dynamic": True}}},
                        {"name": "s2", "definition": {"mappings": {"dynamic": False}}}])
    state = live({"key": {"h": 1}, "name": "h_1"}, {"key": {"r": 1}, "name": "r_1"},
                 {"key": {"gone": 1}, "name": "gone_1"},
                 search_indexes=[
                     {"name": "s2", "type": "search", "status": "READY", "queryable": True,
                      "latestDefinition": {"mappings": {"dynamic": True}},
                      "latestDefinitionVersion": {"version": 3}},
                     {"name": "old", "type": "search", "status": "READY", "queryable": True,
                      "latestDefinition": {"mappings": {"dynamic": True}}}])
    result = plan(definition, state)
    assert rows(result) == [
        ("validator", "c", "create"), ("index", "new_1", "create"), ("index", "h_1", "modify"),
        ("index", "r_1", "recreate"), ("index", "gone_1", "drop"),
        ("searchIndex", "default", "create"), ("searchIndex", "s2", "modify"),
        ("searchIndex", "old", "drop")]
    assert [type(step) for step in result.steps] == [
        CollModValidator, CreateSearchIndexes, UpdateSearchIndex, CreateIndexes, CollModIndex,
        Rebuild, DropIndex, DropSearchIndex]
    update = result.steps[2]
    assert isinstance(update, UpdateSearchIndex) and update.since_version == 3
    assert [row.is_destructive for row in result.actions] == [
        False, False, False, True, True, False, False, True]


# ------------------------------------------------------------------------------ results


def test_plan_json_shape() -> None:
    result = plan(define(indexes=[{"key": {"a": 1}, "name": "by_a"}]),
                  live({"key": {"a": 1}, "name": "a_1"}, {"key": {"b": 1}, "name": "b_1"}))
    converge = ConvergeResult.planned([result])
    assert converge.to_dict() == {
        "dryRun": True, "changed": 0, "inSync": True,
        "collections": [{"name": "c", "actions": [
            {"target": "index", "name": "by_a", "action": "unchanged", "status": "planned",
             "reason": 'exists as "a_1"', "liveName": "a_1"},
            {"target": "index", "name": "b_1", "action": "keep", "status": "planned",
             "reason": "not declared", "from": {"key": {"b": 1}, "name": "b_1"}}]}]}
    json.dumps(converge.to_dict())


def test_changed_counts_collection_and_validator_rows() -> None:
    result = plan(define(validator={"a": 1}, indexes=[{"key": {"a": 1}}]), MISSING)
    converge = ConvergeResult.planned([result])
    assert (converge.changed, converge.in_sync) == (3, False)
    assert converge.collections[0].row("collection", "c").to_dict() == {
        "target": "collection", "name": "c", "action": "create", "status": "planned"}


# ---------------------------------------------------------------------------- versioning


def test_versioning_alone_manages_its_validator_and_index_in_partial_mode() -> None:
    definition = define(versioning={"current": 2})
    result = plan(definition, MISSING)
    assert rows(result) == [("collection", "c", "create"), ("validator", "c", "create"),
                            ("index", "__v_1__id_1", "create")]
    assert result.row("validator", "c").to == {
        "validator": {"$jsonSchema": {
            "properties": {"__v": {"bsonType": "int", "minimum": 1},
                           "__rev": {"bsonType": ["int", "long"], "minimum": 0}},
            "required": ["__v", "__rev"]}},
        "validationLevel": "moderate", "validationAction": "error"}
    # Partial mode: other indexes are never listed nor dropped, even with prune.
    state = live({"key": {"__v": 1, "_id": 1}, "name": "__v_1__id_1"},
                 {"key": {"x": 1}, "name": "x_1"},
                 options={"validator": result.row("validator", "c").to["validator"],  # type: ignore[index]
                          "validationLevel": "moderate"})
    again = plan(definition, state, prune=True)
    assert rows(again) == [("validator", "c", "unchanged"), ("index", "__v_1__id_1", "unchanged")]


def test_versioning_min_zero_and_no_revision() -> None:
    result = plan(define(versioning={"current": 1, "min": 0, "revision": False, "index": False}),
                  MISSING)
    assert rows(result) == [("collection", "c", "create"), ("validator", "c", "create")]
    assert result.row("validator", "c").to["validator"] == {  # type: ignore[index]
        "$jsonSchema": {"properties": {"__v": {"bsonType": "int", "minimum": 0}}}}


def test_versioning_merges_into_a_declared_json_schema_and_query() -> None:
    schema = define(validator={"$jsonSchema": {"bsonType": "object", "required": ["seats"],
                                               "properties": {"seats": {"minimum": 1}}}},
                    versioning={"current": 2, "revision": False}, indexes=[])
    wanted = plan(schema, live()).row("validator", "c").to
    assert wanted == {"validator": {"$jsonSchema": {
        "bsonType": "object", "required": ["seats", "__v"],
        "properties": {"seats": {"minimum": 1}, "__v": {"bsonType": "int", "minimum": 1}}}},
        "validationLevel": "strict", "validationAction": "error"}
    query = define(validator={"seats": {"$gte": 1}}, versioning={"current": 1, "revision": False})
    merged = plan(query, live()).row("validator", "c").to["validator"]  # type: ignore[index]
    assert merged == {"seats": {"$gte": 1}, "$jsonSchema": {
        "properties": {"__v": {"bsonType": "int", "minimum": 1}}, "required": ["__v"]}}


def test_version_index_appended_to_declared_indexes_and_prune_acts_on_others() -> None:
    definition = define(versioning={"current": 1}, indexes=[{"key": {"a": 1}}], prune=True)
    state = live({"key": {"a": 1}, "name": "a_1"}, {"key": {"x": 1}, "name": "x_1"})
    assert [row[1:] for row in rows(plan(definition, state)) if row[0] == "index"] == [
        ("a_1", "unchanged"), ("__v_1__id_1", "create"), ("x_1", "drop")]


def test_sharded_version_index() -> None:
    definition = define(versioning={"current": 1}, indexes=[])
    ordinary = {"key": {"__v": 1, "_id": 1}, "name": "__v_1__id_1"}
    state = live(ordinary, shard_key={"region": 1, "__v": 1})
    result = plan(definition, state)
    indexes = [row for row in result.actions if row.target == "index"]
    assert [(row.name, row.action) for row in indexes] == [
        ("__v_1_region_1__id_1", "create"), ("__v_1__id_1", "keep")]
    assert indexes[0].to == {"key": {"__v": 1, "region": 1, "_id": 1},
                             "name": "__v_1_region_1__id_1"}
    assert "shard-key-prefixed" in str(indexes[1].reason)
    pruned = plan(definition, state, prune=True)
    assert [(row.name, row.action) for row in pruned.actions if row.target == "index"] == [
        ("__v_1_region_1__id_1", "create"), ("__v_1__id_1", "drop")]
    partial = plan(define(versioning={"current": 1}), state, prune=True)
    assert [(row.name, row.action) for row in partial.actions if row.target == "index"] == [
        ("__v_1_region_1__id_1", "create"), ("__v_1__id_1", "keep")]
    on_id = plan(definition, live(ordinary, shard_key={"_id": "hashed"}))
    assert [(row.name, row.action) for row in on_id.actions if row.target == "index"] == [
        ("__v_1__id_hashed", "create"), ("__v_1__id_1", "keep")]


def test_floor_guard() -> None:
    definition = define(versioning={"current": 3, "min": 2})
    old = {"validator": {"$jsonSchema": {"properties": {"__v": {"minimum": 1}}}}}
    assert floor_to_probe(definition, live(options=old)) == 2
    assert floor_to_probe(definition, MISSING) is None
    assert floor_to_probe(definition, live(type_="view")) is None
    raised = {"validator": {"$jsonSchema": {"properties": {"__v": {"minimum": 2}}}}}
    assert floor_to_probe(definition, live(options=raised)) is None
    assert floor_to_probe(define(versioning={"current": 1, "min": 0}), live()) is None

    below = plan(definition, live(options=old, version_floor=VersionFloor(2, True)))
    row = below.row("validator", "c")
    assert row.action == "conflict" and row.to is not None
    assert "documents below version 2 remain" in str(row.reason)
    assert not any(isinstance(step, CollModValidator) for step in below.steps)
    unknown = plan(definition, live(options=old, version_floor=VersionFloor(2, "unknown",
                                                                            "timeout")))
    assert "could not check" in str(unknown.row("validator", "c").reason)
    assert "timeout" in str(unknown.row("validator", "c").reason)
    clear = plan(definition, live(options=old, version_floor=VersionFloor(2, False)))
    assert clear.row("validator", "c").action == "modify"


# -------------------------------------------------------------------------------- search


def test_search_unavailable_is_a_conflict_or_a_skip_and_creates_nothing() -> None:
    definition = define(search_indexes=[{"definition": {"mappings": {"dynamic": True}}}])
    off = SearchAvailability(available=False)
    assert rows(plan(definition, MISSING, search=off)) == [
        ("searchIndex", "default", "conflict")]
    skip = SearchAvailability(available=False, on_unavailable="skip")
    assert rows(plan(definition, live(), search=skip)) == [("searchIndex", "default", "skip")]
    created = plan(definition, MISSING)
    assert rows(created) == [("collection", "c", "create"), ("searchIndex", "default", "create")]
    assert [type(step) for step in created.steps] == [CreateCollection, CreateSearchIndexes]


def test_search_rows() -> None:
    definition = define(search_indexes=[
        {"definition": {"mappings": {"dynamic": True}}},
        {"name": "vec", "type": "vectorSearch",
         "definition": {"fields": [{"type": "vector", "path": "e", "numDimensions": 3,
                                    "similarity": "cosine"}]}},
        {"name": "gone", "definition": {"mappings": {"dynamic": True}}}])
    listed = [
        {"name": "default", "type": "search", "status": "FAILED", "queryable": False,
         "message": "x" * 600, "latestDefinition": {"mappings": {"dynamic": True}}},
        {"name": "vec", "type": "search", "status": "READY", "queryable": True,
         "latestDefinition": {"mappings": {"dynamic": True}}},
        {"name": "gone", "status": "DELETING", "latestDefinition": {}},
        {"name": "leaving", "status": "DOES_NOT_EXIST", "latestDefinition": {}}]
    result = plan(definition, live(search_indexes=listed), prune=True)
    assert rows(result) == [("searchIndex", "default", "unchanged"),
                            ("searchIndex", "vec", "conflict"),
                            ("searchIndex", "gone", "conflict"),
                            ("searchIndex", "leaving", "keep")]
    build = result.actions[0].build
    assert build is not None and build["status"] == "FAILED" and len(build["message"]) == 500
    assert "new name" in str(result.actions[1].reason)
    assert result.actions[3].reason == "being deleted"
    assert result.steps == ()
