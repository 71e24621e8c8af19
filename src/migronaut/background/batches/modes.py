"""Which batch unit serves a migration: its mode, and for a declarative one, its transaction."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from migronaut.background.batches.checkpoints import Checkpoints
from migronaut.background.batches.documents import Documents
from migronaut.background.batches.plain import PlainBatches
from migronaut.background.batches.reading import BatchReader
from migronaut.background.batches.step import StepBatches
from migronaut.background.batches.transactional import TransactionalBatches
from migronaut.background.batches.unit import BatchUnit
from migronaut.background.batches.updates import GuardedUpdates
from migronaut.background.lanes.turn import LaneState

__all__ = ["unit_for"]


def unit_for(lane: LaneState, checkpoints: Checkpoints, plan: Mapping[str, Any]) -> BatchUnit:
    """The batch unit of the migration's mode (declarative plain or transactional, or step).

    A declarative unit resolves the spec now (``MIGRATION_EXECUTION_FAILED`` without a transform
    for the direction) and looks the version index up once per process.
    """
    if lane.mode == "step":
        return StepBatches(lane, checkpoints)
    documents = Documents(lane, str(plan.get("partitioner") or "id"), plan.get("sharding") or {})
    reader, updates = BatchReader(lane, documents), GuardedUpdates(lane, documents)
    unit = PlainBatches if lane.transaction is None else TransactionalBatches
    return unit(lane, checkpoints, documents, reader, updates)
