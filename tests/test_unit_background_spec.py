"""Background specs without a server: validation, resolution, match, requires, skeleton."""

from __future__ import annotations

import datetime as dt
import decimal
import re
import uuid
from collections import OrderedDict
from typing import Any

import pytest
from bson import Code, Decimal128, Int64, ObjectId, Regex
from bson.binary import Binary

from migronaut.background.planning.spec import (
    DEFAULT_RESERVED_COLLECTIONS,
    SKELETON,
    BackgroundFunctions,
    ResolvedBackground,
    match_filter,
    match_hash,
    resolve_background,
    validate_requires,
)
from migronaut.errors import EXIT_CODES, MigrationInvalidExportError

NAME = "20240101000000_backfill.py"


def migrate(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return doc


async def migrate_async(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return doc


def batch(docs: list[dict[str, Any]], ctx: Any) -> list[dict[str, Any]]:
    return docs


def step(ctx: Any) -> dict[str, Any]:
    return {"checkpoint": None, "done": True}


def base(**extra: Any) -> dict[str, Any]:
    return {"collection": "users", "from": 0, "to": 1, "migrate": migrate, **extra}


def resolve(declared: Any, **kw: Any) -> ResolvedBackground:
    return resolve_background(NAME, declared, **kw)


def issues_of(declared: Any, **kw: Any) -> list[dict[str, str]]:
    with pytest.raises(MigrationInvalidExportError) as info:
        resolve(declared, **kw)
    issues: list[dict[str, str]] = info.value.context["issues"]
    first = issues[0]
    assert info.value.message == (
        f"Invalid background migration {NAME}: {first['path']} {first['message']}"
    )
    assert info.value.exit_code == 20 == EXIT_CODES["MIGRATION_INVALID_EXPORT"]
    return issues


def issue(declared: Any, path: str, **kw: Any) -> str:
    """The message of the one issue at ``path`` (fails when there is none)."""
    found = [i["message"] for i in issues_of(declared, **kw) if i["path"] == path]
    assert found, f"no issue at {path}"
    return found[0]


# -------------------------------------------------------------------------------- defaults


def test_declarative_defaults_resolve_to_the_persisted_camel_case_spec() -> None:
    resolved = resolve(base())
    assert resolved.mode == "declarative"
    assert resolved.spec == {
        "mode": "declarative",
        "collection": "users",
        "from": 0,
        "to": 1,
        "filter": {},
        "field": "__v",
        "revisionField": "__rev",
        "occ": "revision",
        "batched": False,
        "reversible": False,
        "batchSize": 500,
        "pauseMs": 100,
        "sliceMs": 30_000,
        "writeConcern": {"w": "majority"},
        "maxDocumentErrors": 0,
        "maxPasses": 10,
        "maxConflictRetries": 3,
        "maxSliceFailures": 3,
        "maxOutageMs": 300_000,
        "maxReplicationLagMs": 10_000,
        "maxParallel": 1,
        "shardConcurrency": 1,
        "partitions": {
            "overPartition": 4,
            "maxPartitions": 256,
            "minPartitionDocs": 2000,
            "sampleSize": 400,
        },
        "transaction": False,
        "adaptive": {
            "targetLatencyMs": 500,
            "minBatchSize": 10,
            "maxBatchSize": 500,
            "maxPauseMs": 30_000,
        },
    }
    assert list(resolved.spec)[:10] == [
        "mode",
        "collection",
        "from",
        "to",
        "filter",
        "field",
        "revisionField",
        "occ",
        "batched",
        "reversible",
    ]
    assert resolved.functions == BackgroundFunctions(migrate=migrate)


def test_the_spec_holds_no_functions_and_is_plain_data() -> None:
    spec = resolve(base(throttle=lambda ctx: 0, revert=migrate)).spec

    def walk(value: Any) -> None:
        assert not callable(value)
        if isinstance(value, dict):
            for item in value.values():
                walk(item)

    walk(spec)


def test_transaction_on_lowers_the_default_batch_size_to_100() -> None:
    spec = resolve(base(transaction=True)).spec
    assert spec["transaction"] == {"timeoutMs": 10_000, "maxRetries": 5}
    assert spec["batchSize"] == 100
    assert spec["adaptive"]["maxBatchSize"] == 100
    assert spec["partitions"]["minPartitionDocs"] == 400
    spec = resolve(base(transaction={"timeout_ms": 2000, "max_retries": 0})).spec
    assert spec["transaction"] == {"timeoutMs": 2000, "maxRetries": 0}
    assert spec["batchSize"] == 100
    assert resolve(base(transaction=True, batch_size=250)).spec["batchSize"] == 250
    assert resolve(base(transaction=False)).spec["transaction"] is False


def test_every_setting_is_resolved_under_its_camel_case_name() -> None:
    spec = resolve(
        base(
            description="Backfill status",
            batch_size=50,
            pause_ms=0,
            slice_ms=1000,
            write_concern={"w": 2, "j": True, "wtimeout": 5000},
            max_document_errors=1000,
            max_passes=1,
            max_conflict_retries=0,
            max_slice_failures=100,
            max_replication_lag_ms=False,
            max_parallel=64,
            shard_concurrency=64,
            partitions={
                "over_partition": 64,
                "max_partitions": 4096,
                "min_partition_docs": 1,
                "sample_size": 100_000,
            },
            adaptive=False,
        )
    ).spec
    assert spec["description"] == "Backfill status"
    assert list(spec).index("description") == list(spec).index("reversible") + 1
    assert spec["batchSize"] == 50
    assert spec["pauseMs"] == 0
    assert spec["sliceMs"] == 1000
    assert spec["writeConcern"] == {"w": 2, "j": True, "wtimeout": 5000}
    assert spec["maxDocumentErrors"] == 1000
    assert spec["maxPasses"] == 1
    assert spec["maxConflictRetries"] == 0
    assert spec["maxSliceFailures"] == 100
    assert spec["maxReplicationLagMs"] is False
    assert spec["maxParallel"] == 64
    assert spec["shardConcurrency"] == 64
    assert spec["partitions"] == {
        "overPartition": 64,
        "maxPartitions": 4096,
        "minPartitionDocs": 1,
        "sampleSize": 100_000,
    }
    assert spec["adaptive"] is False


def test_sample_size_default_follows_partitions_and_parallelism() -> None:
    # min(10 000, 100 × min(maxPartitions, overPartition × maxParallel))
    assert resolve(base(max_parallel=8)).spec["partitions"]["sampleSize"] == 3200
    assert resolve(base(max_parallel=64)).spec["partitions"]["sampleSize"] == 10_000
    spec = resolve(base(max_parallel=64, partitions={"max_partitions": 10})).spec
    assert spec["partitions"]["sampleSize"] == 1000
    spec = resolve(base(max_parallel=2, partitions={"over_partition": 1})).spec
    assert spec["partitions"]["sampleSize"] == 200


def test_min_partition_docs_defaults_to_four_batches() -> None:
    assert resolve(base(batch_size=7)).spec["partitions"]["minPartitionDocs"] == 28


def test_adaptive_values_are_clamped_to_the_batch_size() -> None:
    spec = resolve(base(batch_size=5)).spec
    assert spec["adaptive"] == {
        "targetLatencyMs": 500,
        "minBatchSize": 5,
        "maxBatchSize": 5,
        "maxPauseMs": 30_000,
    }
    spec = resolve(base(batch_size=200, adaptive={"min_batch_size": 300})).spec
    assert spec["adaptive"]["minBatchSize"] == 200
    assert spec["adaptive"]["maxBatchSize"] == 200
    spec = resolve(
        base(
            batch_size=1000,
            adaptive={
                "target_latency_ms": 50,
                "min_batch_size": 20,
                "max_batch_size": 5000,
                "max_pause_ms": 0,
            },
        )
    ).spec
    assert spec["adaptive"] == {
        "targetLatencyMs": 50,
        "minBatchSize": 20,
        "maxBatchSize": 1000,
        "maxPauseMs": 0,
    }
    assert resolve(base(adaptive=True)).spec["adaptive"]["maxBatchSize"] == 500


def test_functions_may_be_async_and_batched() -> None:
    resolved = resolve(
        {
            "collection": "users",
            "from": 1,
            "to": 2,
            "migrate_batch": batch,
            "revert": migrate_async,
            "throttle": migrate,
        }
    )
    assert resolved.spec["batched"] is True
    assert resolved.spec["reversible"] is True
    assert resolved.functions.migrate is None
    assert resolved.functions.migrate_batch is batch
    assert resolved.functions.revert is migrate_async
    assert resolved.functions.throttle is migrate
    assert resolved.functions.transform("forward") == (batch, True)
    assert resolved.functions.transform("revert") == (migrate_async, False)
    assert resolve(base()).functions.transform("revert") == (None, False)
    assert resolve(base(revert_batch=batch)).functions.transform("revert") == (batch, True)


def test_description_empty_or_none_is_omitted() -> None:
    assert "description" not in resolve(base(description="")).spec
    assert "description" not in resolve(base(description=None)).spec


def test_write_concern_accepts_a_pymongo_write_concern() -> None:
    from pymongo.write_concern import WriteConcern

    spec = resolve(base(write_concern=WriteConcern(w="majority", wtimeout=1000))).spec
    assert spec["writeConcern"] == {"w": "majority", "wtimeout": 1000}
    assert resolve(base(write_concern={})).spec["writeConcern"] == {}


# -------------------------------------------------------------------------------- step mode


def test_step_spec_resolves_with_max_parallel_one() -> None:
    resolved = resolve({"step": step, "revert_step": step, "collection": "events"})
    assert resolved.mode == "step"
    spec = resolved.spec
    assert spec["mode"] == "step"
    assert spec["collection"] == "events"
    assert spec["reversible"] is True
    assert spec["maxParallel"] == 1
    for key in ("from", "to", "filter", "field", "revisionField", "occ", "batched"):
        assert key not in spec
    assert resolved.functions.step_for("forward") is step
    assert resolved.functions.step_for("revert") is step
    spec = resolve({"step": step, "max_parallel": 1}).spec
    assert "collection" not in spec
    assert spec["reversible"] is False


@pytest.mark.parametrize(
    "key",
    [
        "from",
        "to",
        "filter",
        "migrate",
        "migrate_batch",
        "revert",
        "revert_batch",
        "version_field",
        "revision_field",
        "occ",
    ],
)
def test_declarative_keys_on_a_step_spec_are_refused(key: str) -> None:
    value: Any = migrate if "migrate" in key or "revert" in key else 1
    message = issue({"step": step, key: value}, f"background.{key}")
    assert "step owns its own writes" in message


def test_step_max_parallel_must_be_one() -> None:
    message = issue({"step": step, "max_parallel": 2}, "background.max_parallel")
    assert "must be 1" in message


def test_step_must_be_a_function_and_revert_step_needs_step() -> None:
    assert "must be a function" in issue({"step": "run"}, "background.step")
    assert "only for step" in issue(base(revert_step=step), "background.revert_step")


def test_step_collection_is_validated_too() -> None:
    assert "placeholder" in issue({"step": step, "collection": "TODO"}, "background.collection")


# -------------------------------------------------------------------------------- keys


def test_not_a_dict_is_refused() -> None:
    assert issue([1, 2], "background").startswith("must be a dict")
    assert issue(None, "background").startswith("must be a dict")


def test_unknown_keys_are_refused_with_a_suggestion() -> None:
    found = issues_of(base(batchSize=10, max_paralel=2, colour="red"))
    by_path = {i["path"]: i["message"] for i in found}
    assert by_path["background.batchSize"] == (
        "unknown key — did you mean 'batch_size'? (keys are snake_case)"
    )
    assert by_path["background.max_paralel"] == "unknown key — did you mean 'max_parallel'?"
    assert by_path["background.colour"] == "unknown key"


def test_partitioner_is_reserved() -> None:
    message = issue(base(partitioner="id"), "background.partitioner")
    assert "not supported yet" in message
    assert "_id" in message


def test_every_problem_is_collected() -> None:
    found = issues_of(
        {"collection": "TODO", "from": -1, "to": "2", "batch_size": 0, "occ": "x", "bad": 1}
    )
    paths = [i["path"] for i in found]
    for path in (
        "background.bad",
        "background.collection",
        "background.from",
        "background.to",
        "background.migrate",
        "background.batch_size",
        "background.occ",
    ):
        assert path in paths


# -------------------------------------------------------------------------------- collection


def test_collection_is_required_for_declarative() -> None:
    declared = base()
    del declared["collection"]
    assert "required" in issue(declared, "background.collection")


@pytest.mark.parametrize("value", ["", 5, None, "a$b", "x\x00y", "system.profile"])
def test_invalid_collection_names_are_refused(value: Any) -> None:
    assert issue(base(collection=value), "background.collection").startswith("must be")


def test_the_todo_placeholder_is_refused() -> None:
    message = issue(base(collection="TODO"), "background.collection")
    assert "placeholder" in message
    # only the exact placeholder: a to-do app may well have a "todo" collection
    assert resolve(base(collection="todo")).spec["collection"] == "todo"


@pytest.mark.parametrize("value", [*DEFAULT_RESERVED_COLLECTIONS, "_migronaut_runs",
                                   "_migronaut_converge_rebuilds", "_migronaut_anything"])
def test_migronauts_own_collections_are_refused(value: str) -> None:
    assert "one of migronaut's own collections" in issue(
        base(collection=value), "background.collection"
    )


def test_configured_reserved_collections_are_refused() -> None:
    message = issue(
        base(collection="changelog"), "background.collection", reserved_collections={"changelog"}
    )
    assert "one of migronaut's own collections" in message
    assert resolve(base(collection="changelog")).spec["collection"] == "changelog"


# -------------------------------------------------------------------------------- versions


@pytest.mark.parametrize("value", [-1, 1.0, "1", True, None, 2**53])
def test_from_and_to_must_be_safe_integers_at_least_zero(value: Any) -> None:
    declared = base(**{"from": value, "to": 2**53 - 1})
    assert issue(declared, "background.from").startswith("must be a safe integer ≥ 0")
    declared = base(**{"from": 0, "to": value})
    assert issue(declared, "background.to").startswith("must be a safe integer ≥ 0")


def test_from_and_to_are_required() -> None:
    declared = base()
    del declared["from"], declared["to"]
    assert "required" in issue(declared, "background.from")
    assert "required" in issue(declared, "background.to")


@pytest.mark.parametrize(("start", "end"), [(1, 1), (3, 2)])
def test_to_must_be_greater_than_from(start: int, end: int) -> None:
    message = issue(base(**{"from": start, "to": end}), "background.to")
    assert "must be greater than from" in message
    assert "revert" in message


def test_int64_versions_are_accepted() -> None:
    spec = resolve(base(**{"from": Int64(1), "to": Int64(2)})).spec
    assert spec["from"] == 1
    assert spec["to"] == 2
    assert type(spec["to"]) is int


# -------------------------------------------------------------------------------- functions


def test_migrate_or_migrate_batch_is_required() -> None:
    declared = base()
    del declared["migrate"]
    assert "required" in issue(declared, "background.migrate")


def test_migrate_and_migrate_batch_together_are_refused() -> None:
    assert "not both" in issue(base(migrate_batch=batch), "background.migrate_batch")


def test_revert_and_revert_batch_together_are_refused() -> None:
    assert "not both" in issue(base(revert=migrate, revert_batch=batch), "background.revert_batch")


@pytest.mark.parametrize("key", ["migrate", "migrate_batch", "revert", "revert_batch", "throttle"])
def test_function_keys_must_be_callable(key: str) -> None:
    declared = base()
    if key == "migrate_batch":
        del declared["migrate"]
    declared[key] = "not a function"
    assert issue(declared, f"background.{key}") == "must be a function, got 'not a function'"


# -------------------------------------------------------------------------------- occ, fields


def test_occ_values() -> None:
    assert resolve(base(occ="revision")).spec["occ"] == "revision"
    spec = resolve(base(occ="version-only")).spec
    assert spec["occ"] == "version-only"
    assert spec["revisionField"] is None
    assert "must be 'revision' or 'version-only'" in issue(base(occ="none"), "background.occ")


def test_version_only_with_a_revision_field_is_refused() -> None:
    message = issue(base(occ="version-only", revision_field="rev"), "background.revision_field")
    assert "has no effect" in message


def test_custom_field_names() -> None:
    spec = resolve(base(version_field="schemaVersion", revision_field="rev")).spec
    assert spec["field"] == "schemaVersion"
    assert spec["revisionField"] == "rev"


@pytest.mark.parametrize("value", ["", "a.b", "$v", "v\x00", "_id", 3, None])
def test_field_names_must_be_top_level_names(value: Any) -> None:
    assert issue(base(version_field=value), "background.version_field").startswith(
        "must be a top-level field name"
    )
    assert issue(base(revision_field=value), "background.revision_field").startswith(
        "must be a top-level field name"
    )


def test_version_and_revision_fields_must_differ() -> None:
    message = issue(base(version_field="v", revision_field="v"), "background.revision_field")
    assert "must differ" in message


# -------------------------------------------------------------------------------- settings


RANGES = [
    ("batch_size", 1, 10_000),
    ("pause_ms", 0, 3_600_000),
    ("slice_ms", 1000, 3_600_000),
    ("max_document_errors", 0, 1000),
    ("max_passes", 1, 1000),
    ("max_conflict_retries", 0, 100),
    ("max_slice_failures", 1, 100),
    ("max_outage_ms", 0, 86_400_000),
    ("max_replication_lag_ms", 0, 3_600_000),
    ("max_parallel", 1, 64),
    ("shard_concurrency", 1, 64),
]


@pytest.mark.parametrize(("key", "low", "high"), RANGES)
def test_integer_settings_have_inclusive_ranges(key: str, low: int, high: int) -> None:
    resolve(base(**{key: low}))
    resolve(base(**{key: high}))
    for bad in (low - 1, high + 1):
        message = issue(base(**{key: bad}), f"background.{key}")
        assert f"{low} to {high}" in message


@pytest.mark.parametrize(("key", "low", "high"), RANGES)
@pytest.mark.parametrize("bad", [True, 10.0, "10", None])
def test_integer_settings_refuse_bools_floats_strings_and_none(
    key: str, low: int, high: int, bad: Any
) -> None:
    issue(base(**{key: bad}), f"background.{key}")


def test_max_replication_lag_accepts_false_only_as_a_boolean() -> None:
    assert resolve(base(max_replication_lag_ms=False)).spec["maxReplicationLagMs"] is False
    assert "False or an integer" in issue(
        base(max_replication_lag_ms=True), "background.max_replication_lag_ms"
    )


@pytest.mark.parametrize(
    ("key", "low", "high"),
    [
        ("over_partition", 1, 64),
        ("max_partitions", 1, 4096),
        ("sample_size", 1, 100_000),
    ],
)
def test_partition_settings_have_ranges(key: str, low: int, high: int) -> None:
    resolve(base(partitions={key: low}))
    resolve(base(partitions={key: high}))
    for bad in (low - 1, high + 1, True):
        issue(base(partitions={key: bad}), f"background.partitions.{key}")


def test_min_partition_docs_is_a_positive_safe_integer() -> None:
    assert (
        resolve(base(partitions={"min_partition_docs": 2**53 - 1})).spec["partitions"][
            "minPartitionDocs"
        ]
        == 2**53 - 1
    )
    for bad in (0, 2**53, 1.5):
        path = "background.partitions.min_partition_docs"
        issue(base(partitions={"min_partition_docs": bad}), path)


def test_partitions_must_be_a_dict_of_known_keys() -> None:
    assert issue(base(partitions=4), "background.partitions").startswith("must be a dict")
    message = issue(base(partitions={"overPartition": 2}), "background.partitions.overPartition")
    assert "over_partition" in message


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"timeout_ms": 0}, "background.transaction.timeout_ms"),
        ({"timeout_ms": 50_001}, "background.transaction.timeout_ms"),
        ({"max_retries": -1}, "background.transaction.max_retries"),
        ({"max_retries": 21}, "background.transaction.max_retries"),
        ({"retries": 1}, "background.transaction.retries"),
        ("yes", "background.transaction"),
        (1, "background.transaction"),
        (None, "background.transaction"),
    ],
)
def test_transaction_validation(value: Any, path: str) -> None:
    issue(base(transaction=value), path)


