"""``migronaut.versioning`` without a server: the registry, the refusals every guarded writer
makes before sending anything, the update stamping, ``retry_on_conflict`` and the upcaster
(reference collections §3.1, §3.4)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from bson import Int64, Regex

import migronaut
from migronaut import versioning as v
from migronaut.declared.versioning import VersioningSpec
from migronaut.errors import ConfigInvalidError, RevisionConflictError, ShapeVersionError

ORDERS = {"versioning": {"current": 3, "min": 1}}
PLANS = {"name": "plans", "indexes": [{"key": {"a": 1}}]}


def shapes() -> v.Shapes:
    return v.define_shapes({"orders": ORDERS,
                            "users": {"versioning": {"current": 2, "min": 0, "field": "sv",
                                                     "revision": False}}})


# ------------------------------------------------------------------------------ module


def test_importing_the_library_loads_neither_the_engine_nor_the_driver() -> None:
    code = ("import sys, migronaut.versioning\n"
            "bad = [m for m in sys.modules if m == 'pymongo' or m.startswith('pymongo.') "
            "or m.startswith(('migronaut.core', 'migronaut.background', 'migronaut.commands',"
            " 'migronaut.api', 'migronaut.aio'))]\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_error_classes_are_the_package_root_ones_with_their_exit_codes() -> None:
    assert v.RevisionConflictError is migronaut.RevisionConflictError
    assert v.ShapeVersionError is migronaut.ShapeVersionError
    assert v.ConfigInvalidError is migronaut.ConfigInvalidError
    assert RevisionConflictError("x").exit_code == 29
    assert ShapeVersionError("x").code == "SHAPE_VERSION_UNSUPPORTED"
    assert ShapeVersionError("x").exit_code == 30


# ------------------------------------------------------------------------------ registry


def test_registry_resolves_each_definition_once_and_is_frozen() -> None:
    registry = shapes()
    assert registry.names == ("orders", "users")
    assert registry.has("orders") and "users" in registry and not registry.has("plans")
    assert registry.get("orders") == VersioningSpec(current=3, min=1)
    assert registry.get("users").revision_field is None
    assert registry.current("users") == 2
    with pytest.raises(AttributeError):
        registry.names = ()  # type: ignore[misc]
    with pytest.raises(ConfigInvalidError, match=r"'nope' is not a versioned collection "
                       r"\(known: orders, users\)"):
        registry.get("nope")
    with pytest.raises(ConfigInvalidError, match=r"known: none"):
        v.define_shapes([]).get("orders")


def test_list_form_skips_unversioned_and_needs_names() -> None:
    registry = v.define_shapes([PLANS, {"name": "orders", **ORDERS}])
    assert registry.names == ("orders",)
    with pytest.raises(ConfigInvalidError) as caught:
        v.define_shapes([ORDERS])
    assert caught.value.context["issues"] == [{"path": "[0].name",
                                               "message": "is required in a list of definitions"}]
    with pytest.raises(ConfigInvalidError, match="defined twice"):
        v.define_shapes([{"name": "orders", **ORDERS}, {"name": "orders", **ORDERS}])


def test_mapping_form_requires_versioning_and_reports_paths() -> None:
    with pytest.raises(ConfigInvalidError) as caught:
        v.define_shapes({"plans": PLANS, "orders": {"versioning": {"current": 0, "min": 2,
                                                                    "feild": "x"}}})
    assert caught.value.code == "CONFIG_INVALID"
    paths = [issue["path"] for issue in caught.value.context["issues"]]
    assert paths == ["plans.versioning", "orders.versioning.feild", "orders.versioning.current"]
    assert caught.value.context["issues"][0]["message"] == "declares no versioning"


def test_json_spelled_definitions_and_loaded_definitions_are_accepted() -> None:
    from migronaut.declared.definition import validate_definition
    from migronaut.declared.issues import Issues

    raw = {"versioning": {"current": 2, "revisionField": "rv"}, "validationLevel": "strict"}
    assert v.define_shapes({"a": raw}).get("a").revision_field == "rv"
    loaded = validate_definition({"name": "b", "versioning": {"current": 4}}, Issues())
    assert v.define_shapes([loaded]).current("b") == 4


def test_definition_modules_are_read_like_collections_dir_files(tmp_path: Path) -> None:
    import importlib.util

    path = tmp_path / "orders_def.py"
    path.write_text("versioning = {'current': 2, 'min': 1}\nindexes = [{'key': {'a': 1}}]\n")
    spec = importlib.util.spec_from_file_location("orders_def", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert v.define_shapes({"orders": module}).current("orders") == 2
    assert v.upcaster(module, {1: lambda d: d}).current == 2


def test_version_of_reads_missing_as_zero_and_refuses_invalid() -> None:
    registry = shapes()
    assert registry.version_of("orders", {}) == 0
    assert registry.version_of("orders", {"__v": None}) == 0
    assert registry.version_of("orders", {"__v": Int64(2)}) == 2
    assert registry.version_of("orders", {"__v": 3.0}) == 3
    assert registry.version_of("users", {"sv": 1, "__v": "x"}) == 1
    for bad in (-1, 1.5, "2", True, 2**53):
        with pytest.raises(ShapeVersionError) as caught:
            registry.version_of("orders", {"__v": bad})
        assert caught.value.context["reason"] == "invalid"
        assert caught.value.context["collection"] == "orders"
        assert caught.value.context["current"] == 3
    assert registry.is_current("orders", {"__v": 3})
    assert registry.is_version("orders", {}, 0) and not registry.is_version("orders", {}, 1)
    assert v.is_version({"__v": 2}, 2) and v.is_version({}, 0)
    assert not v.is_version({"__v": "2"}, 2)
    assert v.is_version({"sv": 1}, 1, field="sv")
    # an array is no version: a plain {"__v": 2} would match [1, 2]
    assert registry.version_filter("orders", 0) == {
        "__v": {"$in": [None, 0], "$not": {"$type": "array"}}}
    assert registry.version_filter("orders", 2) == {
        "__v": {"$eq": 2, "$not": {"$type": "array"}}}


def test_stamp_is_a_shallow_idempotent_copy() -> None:
    registry = shapes()
    doc = {"a": {"b": 1}}
    stamped = registry.stamp("orders", doc)
    assert stamped == {"a": {"b": 1}, "__v": 3, "__rev": 0} and doc == {"a": {"b": 1}}
    assert stamped["a"] is doc["a"]
    assert registry.stamp("orders", stamped) == stamped
    assert registry.stamp("orders", {"__v": 1}) == {"__v": 1, "__rev": 0}
    assert registry.stamp("users", {}) == {"sv": 2}
    assert registry.on_insert("orders", [{}, {"x": 1}]) == [
        {"__v": 3, "__rev": 0}, {"x": 1, "__v": 3, "__rev": 0}]
    with pytest.raises(ConfigInvalidError, match="takes a document"):
        registry.stamp("orders", [("a", 1)])


def test_stamp_upsert_sets_version_on_insert_and_starts_revision_at_one() -> None:
    registry = shapes()
    update = {"$set": {"a": 1}, "$inc": {"n": 1}}
    assert registry.stamp_upsert("orders", update) == {
        "$set": {"a": 1}, "$inc": {"n": 1, "__rev": 1}, "$setOnInsert": {"__v": 3}}
    assert update == {"$set": {"a": 1}, "$inc": {"n": 1}}
    assert registry.stamp_upsert("orders", {"$set": {"__v": 2}}) == {
        "$set": {"__v": 2}, "$inc": {"__rev": 1}}
    assert registry.stamp_upsert("users", {"$set": {"a": 1}}) == {
        "$set": {"a": 1}, "$setOnInsert": {"sv": 2}}
    for bad, message in (([{"$set": {"a": 1}}], "operator update"),
                         ({"a": 1}, "operator update"),
                         ({"$set": {"__rev": 4}}, "revision field"),
                         ({"$rename": {"x": "__rev"}}, "revision field")):
        with pytest.raises(ConfigInvalidError, match=message):
            registry.stamp_upsert("orders", bad)


def test_occ_binds_the_field_names_and_needs_revisions() -> None:
    registry = v.define_shapes({"o": {"versioning": {"current": 1, "field": "sv",
                                                     "revision_field": "rv"}}})
    bound = registry.occ("o")
    assert (bound.field, bound.revision_field) == ("sv", "rv")
    assert bound.bump_revision({"$set": {"a": 1}}) == {"$set": {"a": 1}, "$inc": {"rv": 1}}
    with pytest.raises(ConfigInvalidError, match="differs from the declared 'rv'"):
        bound.update_with_revision(object(), {"_id": 1}, 0, {}, revision_field="__rev")
    with pytest.raises(ConfigInvalidError, match="revision: false"):
        shapes().occ("users")


# ------------------------------------------------------------------------------ writers


class Refusing:
    """A collection that fails the test if anything is sent."""

    name = "c"

    def __getattr__(self, name: str) -> Any:
        if name in ("update_one", "replace_one", "find_one_and_update", "find_one",
                    "with_options"):
            raise AssertionError(f"{name} called: a refused write must send nothing")
        raise AttributeError(name)


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"filter": [("_id", 1)]}, "filter must be a mapping"),
    ({"filter": {"_id": {"$in": [1, 2]}}}, "_id must be a plain value"),
    ({"filter": {"_id": {"$eq": 1, "$ne": 2}}}, "_id must be a plain value"),
    ({"filter": {"_id": Regex("^a")}}, "not a pattern"),
    ({"filter": {"_id": 1, "__rev": 3}}, "must not constrain the revision"),
    ({"filter": {"_id": 1, "__rev.x": 3}}, "must not constrain the revision"),
    ({"filter": {"_id": 1, "$or": [{"a": 1}, {"$and": [{"__rev": 1}]}]}},
     "must not constrain the revision"),
    ({"filter": {"_id": 1, "$expr": {"$gt": ["$__rev", 1]}}}, "must not constrain the revision"),
    ({"expected": -1}, "expected_revision must be a non-negative integer"),
    ({"expected": 1.0}, "expected_revision must be a non-negative integer"),
    ({"expected": True}, "expected_revision must be a non-negative integer"),
    ({"expected": "1"}, "expected_revision must be a non-negative integer"),
    ({"options": {"upsert": True}}, "upsert is not allowed"),
    ({"options": {"version": -1}}, "version must be a non-negative integer"),
    ({"options": {"verify": "yes"}}, "verify must be a boolean"),
    ({"options": {"field": "$v"}}, "Invalid field"),
    ({"options": {"revision_field": "a.b"}}, "Invalid revision_field"),
    ({"options": {"field": "x", "revision_field": "x"}}, "must differ"),
    ({"update": {"a": 1}}, "use replace_with_revision"),
    ({"update": {"$set": {"a": 1}, "b": 2}}, "mixes operators"),
    ({"update": [{"$replaceWith": {"a": 1}}]}, "replaces the whole document"),
    ({"update": [{"$project": {"a": 1}}]}, "replaces the whole document"),
    ({"update": {"$inc": {"__rev": 1}}}, "writes the revision field"),
    ({"update": [{"$set": {"__rev": 9}}]}, "writes the revision field"),
    ({"update": {"$unset": {"__rev.x": ""}}}, "writes the revision field"),
    ({"update": {"$set": {"__v": 2}}, "options": {"version": 2}}, "writes the version field"),
]


@pytest.mark.parametrize(("case", "message"), REFUSED, ids=[m for _, m in REFUSED])
def test_guarded_updates_refuse_before_sending(case: dict[str, Any], message: str) -> None:
    args = (case.get("filter", {"_id": 1}), case.get("expected", 0),
            case.get("update", {"$set": {"a": 1}}))
    options = case.get("options", {})
    for writer in (v.update_with_revision, v.find_one_and_update_with_revision):
        with pytest.raises(ConfigInvalidError, match=message) as caught:
            writer(Refusing(), *args, **options)
        assert caught.value.exit_code == 6
    with pytest.raises(ConfigInvalidError, match=message):
        asyncio.run(v.aupdate_with_revision(Refusing(), *args, **options))


def test_replace_refuses_operator_documents_and_unacknowledged_collections() -> None:
    for bad in ({"$set": {"a": 1}}, [{"a": 1}], {"a": 1, "$b": 2}):
        with pytest.raises(ConfigInvalidError, match="plain document"):
            v.replace_with_revision(Refusing(), {"_id": 1}, 0, bad)

    class Unacknowledged(Refusing):
        class write_concern:
            acknowledged = False

    with pytest.raises(ConfigInvalidError, match="w: 0"):
        v.replace_with_revision(Unacknowledged(), {"_id": 1}, 0, {"a": 1})


def test_bump_revision_on_operator_updates_and_pipelines() -> None:
    assert v.bump_revision({"$set": {"a": 1}, "$inc": {"n": 2}}) == {
        "$set": {"a": 1}, "$inc": {"n": 2, "__rev": 1}}
    assert v.bump_revision([{"$set": {"a": 1}}], revision_field="rv") == [
        {"$set": {"a": 1}},
        {"$set": {"rv": {"$add": [{"$ifNull": ["$rv", 0]}, 1]}}}]
    for bad, message in (({"a": 1}, "not a replacement"),
                         ({"$set": {"__rev": 1}}, "already writes"),
                         ({"$set": {"a": 1}}, "Invalid revision_field")):
        with pytest.raises(ConfigInvalidError, match=message):
            v.bump_revision(bad, revision_field="$r" if "Invalid" in message else "__rev")


def test_stamped_updates_and_replacements() -> None:
    from migronaut.versioning.guards import prepare_replace, prepare_update

    driver = {"session": None, "hint": "h", "array_filters": []}
    write = prepare_update(None, {"_id": 1}, 0, {"$set": {"a": 1}}, {"version": 2, **driver})
    assert write.filter == {"_id": 1,
                            "__rev": {"$in": [None, 0], "$not": {"$type": "array"}}}
    assert write.document == {"$set": {"a": 1, "__v": 2}, "$inc": {"__rev": 1}}
    assert write.options == driver
    assert write.read_options == {"session": None, "hint": "h"}
    write = prepare_update(None, {"_id": {"$eq": 1}}, 4, [{"$set": {"a": 1}}], {"version": 0})
    assert write.filter == {"_id": {"$eq": 1}, "__rev": {"$eq": 4, "$not": {"$type": "array"}}}
    assert write.document == [
        {"$set": {"a": 1}},
        {"$set": {"__rev": {"$add": [{"$ifNull": ["$__rev", 0]}, 1]}}},
        {"$unset": "__v"}]
    write = prepare_update(None, {"_id": 1}, 1, [], {"version": 3})
    assert write.document == [{"$set": {"__v": {"$literal": 3}, "__rev": {
        "$add": [{"$ifNull": ["$__rev", 0]}, 1]}}}]
    write = prepare_update(None, {"_id": 1}, 1, {"$set": {"a": 1}}, {"version": 0})
    assert write.document == {"$set": {"a": 1}, "$inc": {"__rev": 1}, "$unset": {"__v": ""}}
    write = prepare_replace(None, {"_id": 1}, Int64(7), {"a": 1, "rv": 0, "__v": 1},
                            {"revision_field": "rv"})
    assert write.document == {"a": 1, "rv": 8, "__v": 1} and write.revision == 8
    assert write.filter == {"_id": 1, "rv": {"$eq": 7, "$not": {"$type": "array"}}}
    assert write.options == {}
    write = prepare_replace(None, {"_id": 1}, 0, {"a": 1, "__v": 1}, {"version": 0})
    assert write.document == {"a": 1, "__rev": 1}


# ------------------------------------------------------------------------------ retry


def conflict(reason: str) -> RevisionConflictError:
    return RevisionConflictError("conflict", {"reason": reason, "expected": 0})


def test_retry_on_conflict_retries_conflicts_up_to_attempts() -> None:
    seen: list[int] = []
    waits: list[int] = []

    def flaky(attempt: int) -> str:
        seen.append(attempt)
        if attempt < 3:
            raise conflict("conflict" if attempt == 1 else "unknown")
        return "done"

    def backoff(attempt: int) -> float:
        waits.append(attempt)
        return 0

    assert v.retry_on_conflict(flaky, attempts=3, backoff=backoff) == "done"
    assert seen == [1, 2, 3] and waits == [1, 2]
    seen.clear()
    with pytest.raises(RevisionConflictError):
        v.retry_on_conflict(flaky, attempts=2, backoff=backoff)
    assert seen == [1, 2]


def test_retry_on_conflict_does_not_retry_not_found_or_other_errors() -> None:
    calls: list[int] = []

    def missing(attempt: int) -> None:
        calls.append(attempt)
        raise conflict("not-found")

    with pytest.raises(RevisionConflictError):
        v.retry_on_conflict(missing, attempts=5)
    assert calls == [1]

    def broken(attempt: int) -> None:
        calls.append(attempt)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        v.retry_on_conflict(broken, attempts=5)
    assert calls == [1, 1]


def test_retry_on_conflict_validates_and_stops_on_its_signal() -> None:
    for kwargs, message in (({"attempts": 0}, "attempts"), ({"attempts": 1.5}, "attempts"),
                            ({"backoff": 3}, "backoff")):
        with pytest.raises(ConfigInvalidError, match=message):
            v.retry_on_conflict(lambda attempt: None, **kwargs)
    with pytest.raises(ConfigInvalidError, match="needs a function"):
        v.retry_on_conflict(42)  # type: ignore[arg-type]
    stop = threading.Event()
    stop.set()
    with pytest.raises(migronaut.RunAbortedError):
        v.retry_on_conflict(lambda attempt: 1, signal=stop)

    later = threading.Event()
    threading.Timer(0.05, later.set).start()

    def always(attempt: int) -> None:
        raise conflict("conflict")

    with pytest.raises(migronaut.RunAbortedError):
        v.retry_on_conflict(always, attempts=10, backoff=lambda attempt: 10_000, signal=later)


def test_default_backoff_is_full_jitter_within_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    from migronaut.versioning import writers

    monkeypatch.setattr(writers.random, "random", lambda: 1.0)
    assert writers._delay(conflict("conflict"), 1, 3, None) == 0.02
    assert writers._delay(conflict("conflict"), 9, 10, None) == 1.0


def test_aretry_on_conflict() -> None:
    async def main() -> list[int]:
        seen: list[int] = []

        async def flaky(attempt: int) -> list[int]:
            seen.append(attempt)
            if attempt == 1:
                raise conflict("conflict")
            return seen

        first = await v.aretry_on_conflict(flaky, backoff=lambda attempt: 0)
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.05, stop.set)

        async def always(attempt: int) -> None:
            raise conflict("unknown")

        with pytest.raises(migronaut.RunAbortedError):
            await v.aretry_on_conflict(always, attempts=10, backoff=lambda a: 10_000,
                                       signal=stop)
        return first

    assert asyncio.run(main()) == [1, 2]


# ------------------------------------------------------------------------------ upcaster


def add_tier(doc: dict[str, Any]) -> dict[str, Any]:
    doc["tier"] = "free"
    return doc


def split_name(doc: dict[str, Any]) -> dict[str, Any]:
    first, _, last = doc.pop("name").partition(" ")
    doc["profile"] = {"first": first, "last": last}
    return doc


def test_upcast_runs_each_step_on_a_copy_and_sets_the_version() -> None:
    up = shapes().upcaster("orders", {"1": add_tier, 2: split_name})
    assert (up.current, up.min, up.field) == (3, 1, "__v")
    doc = {"__v": 1, "name": "Ada Lovelace", "tags": [{"t": 1}]}
    out = up.upcast(doc)
    assert out == {"__v": 3, "tier": "free", "profile": {"first": "Ada", "last": "Lovelace"},
                   "tags": [{"t": 1}]}
    assert doc == {"__v": 1, "name": "Ada Lovelace", "tags": [{"t": 1}]}
    assert out["tags"][0] is not doc["tags"][0]
    current = {"__v": 3}
    assert up.upcast(current) is current
    assert up.needs_upcast({"__v": 2}) and not up.needs_upcast(current)


def test_upcast_errors_name_their_reason() -> None:
    up = shapes().upcaster("orders", {"1": add_tier, "2": split_name})
    cases: list[tuple[Any, str, Any]] = [({"__v": 4}, "newer", 4), ({}, "below-min", 0),
                                         ({"__v": "x"}, "invalid", "x"), ([1], "invalid", None)]
    for doc, reason, version in cases:
        with pytest.raises(ShapeVersionError) as caught:
            up.upcast(doc)
        assert caught.value.context["reason"] == reason
        assert caught.value.context.get("version") == version
        assert caught.value.context["collection"] == "orders"
        assert caught.value.exit_code == 30
    keep = v.upcaster(ORDERS, {1: add_tier, 2: split_name}, newer="keep")
    newer = {"__v": 9}
    assert keep.upcast(newer) is newer
    below = v.upcaster(ORDERS["versioning"], {0: add_tier, 1: add_tier, 2: split_name})
    assert below.upcast({"name": "A B"})["__v"] == 3

    async def not_sync(doc: dict[str, Any]) -> dict[str, Any]:
        return doc

    for step, message in ((lambda doc: None, "returned NoneType"),
                          (lambda doc: not_sync(doc), "returned coroutine")):
        bad = v.upcaster(ORDERS, {1: step, 2: split_name})
        with pytest.raises(ShapeVersionError, match=message) as caught:
            bad.upcast({"__v": 1})
        assert caught.value.context["reason"] == "invalid"


def test_upcaster_construction_refusals() -> None:
    async def step_async(doc: dict[str, Any]) -> dict[str, Any]:
        return doc

    for steps, message in (([], "must be a mapping"), ({"01": add_tier}, "not a version"),
                           ({-1: add_tier}, "not a version"), ({True: add_tier}, "not a version"),
                           ({1: add_tier, 2: add_tier, 3: add_tier}, "goes past current"),
                           ({1: "x", 2: add_tier}, "not a function"),
                           ({1: step_async, 2: add_tier}, "is async"),
                           ({1: add_tier}, r"Missing step\(s\) for supported version\(s\) 2")):
        with pytest.raises(ConfigInvalidError, match=message):
            v.upcaster(ORDERS, steps)  # type: ignore[arg-type]
    with pytest.raises(ConfigInvalidError, match="newer must be"):
        v.upcaster(ORDERS, {1: add_tier, 2: add_tier}, newer="drop")  # type: ignore[arg-type]
    with pytest.raises(ConfigInvalidError, match="declares no versioning"):
        v.upcaster(PLANS, {})
    with pytest.raises(ConfigInvalidError, match=r"versioning\.current"):
        v.upcaster({"current": 0}, {})


def test_step_is_a_migrate_function_over_a_forward_range() -> None:
    up = v.upcaster(VersioningSpec(current=3, min=1), {1: add_tier, 2: split_name})
    migrate = up.step(1)
    doc = {"__v": 1, "name": "A B"}
    assert migrate(doc, None) == {"__v": 2, "name": "A B", "tier": "free"}
    assert doc == {"__v": 1, "name": "A B"}
    assert up.step(1, 3)({"__v": 1, "name": "A B"})["profile"] == {"first": "A", "last": "B"}
    for args in ((0,), (2, 4), (2, 2), (3,), (-1,)):
        with pytest.raises(ConfigInvalidError):
            up.step(*args)
