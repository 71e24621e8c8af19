"""Drift detection by polling (``verify``): old-shape documents after a background migration
completed are found with one indexed probe per migration and reopen it — or are only reported.

Migrations are completed by writing their state documents directly (register, plan, complete), so
these tests need no migration file: ``verify`` works from the pinned spec alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from bson import ObjectId

from helpers.engine import captured_logger
from migronaut.background.engine import BackgroundEngine
from migronaut.background.planning.spec import resolve_background
from migronaut.background.state.store import BackgroundStore
from migronaut.background.tools import drift
from migronaut.errors import ConfigInvalidError

if TYPE_CHECKING:
    from pymongo.database import Database

V1_TO_V2 = "20250101000000_v1_to_v2.py"
V2_TO_V3 = "20250102000000_v2_to_v3.py"
STATES = "_migronaut_background"


def _migrate(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return doc


@dataclass
class Harness:
    engine: BackgroundEngine
    db: Database[dict[str, Any]]
    logs: Any
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def of(self, name: str) -> list[dict[str, Any]]:
        return [payload for event, payload in self.events if event == name]

    def state(self, name: str) -> dict[str, Any]:
        state = self.engine.store.get(name)
        assert state is not None
        return state

    def complete(self, name: str, *, collection: str = "items", start: int = 1, end: int = 2,
                 **declared: Any) -> dict[str, Any]:
        """Register ``name`` and move it to ``completed`` (no file, no lanes)."""
        register(self.engine, name, collection=collection, start=start, end=end, **declared)
        assert self.engine.store.move(name, "plan") is not None
        completed = self.engine.store.move(name, "complete", server_times=["completedAt"])
        assert completed is not None and completed["status"] == "completed"
        return completed


def register(engine: BackgroundEngine, name: str, *, collection: str = "items", start: int = 1,
             end: int = 2, status: str = "pending", direction: str = "forward",
             **declared: Any) -> None:
    spec = resolve_background(name, {"collection": collection, "from": start, "to": end,
                                     "migrate": _migrate, **declared}).spec
    engine.store.register(name, status=status, direction=direction, mode="declarative",
                          collection=collection, spec=spec, checksum="c" * 64)


@pytest.fixture
def harness(db: Database[dict[str, Any]], tmp_path: Path) -> Iterator[Harness]:
    with captured_logger() as (logger, handler):
        events: list[tuple[str, dict[str, Any]]] = []
        engine = BackgroundEngine(
            db=db, store=BackgroundStore(db), directory=tmp_path / "migrations",
            lock_collection=db["_migronaut_locks"], lock_ttl_ms=30_000, logger=logger,
            emit=lambda event, payload: events.append((event, dict(payload))),
        )
        yield Harness(engine, db, handler, events)


def version_index(db: Database[dict[str, Any]], collection: str = "items",
                  version_field: str = "__v") -> None:
    db[collection].create_index([(version_field, 1), ("_id", 1)])


def assert_no_ids(harness: Harness, result: Any, *ids: Any) -> None:
    """No document id in the result, the events or the log lines (I15)."""
    texts = [json.dumps(result, default=str)]
    texts += [json.dumps(payload, default=str) for _, payload in harness.events]
    texts += harness.logs.messages
    for text in texts:
        for doc_id in ids:
            assert str(doc_id) not in text
    for payload in harness.of("background:drift"):
        assert set(payload) == {"migration", "collection", "source", "action"}


# ------------------------------------------------------------------------------------ findings


def test_no_old_shape_documents_is_one_probe_and_no_drift(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    version_index(harness.db)
    harness.db["items"].insert_many([{"_id": i, "__v": 2, "__rev": 1} for i in range(5)])

    assert harness.engine.verify() == {"checked": 1, "skipped": 0, "drift": []}
    assert harness.of("background:drift") == []
    assert harness.state(V1_TO_V2)["status"] == "completed"


def test_an_old_shape_document_reopens_the_migration(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    version_index(harness.db)
    late = ObjectId()
    harness.db["items"].insert_many([{"_id": 1, "__v": 2, "__rev": 1},
                                     {"_id": late, "__v": 1, "name": "late writer"}])

    result = harness.engine.verify()

    assert result == {"checked": 1, "skipped": 0, "drift": [
        {"migration": V1_TO_V2, "collection": "items", "action": "reopened"}]}
    state = harness.state(V1_TO_V2)
    assert state["status"] == "running"
    assert state["phase"] == "partition"
    assert state["reopened"] == 1
    assert state["history"][-1]["reason"] == "old-shape documents reappeared"
    assert harness.of("background:drift") == [
        {"migration": V1_TO_V2, "collection": "items", "source": "poll", "action": "reopened"}]
    assert [(c["action"], c["from"], c["to"]) for c in harness.of("background:control")] == [
        ("retry", "completed", "running")]
    assert harness.logs.has("⚠ items: old-shape documents after " + V1_TO_V2 + " — reopened")
    assert_no_ids(harness, result, late)


def test_report_only_changes_nothing(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    version_index(harness.db)
    harness.db["items"].insert_one({"_id": "customer-4711", "__v": 1})
    before = harness.state(V1_TO_V2)

    result = harness.engine.verify(on_drift="report")

    assert result["drift"] == [{"migration": V1_TO_V2, "collection": "items",
                                "action": "reported"}]
    after = harness.state(V1_TO_V2)
    assert after["status"] == "completed"
    assert after["history"] == before["history"]
    assert harness.of("background:drift")[0]["action"] == "reported"
    assert harness.of("background:control") == []
    assert_no_ids(harness, result, "customer-4711")


def test_reopen_keeps_totals_and_failed_ids(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    harness.engine.store.update_state(V1_TO_V2, {}, {"totals": {"migrated": 40}, "pass": 1,
                                                     "generation": 1, "rolledGeneration": 1})
    version_index(harness.db)
    harness.db["items"].insert_one({"_id": 7, "__v": 1})

    harness.engine.verify()

    state = harness.state(V1_TO_V2)
    assert state["status"] == "running"
    assert state["totals"] == {"migrated": 40}  # a reopen is a new pass, not a reset
    assert state["pass"] == 1 and state["generation"] == 1


def test_known_failed_documents_are_not_drift(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    harness.engine.store.update_state(V1_TO_V2, {}, {"badIds": [7]})
    version_index(harness.db)
    harness.db["items"].insert_one({"_id": 7, "__v": 1})

    assert harness.engine.verify() == {"checked": 1, "skipped": 0, "drift": []}


def test_the_migration_filter_decides_what_is_old(harness: Harness) -> None:
    harness.complete(V1_TO_V2, filter={"kind": "order"})
    version_index(harness.db)
    harness.db["items"].insert_one({"_id": 1, "__v": 1, "kind": "invoice"})

    assert harness.engine.verify()["drift"] == []

    harness.db["items"].insert_one({"_id": 2, "__v": 1, "kind": "order"})
    assert len(harness.engine.verify(on_drift="report")["drift"]) == 1


def test_version_zero_means_no_version_field(harness: Harness) -> None:
    harness.complete(V1_TO_V2, start=0, end=1)
    version_index(harness.db)
    harness.db["items"].insert_many([{"_id": 1, "__v": 1}, {"_id": 2, "name": "unversioned"}])

    result = harness.engine.verify(on_drift="report")

    assert result["drift"] == [{"migration": V1_TO_V2, "collection": "items",
                                "action": "reported"}]


def test_a_custom_version_field_is_probed(harness: Harness) -> None:
    harness.complete(V1_TO_V2, version_field="schemaVersion")
    version_index(harness.db, version_field="schemaVersion")
    harness.db["items"].insert_one({"_id": 1, "schemaVersion": 1})

    assert harness.engine.verify(on_drift="report")["drift"][0]["action"] == "reported"


# ------------------------------------------------------------------------------------ chains


def test_a_chain_reports_the_late_document_for_its_own_edge_only(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    harness.complete(V2_TO_V3, start=2, end=3)
    version_index(harness.db)
    harness.db["items"].insert_many([{"_id": 1, "__v": 3}, {"_id": 2, "__v": 1}])

    result = harness.engine.verify(on_drift="report")

    assert result == {"checked": 2, "skipped": 0, "drift": [
        {"migration": V1_TO_V2, "collection": "items", "action": "reported"}]}


def test_a_reopened_edge_owns_its_collection_for_the_rest_of_the_run(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    harness.complete(V2_TO_V3, start=2, end=3)
    version_index(harness.db)
    harness.db["items"].insert_many([{"_id": 1, "__v": 1}, {"_id": 2, "__v": 2}])

    result = harness.engine.verify()

    # v1→v2 reopens; v2→v3 waits for it (its documents are still arriving), converging step by step
    assert result == {"checked": 1, "skipped": 1, "drift": [
        {"migration": V1_TO_V2, "collection": "items", "action": "reopened"}]}
    assert harness.state(V2_TO_V3)["status"] == "completed"


# ------------------------------------------------------------------------------------ skips


def test_another_open_migration_on_the_collection_skips_the_probe(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    register(harness.engine, V2_TO_V3, start=2, end=3)  # pending on the same collection
    version_index(harness.db)
    harness.db["items"].insert_one({"_id": 1, "__v": 1})

    assert harness.engine.verify() == {"checked": 0, "skipped": 1, "drift": []}
    assert harness.state(V1_TO_V2)["status"] == "completed"


@pytest.mark.parametrize("status_move", ["pause", "fail"])
def test_paused_counts_as_open_and_failed_does_not(harness: Harness, status_move: str) -> None:
    harness.complete(V1_TO_V2)
    register(harness.engine, V2_TO_V3, start=2, end=3)
    assert harness.engine.store.move(V2_TO_V3, status_move) is not None
    version_index(harness.db)
    harness.db["items"].insert_one({"_id": 1, "__v": 1})

    result = harness.engine.verify(on_drift="report")

    if status_move == "pause":
        assert (result["checked"], result["skipped"]) == (0, 1)
    else:
        assert (result["checked"], result["skipped"]) == (1, 0)
        assert len(result["drift"]) == 1


def test_no_usable_index_skips_with_one_warning(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    harness.db["items"].insert_one({"_id": 1, "__v": 1})
    harness.db["items"].create_index([("__v", 1)], sparse=True, name="sparse_v")
    harness.db["items"].create_index([("name", 1), ("__v", 1)])

    assert harness.engine.verify() == {"checked": 0, "skipped": 1, "drift": []}
    assert harness.engine.verify() == {"checked": 0, "skipped": 1, "drift": []}
    warnings = [m for m in harness.logs.messages if "no index led by {__v: 1}" in m]
    assert len(warnings) == 1
    assert harness.state(V1_TO_V2)["status"] == "completed"


def test_any_index_led_by_the_version_field_is_usable(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    harness.db["items"].create_index([("__v", 1), ("tenant", 1)])
    harness.db["items"].insert_one({"_id": 1, "__v": 1, "tenant": "t"})

    result = harness.engine.verify(on_drift="report")

    assert (result["checked"], result["skipped"], len(result["drift"])) == (1, 0, 1)


def test_collections_limits_the_candidates(harness: Harness) -> None:
    harness.complete(V1_TO_V2, collection="orders")
    harness.complete(V2_TO_V3, collection="invoices", start=2, end=3)
    for name, version in (("orders", 1), ("invoices", 2)):
        version_index(harness.db, name)
        harness.db[name].insert_one({"_id": 1, "__v": version})

    result = harness.engine.verify(on_drift="report", collections=["invoices"])

    assert result == {"checked": 1, "skipped": 0, "drift": [
        {"migration": V2_TO_V3, "collection": "invoices", "action": "reported"}]}


def test_only_completed_forward_declarative_migrations_are_candidates(harness: Harness) -> None:
    register(harness.engine, V1_TO_V2, collection="failed_one")
    harness.engine.store.move(V1_TO_V2, "fail")
    register(harness.engine, V2_TO_V3, collection="reverted", start=2, end=3, revert=_migrate,
             direction="revert")
    harness.engine.store.move(V2_TO_V3, "plan")
    harness.engine.store.move(V2_TO_V3, "complete")
    step = "20250103000000_step.py"
    step_spec = resolve_background(step, {"step": _migrate}).spec
    harness.engine.store.register(step, status="pending", direction="forward", mode="step",
                                  collection=None, spec=step_spec, checksum="c" * 64)
    harness.engine.store.move(step, "plan")
    harness.engine.store.move(step, "complete")
    for name in ("failed_one", "reverted"):
        version_index(harness.db, name)
        harness.db[name].insert_one({"_id": 1, "__v": 1})

    assert harness.engine.verify() == {"checked": 0, "skipped": 0, "drift": []}


def _watch_row(db: Database[dict[str, Any]], state: str, age_ms: int) -> None:
    db[STATES + "_watch"].update_one(
        {"_id": "items"},
        [{"$set": {"state": state, "updatedAt": {"$subtract": ["$$NOW", age_ms]}}}],
        upsert=True,
    )


@pytest.mark.parametrize(
    ("mode", "state", "age_ms", "skipped"),
    [
        ("stream", "streaming", 0, True),
        ("stream", "streaming", 120_000, False),  # the watcher's record is stale: poll
        ("stream", "fallback", 0, False),
        ("both", "streaming", 0, False),
        ("poll", "streaming", 0, False),
    ],
)
def test_stream_mode_leaves_a_live_watcher_its_collection(
    harness: Harness, mode: str, state: str, age_ms: int, skipped: bool
) -> None:
    harness.complete(V1_TO_V2)
    version_index(harness.db)
    harness.db["items"].insert_one({"_id": 1, "__v": 1})
    _watch_row(harness.db, state, age_ms)

    result = harness.engine.verify(on_drift="report", drift_mode=mode)

    assert (result["skipped"], result["checked"]) == ((1, 0) if skipped else (0, 1))


def test_a_declared_version_floor_at_or_above_to_skips(harness: Harness) -> None:
    harness.complete(V1_TO_V2)
    version_index(harness.db)
    harness.db["items"].insert_one({"_id": 1, "__v": 1})

    assert drift.verify(harness.engine, floors={"items": 2}) == {
        "checked": 0, "skipped": 1, "drift": []}
    assert drift.verify(harness.engine, on_drift="report", floors={"items": 1})["checked"] == 1


def test_a_probe_error_is_warned_and_skipped(harness: Harness) -> None:
    register(harness.engine, V1_TO_V2)
    harness.engine.store.states.update_one({"_id": V1_TO_V2}, {"$set": {
        "collection": "bad$name", "spec.collection": "bad$name"}})
    harness.engine.store.move(V1_TO_V2, "plan")
    harness.engine.store.move(V1_TO_V2, "complete")

    assert harness.engine.verify() == {"checked": 0, "skipped": 1, "drift": []}
    assert harness.logs.has("⚠ bad$name: drift probe skipped")


# ------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"on_drift": "fix"}, "on_drift must be 'reopen' or 'report'"),
        ({"collections": "items"}, "collections must be a list of collection names"),
        ({"collections": []}, "collections must not be empty"),
        ({"collections": ["items", ""]}, "collections must hold non-empty strings"),
        ({"drift_mode": "sometimes"}, "background_drift must be 'poll', 'stream' or 'both'"),
    ],
)
def test_bad_arguments_are_refused_before_any_probe(
    harness: Harness, kwargs: dict[str, Any], fragment: str
) -> None:
    harness.complete(V1_TO_V2)
    version_index(harness.db)
    harness.db["items"].insert_one({"_id": 1, "__v": 1})

    with pytest.raises(ConfigInvalidError) as caught:
        harness.engine.verify(**kwargs)

    assert fragment in caught.value.message
    assert caught.value.code == "CONFIG_INVALID" and caught.value.exit_code == 6
    assert harness.state(V1_TO_V2)["status"] == "completed"
    assert harness.events == []


# ------------------------------------------------------------------------------------ pure parts


@pytest.mark.parametrize(
    ("indexes", "expected"),
    [
        ({"_id_": {"key": [("_id", 1)]}}, None),
        ({"v": {"key": [("__v", 1), ("_id", 1)]}, "w": {"key": [("__v", 1)]}}, "v"),
        ({"w": {"key": [("__v", 1.0)]}}, "w"),
        ({"b": {"key": [("__v", 1), ("x", 1)]}, "a": {"key": [("__v", 1), ("y", 1)]}}, "a"),
        ({"d": {"key": [("__v", -1), ("_id", 1)]}}, None),
        ({"p": {"key": [("__v", 1), ("_id", 1)], "partialFilterExpression": {"x": 1}}}, None),
        ({"s": {"key": [("__v", 1)], "sparse": True}}, None),
        ({"t": {"key": [("other", 1), ("__v", 1)]}}, None),
    ],
)
def test_probe_hint(indexes: dict[str, Any], expected: str | None) -> None:
    assert drift.probe_hint(indexes, "__v") == expected


def test_state_match_excludes_failed_ids() -> None:
    spec = resolve_background(V1_TO_V2, {"collection": "items", "from": 1, "to": 2,
                                         "migrate": _migrate, "filter": {"kind": "a"}}).spec
    assert drift.state_match({"spec": spec}) == {"kind": "a", "__v": 1}
    assert drift.state_match({"spec": spec, "badIds": [3]}) == {
        "$and": [{"kind": "a", "__v": 1}, {"_id": {"$nin": [3]}}]}