def test_transaction_range_edges_are_inclusive() -> None:
    spec = resolve(base(transaction={"timeout_ms": 50_000, "max_retries": 20})).spec
    assert spec["transaction"] == {"timeoutMs": 50_000, "maxRetries": 20}
    spec = resolve(base(transaction={"timeout_ms": 1})).spec
    assert spec["transaction"] == {"timeoutMs": 1, "maxRetries": 5}


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"target_latency_ms": 0}, "background.adaptive.target_latency_ms"),
        ({"target_latency_ms": 600_001}, "background.adaptive.target_latency_ms"),
        ({"min_batch_size": 0}, "background.adaptive.min_batch_size"),
        ({"max_batch_size": 10_001}, "background.adaptive.max_batch_size"),
        ({"max_pause_ms": -1}, "background.adaptive.max_pause_ms"),
        ({"max_pause_ms": 3_600_001}, "background.adaptive.max_pause_ms"),
        ({"target": 1}, "background.adaptive.target"),
        ("on", "background.adaptive"),
        (None, "background.adaptive"),
    ],
)
def test_adaptive_validation(value: Any, path: str) -> None:
    issue(base(adaptive=value), path)


def test_adaptive_min_above_max_is_refused() -> None:
    message = issue(
        base(adaptive={"min_batch_size": 50, "max_batch_size": 40}),
        "background.adaptive.min_batch_size",
    )
    assert "must not exceed max_batch_size (40)" in message


