"""The one interface the lane skeleton calls for a batch, and the shapes it passes.

:class:`BatchUnit` is implemented once per batch mode — :mod:`.plain`, :mod:`.transactional`,
:mod:`.step`. The skeleton (:mod:`migronaut.background.lanes.slices`) calls :meth:`BatchUnit.run`
once per batch with the :class:`Hold` it keeps on a partition; the unit reads, transforms, writes
and checkpoints that batch and returns a :class:`Batch`. Counters only ever enter totals through a
checkpoint (:mod:`.checkpoints`): what a unit could not record yet it carries
(:meth:`BatchUnit.take_carried`) to the next checkpoint or to the slice's failure record.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from migronaut.background.batches.failures import DocError

if TYPE_CHECKING:
    from migronaut.background.lanes.lease_keeper import LeaseKeeper
    from migronaut.background.lanes.throttle import AdaptiveController
    from migronaut.background.lanes.turn import LaneState
    from migronaut.background.state.store import Lease

__all__ = ["Batch", "BatchUnit", "Hold", "Part", "add_counters", "nonzero"]


@dataclass
class Part:
    """The partition a lane holds, as the lane tracks it between checkpoints."""

    id: Any
    key: str
    generation: int
    scope: Mapping[str, Any]
    cursor: dict[str, Any]
    #: counters and document errors of written batches not yet checkpointed (plain mode)
    pending: dict[str, int] = field(default_factory=dict)
    pending_errors: list[DocError] = field(default_factory=list)
    #: the partition document holds this lane's intent (the ids of a batch about to be written)
    intent: bool = False

    @property
    def unflushed(self) -> bool:
        return bool(self.pending or self.pending_errors or self.intent)


@dataclass
class Hold:
    """What a lane keeps while it works one partition: the lease, the partition, the keeper
    renewing the lease (touched after each checkpoint) and the adaptive controller, if any."""

    lease: Lease
    part: Part
    keeper: LeaseKeeper
    controller: AdaptiveController | None


@dataclass
class Batch:
    """What one batch did: its checkpointed counters, its server time, whether the partition is
    done, its document errors and — when they took the migration over ``maxDocumentErrors`` —
    the distinct failed documents so far."""

    counters: dict[str, int]
    latency_ms: float
    batch_size: int
    done: bool
    errors: list[DocError] = field(default_factory=list)
    over_budget: int | None = None


class BatchUnit(ABC):
    """One batch mode of a lane: owns how a batch is read, written and checkpointed."""

    def __init__(self, lane: LaneState) -> None:
        self.lane = lane
        #: counters of work that no checkpoint recorded yet and that must be recorded once
        #: (transaction retries of a batch that never committed)
        self.carried: dict[str, int] = {}

    @abstractmethod
    def run(self, hold: Hold, size: int) -> Batch:
        """Work one batch of up to ``size`` documents (or one step) and checkpoint it."""

    def settle_intent(self, hold: Hold, ids: list[Any]) -> dict[str, int]:
        """Settle a write intent left on the held partition (the ``ids`` of a batch whose write
        may or may not have landed): the counters to record for it, once. Nothing when this
        mode does not write by intent."""
        return {}

    def carry_retries(self, count: int) -> None:
        """Keep ``count`` transaction retries for the next checkpoint or failure record."""
        self.carried["txnRetries"] = self.carried.get("txnRetries", 0) + count

    def take_carried(self) -> dict[str, int]:
        carried, self.carried = self.carried, {}
        return carried


def add_counters(total: dict[str, int], counters: Mapping[str, int]) -> None:
    for key, value in counters.items():
        if value:
            total[key] = total.get(key, 0) + value


def nonzero(counters: Mapping[str, int]) -> dict[str, int]:
    return {k: v for k, v in counters.items() if v}
