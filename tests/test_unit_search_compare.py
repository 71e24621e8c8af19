"""The search-index comparison (collections.md §7.3): Atlas's defaults, server-only options,
differing paths and immutable autoEmbed changes — and what the planner makes of them."""

from __future__ import annotations

from typing import Any

from migronaut.declared.search import DeclaredSearchIndex
from migronaut.declared.search_compare import compare_definitions, effective_definition
from migronaut.declared.search_plan import SearchAvailability, plan_search_indexes

SEARCH = {"mappings": {"dynamic": False, "fields": {"title": {"type": "string"}}}}
VECTOR = {"fields": [{"type": "vector", "path": "embedding", "numDimensions": 3,
                      "similarity": "cosine"}]}


def _atlas_search() -> dict[str, Any]:
    """What Atlas reports for SEARCH: every default spelled out, plus an option of its own."""
    return {"analyzer": "lucene.standard", "searchAnalyzer": "lucene.standard",
            "storedSource": False, "numPartitions": 1, "analyzers": [], "synonyms": [],
            "mappings": {"dynamic": False, "fields": {"title": {
                "type": "string", "indexOptions": "offsets", "store": True, "norms": "include",
                "similarity": {"type": "bm25"}}}}}


def test_defaults_are_filled_on_both_sides_and_server_options_are_ignored() -> None:
    diff = compare_definitions("search", SEARCH, "search", _atlas_search())
    assert diff.diffs == ()
    assert diff.ignored == ("mappings.fields.title.similarity",)


def test_effective_form_fills_nested_and_searchanalyzer() -> None:
    filled = effective_definition("search", {"analyzer": "lucene.english", "mappings": {
        "fields": {"a": {"type": "document", "fields": {"n": {"type": "number"}}},
                   "b": [{"type": "token"}, {"type": "autocomplete"}]}}})
    assert filled["searchAnalyzer"] == "lucene.english"
    assert filled["mappings"]["dynamic"] is False
    nested = filled["mappings"]["fields"]["a"]
    assert nested["dynamic"] is False and nested["fields"]["n"]["representation"] == "double"
    assert [m["type"] for m in filled["mappings"]["fields"]["b"]] == ["autocomplete", "token"]


def test_a_field_only_the_server_has_is_a_difference() -> None:
    live = _atlas_search()
    live["mappings"]["fields"]["body"] = {"type": "string"}
    diff = compare_definitions("search", SEARCH, "search", live)
    assert diff.diffs == ("mappings",)
    assert diff.paths == ("mappings.fields.body",)


def test_paths_are_capped_with_a_count_of_more() -> None:
    declared = {"mappings": {"fields": {f"f{i}": {"type": "token"} for i in range(7)}}}
    live = {"mappings": {"fields": {f"f{i}": {"type": "token", "normalization": "lowercase"}
                                    for i in range(7)}}}
    diff = compare_definitions("search", declared, "search", live)
    assert len(diff.paths) == 5 and diff.more == 2
    assert diff.paths[0] == "mappings.fields.f0.normalization"


def test_type_change_is_reported_alone() -> None:
    assert compare_definitions("vectorSearch", VECTOR, "search", SEARCH).diffs == ("type",)


def test_vector_defaults_and_field_order_do_not_matter() -> None:
    declared = {"fields": [{"type": "filter", "path": "tenant"}, *VECTOR["fields"]]}
    live = {"storedSource": False, "fields": [
        {**VECTOR["fields"][0], "quantization": "none", "indexingMethod": "hnsw",
         "hnswOptions": {"maxEdges": 16, "numEdgeCandidates": 100, "extra": 1}},
        {"type": "filter", "path": "tenant"}]}
    diff = compare_definitions("vectorSearch", declared, "vectorSearch", live)
    assert diff.diffs == ()
    assert diff.ignored == ("fields[vector:embedding].hnswOptions.extra",)


def test_autoembed_changes_are_immutable() -> None:
    auto = {"fields": [{"type": "autoEmbed", "path": "embedding", "model": "voyage-3"}]}
    switched = compare_definitions("vectorSearch", auto, "vectorSearch", VECTOR)
    assert switched.immutable == ("embedding.type",)
    model = compare_definitions("vectorSearch", auto, "vectorSearch", {"fields": [
        {"type": "autoEmbed", "path": "embedding", "model": "voyage-2"}]})
    assert model.immutable == ("embedding.model",)
    moved = compare_definitions("vectorSearch", auto, "vectorSearch", {"fields": [
        {"type": "autoEmbed", "path": "other", "model": "voyage-3"}]})
    assert moved.immutable == ("path",)
    plain = compare_definitions("vectorSearch", VECTOR, "vectorSearch", {"fields": [
        {**VECTOR["fields"][0], "similarity": "euclidean"}]})
    assert plain.diffs == ("fields",) and plain.immutable == ()


def _listed(kind: str, definition: dict[str, Any], status: str = "READY") -> dict[str, Any]:
    return {"name": "default", "type": kind, "status": status, "queryable": status == "READY",
            "latestDefinition": definition, "latestDefinitionVersion": {"version": 2}}


def test_planner_rows_unchanged_modify_and_conflict() -> None:
    available = SearchAvailability(True)
    declared = (DeclaredSearchIndex("default", "search", SEARCH),)
    same = plan_search_indexes(declared, [_listed("search", _atlas_search())], prune=False,
                               search=available)
    assert [r.action for r in same.rows] == ["unchanged"]
    assert same.rows[0].ignored == ("mappings.fields.title.similarity",)
    failed = plan_search_indexes(declared, [_listed("search", SEARCH, "FAILED")], prune=False,
                                 search=available)
    assert [r.action for r in failed.rows] == ["unchanged"]
    changed = plan_search_indexes(
        declared, [_listed("search", {"mappings": {"fields": {"title": {"type": "token"}}}})],
        prune=False, search=available)
    assert [r.action for r in changed.rows] == ["modify"]
    assert "mappings.fields.title.type" in (changed.rows[0].reason or "")
    assert changed.updates[0].since_version == 2
    auto = (DeclaredSearchIndex("default", "vectorSearch", {"fields": [
        {"type": "autoEmbed", "path": "embedding", "model": "voyage-3"}]}),)
    refused = plan_search_indexes(auto, [_listed("vectorSearch", VECTOR)], prune=False,
                                  search=available)
    assert refused.rows[0].action == "conflict"
    assert "embedding.type" in (refused.rows[0].reason or "")
    assert refused.updates == ()