@pytest.mark.parametrize(
    ("value", "path", "text"),
    [
        ({"w": 0}, "background.write_concern.w", "must be acknowledged"),
        ({"w": -1}, "background.write_concern.w", "positive integer"),
        ({"w": True}, "background.write_concern.w", "positive integer"),
        ({"j": 1}, "background.write_concern.j", "True or False"),
        ({"wtimeout": -5}, "background.write_concern.wtimeout", "≥ 0"),
        ({"wtimeoutMS": 5}, "background.write_concern.wtimeoutMS", "unknown key"),
        ("majority", "background.write_concern", "must be a dict"),
    ],
)
def test_write_concern_validation(value: Any, path: str, text: str) -> None:
    assert text in issue(base(write_concern=value), path)


def test_description_must_be_a_string() -> None:
    assert "must be a string" in issue(base(description=3), "background.description")


# -------------------------------------------------------------------------------- filter


def test_filter_is_copied_and_kept_in_wire_form() -> None:
    pattern = re.compile("^a", re.I)
    declared_filter: dict[str, Any] = {
        "status": {"$in": ("a", "b")},
        "name": pattern,
        "nested": OrderedDict([("x", 1)]),
        "at": {"$gte": dt.datetime(2024, 1, 1, tzinfo=dt.UTC)},
        "ref": ObjectId("0123456789ab0123456789ab"),
        "price": Decimal128("9.990"),
        "big": Int64(2**40),
        "blob": Binary(b"x", 4),
        "re2": Regex("^b", "i"),
    }
    spec = resolve(base(filter=declared_filter)).spec
    stored = spec["filter"]
    assert stored["status"] == {"$in": ["a", "b"]}
    assert stored["name"] is pattern
    assert type(stored["nested"]) is dict
    assert stored["price"] == Decimal128("9.990")
    declared_filter["status"]["$in"] = ("c",)
    assert spec["filter"]["status"] == {"$in": ["a", "b"]}


