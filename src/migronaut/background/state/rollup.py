"""Rolling a generation's partition counters up into the state's totals, exactly once.

Invariant: every generation is rolled up once (compare-and-set on ``rolledGeneration``), before
any of its partitions is deleted — a pass that closes, a plan superseded by a replan and a
``retry --from-start`` all roll up first; a write intent a stopped lane left behind counts the
documents it names that are now at the target version.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from migronaut.background.state.fields import (
    COUNTERS,
    DOC_ERRORS_KEPT,
    MAX_BAD_IDS,
    state_update,
)

if TYPE_CHECKING:
    from migronaut.background.coordination.handles import EngineHandles

__all__ = ["live_totals", "roll_up"]


def roll_up(
    engine: EngineHandles, state: Mapping[str, Any], *, closing: bool = True,
    counters_only: bool = False, set_fields: Mapping[str, Any] | None = None,
    server_times: Sequence[str] = (),
    partitions: Iterable[Mapping[str, Any]] | None = None,
) -> dict[str, Any] | None:
    """Add the current generation's partition counters into ``totals``, once (CAS on
    ``rolledGeneration``); the state as written, ``None`` when it was rolled up already.

    A write intent left on a partition (its lane stopped between a write and its next
    checkpoint, and no lane will hold the partition again) is counted here: its documents
    found at the target. ``closing`` (a pass closes) also records failed partitions, which
    fail the migration; a superseded plan's do not. ``counters_only`` leaves the failed ids,
    document errors and the ``failed`` counter alone (``retry --from-start`` has just cleared
    them: those documents are tried again and counted again if they fail again).
    ``set_fields`` and ``server_times`` ride along in the same write (a coordinator step's
    driver record), so they land exactly when the roll-up does. ``partitions``: the
    generation's partitions when the caller has just read them (under the coordinator lock).
    """
    name = state["_id"]
    generation = int(state["generation"])
    totals: dict[str, int] = {}
    bad_ids: list[Any] = list(state.get("badIds") or [])
    seen = {repr(i) for i in bad_ids}
    doc_errors: list[Any] = list(state.get("docErrors") or [])
    failed = 0
    last_error: str | None = None
    if partitions is None:
        partitions = engine.store.generation_partitions(name, generation)
    for partition in partitions:
        for key, value in (partition.get("counters") or {}).items():
            if value and not (counters_only and key == "failed"):
                totals[key] = totals.get(key, 0) + int(value)
        if partition.get("reclaims"):
            totals["reclaims"] = totals.get("reclaims", 0) + int(partition["reclaims"])
        landed = _landed_intent(engine, state, partition)
        if landed:
            for key in ("scanned", "migrated"):
                totals[key] = totals.get(key, 0) + landed
        for bad in partition.get("badIds") or []:
            if repr(bad) not in seen:
                seen.add(repr(bad))
                bad_ids.append(bad)
        doc_errors.extend(partition.get("lastDocErrors") or [])
        if partition.get("status") == "failed":
            failed += 1
            last_error = last_error or partition.get("lastError")
    inc = {f"totals.{k}": v for k, v in totals.items() if v}
    fields: dict[str, Any] = {**(set_fields or {}), "rolledGeneration": generation}
    if not counters_only:
        fields.update({"badIds": bad_ids[: MAX_BAD_IDS + 1],
                       "docErrors": doc_errors[-DOC_ERRORS_KEPT:]})
    if failed and closing:
        fields.update({"failedPartitions": failed, "lastError": last_error})
    return engine.store.update_state_returning(
        name, {"rolledGeneration": {"$lt": generation}},
        state_update(fields, server_times, inc=inc))


def _landed_intent(
    engine: EngineHandles, state: Mapping[str, Any], partition: Mapping[str, Any]
) -> int:
    """How many documents a partition's leftover write intent names that are now at the
    target version (written by the lane that stopped; never counted by a checkpoint)."""
    ids = list((partition.get("inflight") or {}).get("ids") or ())
    spec = state.get("spec") or {}
    if not ids or spec.get("mode") == "step" or not spec.get("collection"):
        return 0
    forward = state.get("direction", "forward") == "forward"
    target = int(spec["to"] if forward else spec["from"])
    version = str(spec.get("field") or "__v")
    at: dict[str, Any] = (
        {version: target} if target else {"$or": [{version: None}, {version: 0}]}
    )
    return engine.db[str(spec["collection"])].count_documents(
        {"$and": [{"_id": {"$in": ids}}, at]})


def summed_totals(state: Mapping[str, Any],
                  summary: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """:func:`live_totals` from a :meth:`PartitionStore.summary` of the migration (no read)."""
    totals = {k: int(v) for k, v in (state.get("totals") or {}).items()}
    generation = int(state.get("generation", 0))
    if generation and int(state.get("rolledGeneration", 0)) < generation:
        for key in COUNTERS:
            added = sum(int(row.get(key) or 0) for row in summary
                        if row.get("generation") == generation)
            if added:
                totals[key] = totals.get(key, 0) + added
    return totals


def live_totals(engine: EngineHandles, state: Mapping[str, Any]) -> dict[str, int]:
    """Rolled-up totals plus the counters of the generation not rolled up yet (a read)."""
    totals = {k: int(v) for k, v in (state.get("totals") or {}).items()}
    generation = int(state.get("generation", 0))
    if generation and int(state.get("rolledGeneration", 0)) < generation:
        group: dict[str, Any] = {"_id": None}
        for key in COUNTERS:
            group[key] = {"$sum": {"$ifNull": [f"$counters.{key}", 0]}}
        rows = list(engine.store.partitions.aggregate([
            {"$match": {"background": state["_id"], "generation": generation}},
            {"$group": group},
        ]))
        for key in COUNTERS:
            if rows and rows[0].get(key):
                totals[key] = totals.get(key, 0) + int(rows[0][key])
    return totals