@pytest.mark.parametrize("value", [[{"a": 1}], "a == 1", 5, None, OrderedDict(a=1).items()])
def test_filter_must_be_a_plain_dict(value: Any) -> None:
    assert issue(base(filter=value), "background.filter").startswith("must be a plain dict")


@pytest.mark.parametrize(
    "query",
    [
        {"$where": "this.a > 1"},
        {"a": {"$function": {"body": "x", "args": [], "lang": "js"}}},
        {"$expr": {"$accumulator": {}}},
        {"$or": [{"a": 1}, {"$where": "1"}]},
        {"a": {"$elemMatch": {"$and": [{"$where": "x"}]}}},
        {"$and": [{"b": [{"c": {"$function": {}}}]}]},
        {"a": Code("function () {}")},
    ],
)
def test_filter_must_not_run_server_side_javascript(query: dict[str, Any]) -> None:
    assert "server-side JavaScript" in issue(base(filter=query), "background.filter")


@pytest.mark.parametrize(
    "query",
    [
        {"__v": 1},
        {"__v": {"$exists": False}},
        {"__v.x": 1},
        {"$or": [{"a": 1}, {"__v": 2}]},
        {"$and": [{"$nor": [{"__v": 2}]}]},
        {"$nor": [{"__v": 2}]},
        {"$expr": {"$gt": ["$__v", 1]}},
        {"$jsonSchema": {"required": ["__v"]}},
    ],
)
def test_filter_must_not_mention_the_version_field(query: dict[str, Any]) -> None:
    message = issue(base(filter=query), "background.filter")
    assert "must not mention the version field '__v'" in message


def test_filter_mention_check_uses_the_custom_version_field() -> None:
    assert resolve(base(version_field="sv", filter={"__v": 1})).spec["filter"] == {"__v": 1}
    issue(base(version_field="sv", filter={"sv": 1}), "background.filter")
    # a value that merely equals the field name is not a mention
    assert resolve(base(filter={"name": "__v"})).spec["filter"] == {"name": "__v"}


@pytest.mark.parametrize(
    ("query", "text"),
    [
        ({"a": lambda: 1}, "function"),
        ({"a": {1, 2}}, "not a BSON value"),
        ({"a": decimal.Decimal("1.5")}, "Decimal128"),
        ({"a": uuid.uuid4()}, "Binary.from_uuid"),
        ({"a": dt.date(2024, 1, 1)}, "not a BSON value"),
        ({"a": 2**64}, "64-bit"),
        ({"a": {1: "x"}}, "not a string"),
        ({"a\x00": 1}, "NUL"),
        ({"a": object()}, "not a BSON value"),
    ],
)
def test_filter_must_be_wire_serialisable(query: dict[str, Any], text: str) -> None:
    assert text in issue(base(filter=query), "background.filter")


def test_a_cyclic_filter_is_refused_not_a_crash() -> None:
    cyclic: dict[str, Any] = {"a": {}}
    cyclic["a"]["b"] = cyclic
    assert "nested too deeply" in issue(base(filter=cyclic), "background.filter")


# -------------------------------------------------------------------------------- versioning


VERSIONING = {"field": "sv", "current": 3, "revision_field": "rv"}


def test_field_names_default_from_the_collection_versioning() -> None:
    spec = resolve(base(**{"to": 3}), collection_versioning=VERSIONING).spec
    assert spec["field"] == "sv"
    assert spec["revisionField"] == "rv"
    spec = resolve(base(), collection_versioning={"field": "__v", "current": 1}).spec
    assert spec["revisionField"] == "__rev"


def test_to_may_not_exceed_versioning_current() -> None:
    message = issue(base(**{"from": 3, "to": 4}), "background.to", collection_versioning=VERSIONING)
    assert "raise current first" in message


def test_version_field_must_equal_the_declared_field() -> None:
    message = issue(
        base(version_field="__v"), "background.version_field", collection_versioning=VERSIONING
    )
    assert "'sv'" in message
    assert resolve(base(version_field="sv"), collection_versioning=VERSIONING).spec["field"] == "sv"


def test_revision_field_must_equal_the_declared_one() -> None:
    issue(
        base(revision_field="__rev"), "background.revision_field", collection_versioning=VERSIONING
    )


@pytest.mark.parametrize(
    "versioning",
    [
        {"field": "__v", "current": 2, "revision_field": None},
        {"field": "__v", "current": 2, "revisionField": None},
        {"field": "__v", "current": 2, "revision": False},
    ],
)
def test_no_declared_revisions_requires_version_only(versioning: dict[str, Any]) -> None:
    message = issue(base(), "background.occ", collection_versioning=versioning)
    assert "version-only" in message
    spec = resolve(base(occ="version-only"), collection_versioning=versioning).spec
    assert spec["revisionField"] is None
    issue(base(revision_field="rv"), "background.revision_field", collection_versioning=versioning)


def test_filter_mention_check_uses_the_declared_field() -> None:
    issue(base(filter={"sv": 1}), "background.filter", collection_versioning=VERSIONING)


# -------------------------------------------------------------------------------- match


def spec_with(**extra: Any) -> dict[str, Any]:
    return resolve(base(**extra)).spec


def test_match_hash_is_32_hex_characters() -> None:
    value = match_hash(spec_with(), "forward")
    assert re.fullmatch(r"[0-9a-f]{32}", value)
    assert value == match_hash(spec_with(), "forward")


def test_match_hash_ignores_filter_key_order_and_tuning() -> None:
    one = spec_with(filter={"a": 1, "b": {"$gte": 1, "$lt": 5}, "$or": [{"x": 1, "y": 2}]})
    two = spec_with(
        filter={"$or": [{"y": 2, "x": 1}], "b": {"$lt": 5, "$gte": 1}, "a": 1},
        batch_size=10,
        max_parallel=8,
        pause_ms=0,
    )
    assert match_hash(one, "forward") == match_hash(two, "forward")


def test_match_hash_keeps_the_order_of_literal_embedded_documents() -> None:
    # {a: {x, y}} and {a: {y, x}} match different documents in MongoDB
    one = spec_with(filter={"a": {"x": 1, "y": 2}})
    two = spec_with(filter={"a": {"y": 2, "x": 1}})
    assert match_hash(one, "forward") != match_hash(two, "forward")


def test_match_hash_treats_equal_numbers_and_regex_forms_alike() -> None:
    assert match_hash(spec_with(filter={"a": 5}), "forward") == match_hash(
        spec_with(filter={"a": Int64(5)}), "forward"
    )
    assert match_hash(spec_with(filter={"a": 5.0}), "forward") == match_hash(
        spec_with(filter={"a": 5}), "forward"
    )
    assert match_hash(spec_with(filter={"a": re.compile("^x")}), "forward") == match_hash(
        spec_with(filter={"a": Regex("^x", "u")}), "forward"
    )


@pytest.mark.parametrize(
    "change",
    [
        {"from": 1, "to": 2},
        {"to": 2},
        {"collection": "people"},
        {"filter": {"a": 1}},
        {"filter": {"a": re.compile("^y")}},
        {"version_field": "sv"},
        {"revision_field": "rv"},
        {"occ": "version-only"},
    ],
)
def test_match_hash_changes_with_what_decides_the_match(change: dict[str, Any]) -> None:
    before = match_hash(spec_with(filter={"a": re.compile("^x")}), "forward")
    extra = {"filter": {"a": re.compile("^x")}, **change}
    assert match_hash(spec_with(**extra), "forward") != before


def test_match_hash_depends_on_direction() -> None:
    spec = spec_with()
    assert match_hash(spec, "forward") != match_hash(spec, "revert")


def test_match_hash_of_step_specs_depends_only_on_direction() -> None:
    one = resolve({"step": step}).spec
    two = resolve({"step": step, "collection": "x", "batch_size": 5}).spec
    assert match_hash(one, "forward") == match_hash(two, "forward")
    assert match_hash(one, "forward") != match_hash(one, "revert")


def test_match_hash_survives_a_bson_round_trip() -> None:
    import bson

    spec = spec_with(
        filter={
            "name": re.compile("^a"),
            "big": 2**40,
            "at": dt.datetime(2024, 1, 1),
            "id": ObjectId("0123456789ab0123456789ab"),
        }
    )
    stored = bson.decode(bson.encode(spec))
    assert match_hash(stored, "forward") == match_hash(spec, "forward")


def test_match_hash_refuses_an_unknown_direction() -> None:
    with pytest.raises(ValueError):
        match_hash(spec_with(), "sideways")


def test_match_filter_forward_from_zero_matches_missing_null_or_zero() -> None:
    assert match_filter(spec_with(), "forward") == {"__v": {"$in": [None, 0]}}
    assert match_filter(spec_with(filter={"active": True}), "forward") == {
        "active": True,
        "__v": {"$in": [None, 0]},
    }


def test_match_filter_revert_matches_the_target_version() -> None:
    spec = spec_with(**{"from": 2, "to": 3, "version_field": "sv", "filter": {"a": 1}})
    assert match_filter(spec, "forward") == {"a": 1, "sv": 2}
    assert match_filter(spec, "revert") == {"a": 1, "sv": 3}


def test_match_filter_refuses_step_specs() -> None:
    with pytest.raises(ValueError):
        match_filter(resolve({"step": step}).spec, "forward")


# -------------------------------------------------------------------------------- requires


FILES = ["001_a.py", "002_b.py", "003_c.py", "004_contract.py"]
BACKGROUND = {"001_a.py", "002_b.py"}


def check_requires(requires: Any, name: str = "004_contract.py") -> tuple[str, ...]:
    return validate_requires(name, requires, FILES, lambda n: n in BACKGROUND)


def requires_message(requires: Any, name: str = "004_contract.py") -> str:
    with pytest.raises(MigrationInvalidExportError) as info:
        check_requires(requires, name)
    assert info.value.exit_code == 20
    assert info.value.message.startswith(f"Invalid migration {name}: requires")
    issues = info.value.context["issues"]
    assert issues
    return info.value.message


def test_requires_accepts_earlier_background_files() -> None:
    assert check_requires(["001_a.py", "002_b.py"]) == ("001_a.py", "002_b.py")
    assert check_requires(("002_b.py",)) == ("002_b.py",)
    assert check_requires([]) == ()
    assert check_requires(None) == ()


@pytest.mark.parametrize(
    ("requires", "text"),
    [
        ("001_a.py", "must be a list"),
        ({"001_a.py"}, "must be a list"),
        ([3], "bare migration file name"),
        (["../001_a.py"], "bare migration file name"),
        (["sub/001_a.py"], "bare migration file name"),
        (["$x.py"], "bare migration file name"),
        ([""], "bare migration file name"),
        (["001_a.py", "001_a.py"], "listed twice"),
        (["004_contract.py"], "cannot require itself"),
        (["005_later.py"], "does not sort before"),
        (["000_missing.py"], "not a migration file"),
        (["003_c.py"], "not a background migration"),
    ],
)
def test_requires_rules(requires: Any, text: str) -> None:
    assert text in requires_message(requires)


def test_requires_collects_every_problem() -> None:
    with pytest.raises(MigrationInvalidExportError) as info:
        check_requires(["003_c.py", "005_z.py", "003_c.py"])
    paths = [i["path"] for i in info.value.context["issues"]]
    assert paths == ["requires[0]", "requires[1]", "requires[2]"]


# -------------------------------------------------------------------------------- skeleton


def skeleton_namespace() -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(SKELETON.format(title="Backfill status"), "skeleton.py", "exec"), namespace)
    return namespace


def test_the_skeleton_is_refused_because_of_the_placeholder() -> None:
    namespace = skeleton_namespace()
    message = issue(namespace["background"], "background.collection")
    assert "placeholder" in message
    assert [i["path"] for i in issues_of(namespace["background"])] == ["background.collection"]


def test_the_skeleton_resolves_once_the_collection_is_named() -> None:
    namespace = skeleton_namespace()
    declared = dict(namespace["background"], collection="users")
    resolved = resolve(declared)
    assert resolved.spec["from"] == 0
    assert resolved.spec["to"] == 1
    assert resolved.spec["reversible"] is False
    assert resolved.functions.migrate is namespace["migrate"]
    assert namespace["__doc__"].startswith("Backfill status")


def test_the_skeleton_has_a_commented_revert_and_max_parallel() -> None:
    assert "# def revert(" in SKELETON
    assert '# "revert": revert' in SKELETON
    assert '# "max_parallel"' in SKELETON
    assert "def migrate(doc" in SKELETON
